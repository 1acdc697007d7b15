"""Prompt grids: every valid ``a op b =`` prompt of a measurement, tokenized once.

For each operator the operands range over [lo, hi); a cell is kept only if it is
valid (catalog.core.arith) for the tokenizer's single-token limit. All prompts of all
operators live in one flat table (operator-major, then a, then b), which is the
row order of every activation array in the catalog. Prompts of equal token
length form buckets, so forward passes never need padding: with single-token
numbers there is one length, with digit-level tokenizers a few.

Every prompt of an operator starts with the same prefix: BOS where the model uses one,
the config's fixed ``few_shot`` text, then ``shots`` solved examples of that operator
(``{template}{result}`` and ``shot_separator`` each, drawn from the grid's own valid
cells with the seed). The prefix and the prompt are tokenized separately and
concatenated, so the prefix's tokens are the same in every prompt and its keys and
values can be computed once (``catalog.measuring.grids.run_grid``). A cell that is one of the
examples is still measured, but it is left out of counterfactual pairs, faithfulness and
knockouts: its answer is in the context.
"""

from __future__ import annotations

import hashlib
import string
from dataclasses import dataclass, field, replace

import numpy as np

from catalog.config import ScienceConfig
from catalog.config.vocab import OP_WORDS, ROLES
from catalog.core.arith import apply_op, is_valid
from catalog.core.tokens import NumberTokens, encode_number

# Digit-level tokenizers have no single-token limit on results.
UNLIMITED = 10**12
# ROLES (config): positions of a prompt that component effects patch. With single-token
# numbers and the bare template they are the paper's positions 1-4 (op1, operator, op2, =).


@dataclass
class PromptTable:
    """All valid prompts of one measurement, flat over operators.

    Arrays have one entry per prompt: ``op`` (index into ``operators``), ``a``, ``b``,
    ``result``, ``answer`` (id of the result's first token) and ``tokens`` (the prompt's
    token ids, BOS included where the model uses one). ``result_tokens`` holds the
    full tokenization of each result, used to judge multi-token answers.
    """

    operators: tuple[str, ...]
    lo: int
    hi: int
    numbers: NumberTokens
    op: np.ndarray
    a: np.ndarray
    b: np.ndarray
    result: np.ndarray
    answer: np.ndarray
    tokens: list[np.ndarray]
    result_tokens: list[np.ndarray]
    prefix_tokens: list[np.ndarray] = field(default_factory=list)  # per operator, BOS included
    is_shot: np.ndarray | None = None  # (n,) bool: the cell is a solved example of the prefix
    correct: np.ndarray | None = None  # set by catalog.measuring.grids.run_grid
    # (n, len(ROLES)) int64: each role's position in the prompt's tokens (prefix included)
    role_pos: np.ndarray | None = None
    _buckets: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.is_shot is None:
            self.is_shot = np.zeros(len(self.a), dtype=bool)
        if not self.prefix_tokens:
            self.prefix_tokens = [np.zeros(0, dtype=np.int64) for _ in self.operators]

    def __len__(self) -> int:
        return len(self.a)

    def prefix_len(self, i: int) -> int:
        """Tokens of prompt ``i`` that are its operator's shared prefix."""
        return len(self.prefix_tokens[int(self.op[i])])

    def usable(self) -> np.ndarray:
        """(n,) bool: correct prompts that are not solved examples of the prefix."""
        if self.correct is None:
            raise ValueError("prompt correctness is unknown; run "
                             "catalog.measuring.grids.run_grid first")
        assert self.is_shot is not None
        return self.correct & ~self.is_shot

    @property
    def side(self) -> int:
        """Number of operand values per axis (hi - lo)."""
        return self.hi - self.lo

    def op_index(self, op: str) -> np.ndarray:
        """Indices (into the table) of the valid prompts of operator ``op``."""
        return np.nonzero(self.op == self.operators.index(op))[0]

    def cell_index(self, idx: np.ndarray) -> np.ndarray:
        """Flat position of prompts ``idx`` in their operator's side x side grid."""
        return (self.a[idx] - self.lo) * self.side + (self.b[idx] - self.lo)

    def buckets(self) -> dict[int, np.ndarray]:
        """Prompt length -> indices of the prompts with that many tokens."""
        if not self._buckets:
            lengths = np.array([len(t) for t in self.tokens])
            self._buckets = {int(n): np.nonzero(lengths == n)[0] for n in np.unique(lengths)}
        return self._buckets

    def token_matrix(self, idx: np.ndarray) -> np.ndarray:
        """Token ids of prompts ``idx`` (all of one length) as an (n, length) int64 array."""
        return np.stack([self.tokens[i] for i in idx]).astype(np.int64)

    def to_grid(self, values: np.ndarray, op: str) -> np.ndarray:
        """Scatter per-prompt values of ``op``'s prompts into a (..., side, side) grid.

        ``values`` has the prompts of ``op`` on its last axis (table order); invalid
        cells are NaN.
        """
        idx = self.op_index(op)
        out = np.full(values.shape[:-1] + (self.side * self.side,), np.nan, dtype=np.float32)
        out[..., self.cell_index(idx)] = values
        return out.reshape(values.shape[:-1] + (self.side, self.side))


def build_prompts(tokenizer, numbers: NumberTokens, config: ScienceConfig) -> PromptTable:
    """Tokenize every valid prompt of ``config`` for this tokenizer.

    Raises ValueError if the operand range needs numbers the tokenizer cannot write
    as single tokens (not for digit-level tokenizers) or no cell is valid.
    """
    config.check_tokens(numbers)
    limit = UNLIMITED if numbers.digit_level else numbers.limit
    side = np.arange(config.operand_lo, config.operand_hi)
    grid_a, grid_b = np.meshgrid(side, side, indexing="ij")
    ga, gb = grid_a.ravel(), grid_b.ravel()
    ops, aa, bb = [], [], []
    for i, op in enumerate(config.operators):
        ok = is_valid(op, ga, gb, limit)
        ops.append(np.full(int(ok.sum()), i, dtype=np.int8))
        aa.append(ga[ok])
        bb.append(gb[ok])
    op_arr, a, b = np.concatenate(ops), np.concatenate(aa), np.concatenate(bb)
    if len(a) == 0:
        raise ValueError(f"no valid prompt in operand range [{config.operand_lo}, "
                         f"{config.operand_hi}) for operators {config.operators}")
    result = np.empty_like(a)
    for i, op in enumerate(config.operators):
        m = op_arr == i
        result[m] = apply_op(op, a[m], b[m])

    is_shot = np.zeros(len(a), dtype=bool)
    prefix_tokens = []
    for i, op in enumerate(config.operators):
        rows = np.nonzero(op_arr == i)[0]
        prefix, chosen = operator_prefix(tokenizer, numbers, config, i, op, a[rows], b[rows],
                                         result[rows])
        is_shot[rows[chosen]] = True
        prefix_tokens.append(prefix)
    ids, roles = tokenize_prompts(tokenizer, config,
                                  [config.operators[o] for o in op_arr], a, b)
    tokens = [np.concatenate([prefix_tokens[o], np.array(t, dtype=np.int64)])
              for o, t in zip(op_arr, ids, strict=True)]
    roles += np.array([len(prefix_tokens[o]) for o in op_arr], dtype=np.int64)[:, None]

    uniq = np.unique(result)
    res_tok = {int(r): np.array(encode_number(tokenizer, int(r)), dtype=np.int64) for r in uniq}
    result_tokens = [res_tok[int(r)] for r in result]
    answer = np.array([t[0] for t in result_tokens], dtype=np.int64)
    return PromptTable(
        operators=tuple(config.operators),
        lo=config.operand_lo,
        hi=config.operand_hi,
        numbers=numbers,
        op=op_arr,
        a=a,
        b=b,
        result=result,
        answer=answer,
        tokens=tokens,
        result_tokens=result_tokens,
        prefix_tokens=prefix_tokens,
        is_shot=is_shot,
        role_pos=roles,
    )


# the table this process built last and what it was built from (``prompts_for``)
_LAST: list = []


def tokenizer_key(tokenizer) -> str | None:
    """A digest of what a fast tokenizer's encodings depend on: its backend's whole
    serialization (vocabulary, merges, normalizer, pre-tokenizer, added tokens,
    truncation and padding), its class and the Python-side switches read when it
    encodes; None for a tokenizer without a serializable backend (never kept)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    try:
        text = backend.to_str() if backend is not None else None
    except Exception:  # noqa: BLE001 (a backend that cannot say what it is is not kept)
        return None
    if not isinstance(text, str):
        return None
    side = (type(tokenizer).__module__, type(tokenizer).__qualname__,
            *(repr(getattr(tokenizer, k, None)) for k in (
                "split_special_tokens", "add_bos_token", "add_eos_token", "add_prefix_space",
                "clean_up_tokenization_spaces")))
    return hashlib.sha256("\0".join([text, *side]).encode()).hexdigest()


def prompts_for(tokenizer, numbers: NumberTokens, config: ScienceConfig) -> PromptTable:
    """``build_prompts``, kept for the next call with the same tokenizer (``tokenizer_key``),
    numbers and config: a run's checkpoints share their tokenizer, and the paper's grid
    (230,634 prompts of + - * / on [0, 300)) took 15 s to tokenize on this project's
    CPUs, every checkpoint. Each call gets a table of its own whose correctness is not
    yet known (``run_grid`` sets it); the arrays are shared and never written."""
    key = tokenizer_key(tokenizer)
    stamp = (key, numbers, config)
    if key is None or not _LAST or _LAST[0] != stamp:
        table = build_prompts(tokenizer, numbers, config)
        if key is None:
            return table
        _LAST[:] = [stamp, table]
    return replace(_LAST[1], correct=None)


def operator_prefix(tokenizer, numbers: NumberTokens, config: ScienceConfig, position: int,
                    op: str, a: np.ndarray, b: np.ndarray, result: np.ndarray,
                    ) -> tuple[np.ndarray, np.ndarray]:
    """The shared prefix of operator ``op`` (BOS where the model uses one, ``few_shot``,
    then ``shots`` solved examples drawn with the seed from the cells ``a, b, result``, its
    valid cells) and the indices of the cells drawn. ``position`` is the operator's place in
    the operators measured, which seeds the draw."""
    text = config.few_shot
    chosen = np.zeros(0, dtype=np.int64)
    if config.shots:
        rng = np.random.default_rng([config.seed, 11, position])
        chosen = rng.choice(len(a), size=min(config.shots, len(a)), replace=False)
        text += "".join(config.prompt_text(int(a[j]), op, int(b[j])) + str(int(result[j]))
                        + config.shot_separator for j in chosen)
    bos = [numbers.bos_id] if numbers.bos_id is not None else []
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
    return np.array(bos + list(ids), dtype=np.int64), chosen


def _spans(template: str, a: int, op: str, b: int, parsed: list | None = None
           ) -> tuple[str, dict[str, tuple[int, int]]]:
    """The template written out, and the character span of the last {a}, operator
    ({op} or {op_word}) and {b} in it (``parsed``: the template's
    ``string.Formatter().parse``, where the caller took it once)."""
    text, spans = "", {}
    values = {"a": str(a), "b": str(b), "op": op, "op_word": OP_WORDS[op]}
    if parsed is None:
        parsed = list(string.Formatter().parse(template))
    for literal, name, _, _ in parsed:
        text += literal
        if name is None:
            continue
        spans["op" if name == "op_word" else name] = (len(text), len(text) + len(values[name]))
        text += values[name]
    return text, spans


def tokenize_prompts(tokenizer, config: ScienceConfig, ops: list[str], a: np.ndarray,
                     b: np.ndarray) -> tuple[list[list[int]], np.ndarray]:
    """Token ids of the prompts (a, op, b) without prefix, and the position of each of
    ``ROLES`` in them ((n, 4) int64): the token holding an operand's or the operator's last
    character, and the last token. Read from the tokenizer's character offsets; a
    tokenizer without them is asked for each prefix of the text instead."""
    parsed = list(string.Formatter().parse(template := config.template))
    written = [_spans(template, int(x), op, int(y), parsed)
               for op, x, y in zip(ops, a, b, strict=True)]
    texts = [t for t, _ in written]
    try:
        enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
        offsets = enc["offset_mapping"]
    except (NotImplementedError, TypeError, ValueError):
        enc, offsets = tokenizer(texts, add_special_tokens=False), None
    ids = enc["input_ids"]
    n_tok = np.array([len(x) for x in ids], dtype=np.int64)
    if len(n_tok) and n_tok.min() == 0:
        raise ValueError(f"the tokenizer wrote prompt {texts[int(np.argmin(n_tok))]!r} as no "
                         f"tokens")
    roles = np.zeros((len(texts), len(ROLES)), dtype=np.int64)
    roles[:, -1] = n_tok - 1
    if not len(texts):
        return ids, roles
    if offsets is not None:
        # each role's token: the last whose first character is before the role's end (the
        # first token where none is), over every prompt's tokens at once
        first = np.concatenate([[0], np.cumsum(n_tok)[:-1]])
        pos = np.arange(int(n_tok.sum())) - np.repeat(first, n_tok)
        owner = np.repeat(np.arange(len(texts)), n_tok)
        starts = np.fromiter((s for off in offsets for s, _ in off), dtype=np.int64,
                             count=int(n_tok.sum()))
    for j, name in enumerate(("a", "op", "b")):
        end = np.array([spans[name][1] for _, spans in written], dtype=np.int64)
        if offsets is not None:
            roles[:, j] = np.maximum.reduceat(np.where(starts < end[owner], pos, 0), first)
        else:
            for i, (text, _) in enumerate(written):
                part = tokenizer(text[:end[i]], add_special_tokens=False)["input_ids"]
                roles[i, j] = min(len(part), n_tok[i]) - 1
    return ids, roles


def sample_pairs(
    table: PromptTable, op: str, n_pairs: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Counterfactual pairs for ``op``: (clean, counterfactual) prompt indices.

    Clean prompts are drawn without replacement from the correct prompts of ``op``;
    each counterfactual is drawn from the correct prompts of ALL operators of the
    table whose answer token differs (docs/method.md section 5). Solved examples of the
    prefix are left out. Seeded and deterministic. Returns fewer pairs when fewer
    correct prompts exist.
    """
    op_i = table.operators.index(op)
    rng = np.random.default_rng([seed, op_i])
    pool = np.nonzero(table.usable())[0]
    clean_pool = pool[table.op[pool] == op_i]
    if len(clean_pool) == 0 or len(pool) < 2:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    clean = np.sort(rng.choice(clean_pool, size=min(n_pairs, len(clean_pool)), replace=False))
    cf = np.empty_like(clean)
    keep = np.ones(len(clean), dtype=bool)
    for j, c in enumerate(clean):
        for _ in range(64):  # rejection sampling; fall back to an explicit filter
            cand = pool[rng.integers(len(pool))]
            if table.answer[cand] != table.answer[c]:
                break
        else:
            others = pool[table.answer[pool] != table.answer[c]]
            if len(others) == 0:
                keep[j] = False
                continue
            cand = others[rng.integers(len(others))]
        cf[j] = cand
    return clean[keep], cf[keep]


def longest_prompt(tokenizer, numbers: NumberTokens, config: ScienceConfig) -> int:
    """Tokens of the longest prompt ``build_prompts`` would make, without tokenizing every
    prompt: each operator's prefix (few-shot text and solved examples) plus the longest own
    part among one cell per (digits of a, digits of b), which is exact where every number
    within the limit is one token, or one token per digit."""
    limit = UNLIMITED if numbers.digit_level else numbers.limit
    side = np.arange(config.operand_lo, config.operand_hi)
    ga, gb = (x.ravel() for x in np.meshgrid(side, side, indexing="ij"))
    longest = 0
    for i, op in enumerate(config.operators):
        ok = is_valid(op, ga, gb, limit)
        a, b = ga[ok], gb[ok]
        if not len(a):
            continue
        prefix, _ = operator_prefix(tokenizer, numbers, config, i, op, a, b, apply_op(op, a, b))
        width = np.char.str_len(a.astype(str)) * 100 + np.char.str_len(b.astype(str))
        _, first = np.unique(width, return_index=True)
        ids, _ = tokenize_prompts(tokenizer, config, [op] * len(first), a[first], b[first])
        longest = max(longest, len(prefix) + max(len(t) for t in ids))
    return longest


def check_context(length: int, n_ctx: int | None, config: ScienceConfig, model: str) -> None:
    """Refuse prompts longer than the model reads, naming what makes them long."""
    if n_ctx is None or length <= n_ctx:
        return
    parts = [f"template {config.template!r}"]
    if config.shots:
        parts.append(f"{config.shots} solved example(s) (--shots)")
    if config.few_shot:
        parts.append("the --few-shot text")
    raise ValueError(
        f"the longest prompt is {length} tokens but {model} reads at most {n_ctx} positions "
        f"(its n_ctx); it is made of {', '.join(parts)}: use fewer shots, a shorter "
        "template or few-shot text")