"""One prompt explained: the bag of heuristics at work on, say, "21+17=".

``explain(model, tokenizer, "21+17=", config, labels=...)`` writes the prompt exactly as
the catalog measures it under ``config`` (its template, few-shot prefix and BOS), and
returns an ``Explanation``:

- the model's answer, the correct answer's probability and rank, and whether greedy
  decoding writes the whole result; the logit lens per layer (the residual stream after
  each layer through the final norm and unembedding): where the answer appears;
- the exact direct decomposition of T, the answer's logit minus the mean logit of the
  competing number tokens (the first tokens of every result the operator takes on the
  config's grid), over every MLP neuron and attention head (``catalog.explain.decompose``:
  the norms' scales frozen; the terms and the rest add up to T);
- the top neurons toward and away from the answer, each with its labels for this
  operator where the checkpoint is catalogued (``labels``) and whether each label's
  heuristic holds for THIS prompt, its activation here beside its typical one
  (``typical``), and the tokens its value vector promotes;
- T by heuristic family and by label (neurons with a label that holds here), and its
  shares: labelled neurons whose heuristic holds, labelled neurons whose heuristics do
  not, other neurons, heads, embeddings and biases; the neurons it takes to reach 50% and
  80% of T and how many distinct heuristics they carry;
- the prompt knockout: per layer, up to the config's ``knockout_neurons`` labelled neurons
  whose heuristic holds (those pushing the answer most), zeroed at every position, against
  as many random neurons of the same layers (``seeds`` draws): the answer's probability
  and whether it stays the top token, with intervals.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from transformer_lens import HookedTransformer

from catalog.builtin.model import BUILTIN_NAME
from catalog.config import ScienceConfig
from catalog.core.arith import apply_op, is_valid
from catalog.core.stats import wilson
from catalog.core.tokens import detect_number_tokens, encode_number
from catalog.explain.decompose import Decomposition, decompose_cached, hook_names
from catalog.labels.heuristics import Heuristic
from catalog.labels.matches import Matches
from catalog.measuring.grids import final_logits, w_out
from catalog.measuring.prompts import UNLIMITED, operator_prefix, tokenize_prompts

PROMPT = re.compile(r"^\s*(\d+)\s*([-+*/])\s*(\d+)\s*=?\s*$")


class PromptError(ValueError):
    """A prompt the catalog cannot explain under the config (the message says why)."""


@dataclass
class Prompt:
    """One prompt as the catalog writes it under a config."""

    text: str  # the arithmetic, e.g. "21+17="
    a: int
    op: str
    b: int
    result: int
    tokens: np.ndarray  # prefix included
    answer: int  # the result's first token
    result_tokens: list[int]
    competitors: np.ndarray  # first tokens of the operator's other results on the grid


def parse(text: str, config: ScienceConfig) -> tuple[int, str, int]:
    """(a, op, b) of "a op b =" (the "=" optional), checked against the config."""
    m = PROMPT.match(text)
    if m is None:
        raise PromptError(f"{text!r} is not an arithmetic prompt: write it as "
                          "'a op b =' with non-negative integers and one of + - * /, "
                          "e.g. '21+17='")
    a, op, b = int(m[1]), m[2], int(m[3])
    if op not in config.operators:
        raise PromptError(f"operator {op!r} is not measured by this config (operators "
                          f"{''.join(config.operators)})")
    lo, hi = config.operand_lo, config.operand_hi
    if not (lo <= a < hi and lo <= b < hi):
        raise PromptError(f"operands {a} and {b} must be in the config's range [{lo}, {hi})")
    return a, op, b


def build_many(model: HookedTransformer, tokenizer, op: str, a: np.ndarray, b: np.ndarray,
               config: ScienceConfig) -> list[Prompt]:
    """The prompts ``a[i] op b[i] =`` as ``build_prompts`` writes them (the operator's one
    prefix of solved examples and its BOS), each checked against the config, the
    tokenizer's limit and the model's context."""
    for x, y in zip(a, b, strict=True):
        parse(f"{int(x)}{op}{int(y)}=", config)
    a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
    numbers = detect_number_tokens(tokenizer, prepend_bos=model.cfg.default_prepend_bos)
    limit = UNLIMITED if numbers.digit_level else numbers.limit
    bad = ~is_valid(op, a, b, limit)
    if bad.any():
        i = int(np.nonzero(bad)[0][0])
        raise PromptError(f"{a[i]}{op}{b[i]} is not a prompt the catalog measures (a result "
                          "that is negative, not a whole number, or past the tokenizer's "
                          f"single-token limit {numbers.limit})")
    side = np.arange(config.operand_lo, config.operand_hi)
    ga, gb = (g.ravel() for g in np.meshgrid(side, side, indexing="ij"))
    ok = is_valid(op, ga, gb, limit)
    va, vb = ga[ok], gb[ok]
    results = apply_op(op, va, vb)
    prefix, _ = operator_prefix(tokenizer, numbers, config, config.operators.index(op), op,
                                va, vb, results)
    ids, _ = tokenize_prompts(tokenizer, config, [op] * len(a), a, b)
    firsts = {encode_number(tokenizer, int(r))[0] for r in np.unique(results)}
    n_ctx = model.cfg.n_ctx
    out = []
    for x, y, row, r in zip(a, b, ids, apply_op(op, a, b), strict=True):
        tokens = np.concatenate([prefix, np.asarray(row, dtype=np.int64)])
        res_tokens = encode_number(tokenizer, int(r))
        if len(tokens) + len(res_tokens) > n_ctx:
            raise PromptError(f"the prompt {x}{op}{y}= and its answer take "
                              f"{len(tokens) + len(res_tokens)} tokens, longer than the "
                              f"model's context ({n_ctx})")
        out.append(Prompt(text=f"{x}{op}{y}=", a=int(x), op=op, b=int(y), result=int(r),
                          tokens=tokens, answer=res_tokens[0], result_tokens=list(res_tokens),
                          competitors=np.array(sorted(firsts - {res_tokens[0]}),
                                               dtype=np.int64)))
    return out


def build(model: HookedTransformer, tokenizer, text: str, config: ScienceConfig) -> Prompt:
    """The prompt of ``text`` as ``build_prompts`` writes it (the same prefix and shots)."""
    a, op, b = parse(text, config)
    return build_many(model, tokenizer, op, np.array([a]), np.array([b]), config)[0]


@dataclass
class LabelHere:
    label: str
    family: str
    holds: bool  # the heuristic's condition is true for this prompt


@dataclass
class NeuronRow:
    layer: int
    neuron: int
    contribution: float  # its term of T
    share: float  # contribution / T
    activation: float
    typical: float | None  # its typical activation where known (the catalog's mean)
    labels: list[LabelHere] = field(default_factory=list)
    promotes: list[str] = field(default_factory=list)  # top tokens of its value vector


@dataclass
class Knockout:
    """The prompt knockout and its random control (see the module doc)."""

    neurons: list[tuple[int, int]]
    p_clean: float
    p_knocked: float
    top_after: bool  # the answer is still the top token
    p_random: list[float]
    top_random: list[bool]

    @property
    def p_random_mean(self) -> float:
        return float(np.mean(self.p_random)) if self.p_random else float("nan")

    @property
    def p_random_se(self) -> float:
        n = len(self.p_random)
        return float(np.std(self.p_random, ddof=1) / np.sqrt(n)) if n > 1 else float("nan")

    @property
    def top_random_ci(self) -> tuple[float, float]:
        return wilson(int(sum(self.top_random)), len(self.top_random))


@dataclass
class Explanation:
    prompt: str
    a: int
    op: str
    b: int
    result: int
    predicted: str  # the model's top token
    correct: bool  # greedy decoding writes the whole result, then no further digit
    p_answer: float  # probability of the result's first token
    rank_answer: int  # 0 = top
    target: float  # T
    neurons_total: float
    heads_total: float
    embed: float
    biases: float
    error: float  # T - the sum of every term (rounding)
    lens: list[tuple[int, int, float]]  # (layer, rank, probability) of the answer token
    toward: list[NeuronRow]
    away: list[NeuronRow]
    heads: list[tuple[int, int, float]]  # (layer, head, term), largest |term| first
    by_family: dict[str, float]
    by_label: dict[str, float]
    shares: dict[str, float]
    n_for: dict[str, int]  # "50%", "80%": neurons (largest terms first) to reach it
    heuristics_in_80: int
    labelled: bool  # labels were given (the checkpoint is catalogued)
    knockout: Knockout | None

    def to_dict(self) -> dict:
        out = asdict(self)
        if self.knockout is not None:
            out["knockout"].update(p_random_mean=self.knockout.p_random_mean,
                                   p_random_se=self.knockout.p_random_se,
                                   top_random_ci=list(self.knockout.top_random_ci))
        return out


def _holds(h: Heuristic, p: Prompt) -> bool:
    return bool(h.contains(np.array([p.a]), np.array([p.b]), np.array([p.result]))[0])


@torch.no_grad()
def _one_pass(model: HookedTransformer, tokenizer, p: Prompt
              ) -> tuple[Decomposition, list[tuple[int, int, float]], bool]:
    """(the decomposition, the lens, whether the answer is correct) from one forward:
    the prompt followed by its result's tokens (teacher forcing). At the prompt's last
    position it keeps the decomposition's hooks and each layer's residual stream (the
    lens: every layer's through the final norm and unembedding in one product); the later
    positions tell whether greedy decoding writes the result: each result token the top
    one after the tokens before it, then (except on the built-in model, which ends
    nothing) a token that does not extend the number, the rule
    ``catalog.measuring.grids.run_grid`` judges every prompt of a run by. The positions
    after the prompt's cannot change its own (causal attention)."""
    n_ctx, n_layers = model.cfg.n_ctx, model.cfg.n_layers
    full = [int(t) for t in p.tokens] + list(p.result_tokens)
    seq = full[:n_ctx]
    at = len(p.tokens) - 1
    cache: dict[str, torch.Tensor] = {}

    def keep(x, hook):
        cache[hook.name] = x[:, at].detach()
        return x

    resid = [f"blocks.{layer}.hook_resid_post" for layer in range(n_layers)]
    names = set(hook_names(model)) | set(resid)
    toks = torch.as_tensor(seq, dtype=torch.long, device=model.W_U.device)[None]
    logits = model.run_with_hooks(toks, fwd_hooks=[(lambda n: n in names, keep)])[0]
    dec = decompose_cached(model, cache, logits[at][None], np.array([p.answer]),
                           p.competitors)[0]
    layers = final_logits(model, torch.stack([cache[r][0] for r in resid])[:, None])[:, 0]
    layers = layers.double()
    want = torch.as_tensor(p.answer, device=layers.device)
    ranks = (layers > layers[:, want, None]).sum(-1)
    probs = layers.softmax(-1)[:, want]
    lens = [(layer, int(ranks[layer]), float(probs[layer])) for layer in range(n_layers)]
    top = logits.argmax(-1)
    correct = all(at + i < len(seq) and int(top[at + i]) == t
                  for i, t in enumerate(p.result_tokens))
    if correct and len(full) < n_ctx and model.cfg.model_name != BUILTIN_NAME:
        correct = not tokenizer.decode([int(top[len(full) - 1])])[:1].isdigit()
    return dec, lens, correct


@torch.no_grad()
def _answer_prob(model: HookedTransformer, tokens: np.ndarray, answer: int,
                 knocked: list[tuple[int, int]]) -> tuple[float, bool]:
    """(the answer's probability, whether it is the top token) with ``knocked`` neurons
    zeroed at every position."""
    toks = torch.as_tensor(tokens, dtype=torch.long, device=model.W_U.device)[None]
    by_layer: dict[int, list[int]] = {}
    for layer, n in knocked:
        by_layer.setdefault(layer, []).append(n)

    def hook_for(idx):
        def hook(post, hook):
            post[..., idx] = 0.0
            return post
        return hook

    hooks: list = [(f"blocks.{layer}.mlp.hook_post", hook_for(torch.as_tensor(ns)))
                   for layer, ns in by_layer.items()]
    logits = model.run_with_hooks(toks, fwd_hooks=hooks)[0, -1].double()
    return float(logits.softmax(-1)[answer]), int(logits.argmax()) == answer


def knockout_set(holds: set[tuple[int, int]], terms: np.ndarray, per_layer: int
                 ) -> list[tuple[int, int]]:
    """The prompt knockout's neurons: per layer, up to ``per_layer`` of the labelled neurons
    whose heuristic holds, those pushing the answer most (largest direct terms) first. The
    paper zeroes up to N neurons per layer of the heuristics a prompt satisfies; zeroing
    every such neuron (tens of thousands in a real model) breaks any answer, and so does
    as many random ones."""
    by_layer: dict[int, list[int]] = {}
    for layer, n in holds:
        by_layer.setdefault(layer, []).append(n)
    out = []
    for layer, ns in sorted(by_layer.items()):
        ns.sort(key=lambda n: (-terms[layer, n], n))
        out += [(layer, n) for n in ns[:per_layer]]
    return out


def knockout(model: HookedTransformer, p: Prompt, neurons: list[tuple[int, int]],
             seeds: int, seed: int = 0) -> Knockout:
    """Zero ``neurons``, and ``seeds`` times as many random neurons of the same layers
    (drawn from the neurons not in the set, per layer)."""
    p_clean, _ = _answer_prob(model, p.tokens, p.answer, [])
    p_knocked, top = _answer_prob(model, p.tokens, p.answer, neurons)
    per_layer: dict[int, int] = {}
    for layer, _ in neurons:
        per_layer[layer] = per_layer.get(layer, 0) + 1
    taken = set(neurons)
    rng = np.random.default_rng([seed, 47])
    p_random, top_random = [], []
    for _ in range(seeds):
        drawn = []
        for layer, k in sorted(per_layer.items()):
            pool = [n for n in range(int(model.cfg.d_mlp or 0)) if (layer, n) not in taken]
            drawn += [(layer, int(n)) for n in rng.choice(pool, size=min(k, len(pool)),
                                                          replace=False)]
        pr, tr = _answer_prob(model, p.tokens, p.answer, drawn)
        p_random.append(pr)
        top_random.append(tr)
    return Knockout(neurons=list(neurons), p_clean=p_clean, p_knocked=p_knocked,
                    top_after=top, p_random=p_random, top_random=top_random)


def _promoted(model: HookedTransformer, tokenizer, rows: Sequence[tuple[int, int, float]],
              k: int = 5) -> list[list[str]]:
    """For each (layer, neuron, activation), the tokens the neuron's write promotes most
    at its activation's sign (a gated MLP's activation can be negative: its value vector
    then promotes its most negative tokens); every row's in one product with W_U."""
    if not rows:
        return []
    with torch.no_grad():
        w = torch.stack([w_out(model, layer)[n] * (1.0 if a >= 0 else -1.0)
                         for layer, n, a in rows])
        top = (w @ model.W_U).topk(k, dim=-1).indices.cpu().numpy()
    return [[tokenizer.decode([int(t)]) for t in r] for r in top]


def explain(model: HookedTransformer, tokenizer, text: str, config: ScienceConfig,
            labels: Mapping[tuple[int, int], Sequence[Heuristic]] | None = None,
            typical: Mapping[tuple[int, int], float] | None = None, top: int = 10,
            seeds: int = 5) -> Explanation:
    """Explain one prompt (module doc). ``labels``: (layer, neuron) -> the heuristics the
    catalog labelled the neuron with for this prompt's operator (None: not catalogued);
    ``seeds``: random draws of the knockout's control (0: no knockout)."""
    p = build(model, tokenizer, text, config)
    dec, lens, correct = _one_pass(model, tokenizer, p)
    logits = torch.as_tensor(dec.logits, dtype=torch.float64)
    probs = logits.softmax(-1)
    t = dec.target
    labels = labels or {}
    here = {key: [LabelHere(h.label, h.family, _holds(h, p)) for h in hs]
            for key, hs in labels.items() if hs}

    def row(layer: int, n: int) -> NeuronRow:
        c = float(dec.neurons[layer, n])
        return NeuronRow(layer, n, c, c / t if t else float("nan"),
                         float(dec.activations[layer, n]),
                         None if typical is None else typical.get((layer, n)),
                         here.get((layer, n), []))

    flat = dec.neurons.ravel()
    width = dec.neurons.shape[1]
    order = np.argsort(-flat, kind="stable")
    toward = [row(int(i) // width, int(i) % width) for i in order[:top] if flat[i] > 0]
    away = [row(int(i) // width, int(i) % width) for i in order[::-1][:top] if flat[i] < 0]
    for r, promotes in zip(toward + away, _promoted(
            model, tokenizer, [(r.layer, r.neuron, r.activation) for r in toward + away]),
            strict=True):
        r.promotes = promotes
    h_order = np.argsort(-np.abs(dec.heads.ravel()), kind="stable")[:top]
    heads = [(int(i) // dec.heads.shape[1], int(i) % dec.heads.shape[1],
              float(dec.heads.ravel()[i])) for i in h_order]
    holds = {key for key, ls in here.items() if any(x.holds for x in ls)}
    other_labelled = set(here) - holds
    by_family: dict[str, float] = {}
    by_label: dict[str, float] = {}
    for (layer, n) in holds:
        c = float(dec.neurons[layer, n])
        for x in {x.family: x for x in here[(layer, n)] if x.holds}.values():
            by_family[x.family] = by_family.get(x.family, 0.0) + c
        for x in here[(layer, n)]:
            if x.holds:
                by_label[x.label] = by_label.get(x.label, 0.0) + c

    def part(keys) -> float:
        return float(sum(dec.neurons[k] for k in keys))

    s_hold, s_other = part(holds), part(other_labelled)
    rest_neurons = float(dec.neurons.sum()) - s_hold - s_other
    shares = {k: v / t if t else float("nan") for k, v in {
        "labelled, heuristic holds": s_hold, "labelled, heuristic does not hold": s_other,
        "other neurons": rest_neurons, "heads": float(dec.heads.sum()),
        "embeddings and biases": dec.embed + dec.biases + dec.error}.items()}
    cum = np.cumsum(flat[order])
    n_for = {}
    for name, frac in (("50%", 0.5), ("80%", 0.8)):
        reach = np.nonzero(cum >= frac * t)[0] if t > 0 else np.zeros(0, np.int64)
        n_for[name] = int(reach[0]) + 1 if len(reach) else -1  # -1: the neurons never reach it
    in80 = order[:max(n_for["80%"], 0)]
    heuristics_in_80 = len({x.label for i in in80
                            for x in here.get((int(i) // width, int(i) % width), [])
                            if x.holds})
    knocked = knockout_set(holds, dec.neurons, config.knockout_neurons)
    ko = knockout(model, p, knocked, seeds, config.seed) if labels and seeds and knocked \
        else None
    return Explanation(
        prompt=p.text, a=p.a, op=p.op, b=p.b, result=p.result,
        predicted=tokenizer.decode([int(logits.argmax())]),
        correct=correct, p_answer=float(probs[p.answer]),
        rank_answer=int((logits > logits[p.answer]).sum()), target=t,
        neurons_total=float(dec.neurons.sum()), heads_total=float(dec.heads.sum()),
        embed=dec.embed, biases=dec.biases, error=dec.error,
        lens=lens, toward=toward, away=away, heads=heads,
        by_family=by_family, by_label=by_label, shares=shares, n_for=n_for,
        heuristics_in_80=heuristics_in_80, labelled=bool(labels), knockout=ko)


def labels_from_rows(rows) -> dict[tuple[int, int], list[Heuristic]]:
    """(layer, neuron) -> heuristics from stored label rows (layer, neuron, family, target,
    params), as ``schema.explanations.labels_at`` returns them."""
    out: dict[tuple[int, int], list[Heuristic]] = {}
    for layer, neuron, family, target, params in rows:
        out.setdefault((int(layer), int(neuron)), []).append(
            Heuristic(family, target, tuple(params)))
    return out


def labels_of(matches: Mapping[int, Matches], o: int) -> dict[tuple[int, int], list[Heuristic]]:
    """(layer, neuron) -> the heuristics labelled for operator index ``o`` in each layer's
    ``Matches``."""
    out: dict[tuple[int, int], list[Heuristic]] = {}
    for layer, m in matches.items():
        for i in np.nonzero((m.op == o) & m.implements)[0]:
            out.setdefault((int(layer), int(m.neuron[i])), []).append(m.row_heuristic(int(i)))
    return out


def labels_from_result(result, op: str) -> dict[tuple[int, int], list[Heuristic]]:
    """(layer, neuron) -> the heuristics labelled for ``op`` in a ``CheckpointResult``
    measured with its layers kept (``catalog.measure``)."""
    return labels_of({layer: lr.matches for layer, lr in result.layers.items()},
                     list(result.config.operators).index(op))
