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
- the top neurons toward and away from the answer, each with its direct term and its
  first-order total effect (through every later layer: ``catalog.explain.total``), its
  labels for this operator where the checkpoint is catalogued (``labels``), each with its
  side (the neuron is high, or low, on the heuristic's set) and whether it holds for THIS
  prompt (the prompt is in the set and the neuron is on that side of its typical value:
  ``catalog.explain.holds``), its activation here beside its typical one (``typical``),
  and the tokens its value vector promotes;
- T by heuristic family and by label (neurons with a label that holds here), and its
  shares: labelled neurons whose heuristic holds, labelled neurons whose heuristics do
  not, other neurons, heads, embeddings and biases; the neurons it takes to reach 50% and
  80% of T and how many distinct heuristics they carry; the same on total effects; and
  what the label adds to the share (``catalog.explain.shares.label_excess``);
- the prompt knockout and its controls (``catalog.explain.controls``): per layer, up to
  the config's ``knockout_neurons`` labelled neurons whose label holds, those ranked first
  on this prompt (by direct term or total effect), zeroed at the last position, against
  sets chosen the same way except for the label (unlabelled neurons; labelled neurons
  whose label does not hold), the same number by the same ranking, and random neurons of
  the paper's top set; what the label adds is the answer's probability after a matched
  control minus after the knockout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from transformer_lens import HookedTransformer

from catalog.builtin.model import BUILTIN_NAME
from catalog.config import ScienceConfig
from catalog.core.arith import apply_op, is_valid
from catalog.core.tokens import detect_number_tokens, encode_number
from catalog.explain.controls import PromptKnockout, knockout_masks, run_knockout
from catalog.explain.decompose import Decomposition, decompose_cached, hook_names
from catalog.explain.greedy import written  # noqa: F401  (re-exported)
from catalog.explain.holds import (  # noqa: F401  (the label loaders, re-exported)
    Label,
    as_labels,
    complement_pairs,
    kind,
    labels_from_result,
    labels_from_rows,
    labels_of,
    member_kinds,
    sides,
    typical_arrays,
)
from catalog.explain.shares import (
    RANKINGS,
    held_contributions,
    heuristics_reached,
    label_excess,
    label_masks,
    split,
    top_heads,
)
from catalog.explain.syntax import PROMPT, PromptError, parse  # noqa: F401  (re-exported)
from catalog.explain.total import total_effects
from catalog.labels.heuristics import Heuristic
from catalog.measuring.grids import final_logits, w_out
from catalog.measuring.lens import lens_at
from catalog.measuring.prompts import UNLIMITED, operator_prefix, tokenize_prompts


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


def grid_cells(model: HookedTransformer, tokenizer, config: ScienceConfig, op: str
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(a, b, result) of every valid cell of ``op``'s grid under the config."""
    numbers = detect_number_tokens(tokenizer, prepend_bos=model.cfg.default_prepend_bos)
    limit = UNLIMITED if numbers.digit_level else numbers.limit
    side = np.arange(config.operand_lo, config.operand_hi)
    ga, gb = (g.ravel() for g in np.meshgrid(side, side, indexing="ij"))
    ok = is_valid(op, ga, gb, limit)
    return ga[ok], gb[ok], apply_op(op, ga[ok], gb[ok])


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
    va, vb, results = grid_cells(model, tokenizer, config, op)
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
    holds: bool  # the prompt is in the heuristic's set and the neuron on the label's side
    side: str = "high"  # "high": the neuron is high on the set; "low": low on it


@dataclass
class NeuronRow:
    layer: int
    neuron: int
    contribution: float  # its direct term of T
    share: float  # contribution / T
    activation: float
    typical: float | None  # its typical activation where known (the catalog's mean)
    labels: list[LabelHere] = field(default_factory=list)
    promotes: list[str] = field(default_factory=list)  # top tokens of its value vector
    total: float = float("nan")  # its first-order total effect on T (catalog.explain.total)
    notes: list[str] = field(default_factory=list)  # e.g. a set and its complement, one side


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
    rank_answer: int  # 1 = top (the number of tokens above it, plus one)
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
    knockout: PromptKnockout | None
    # the same split on the neurons' total effects (first order; they need not add to T)
    shares_total: dict[str, float] = field(default_factory=dict)
    n_for_total: dict[str, int] = field(default_factory=dict)
    # what the label adds to the share of T, direct and total: the labelled neurons that
    # hold minus as many unlabelled (or labelled, not holding) neurons of the same layers
    # would carry on average (catalog.explain.shares.label_excess)
    share_adds: dict[str, dict[str, float]] = field(default_factory=dict)
    # what greedy decoding writes after the prompt: its first token, then every token
    # that extends the number (catalog.explain.prompt.written)
    written: str = ""
    answer_token: str = ""  # the result's first token, as text

    def to_dict(self) -> dict:
        out = asdict(self)
        if self.knockout is not None:
            out["knockout"].update(self.knockout.to_dict())
        return out


@torch.no_grad()
def _one_pass(model: HookedTransformer, tokenizer, p: Prompt
              ) -> tuple[Decomposition, list[tuple[int, int, float]], bool, str]:
    """(the decomposition, the lens, whether the answer is correct, what greedy decoding
    writes) from one forward:
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
    lens = [(layer, int(ranks[layer]) + 1, float(probs[layer])) for layer in range(n_layers)]
    top = logits.argmax(-1)
    correct = all(at + i < len(seq) and int(top[at + i]) == t
                  for i, t in enumerate(p.result_tokens))
    if correct and len(full) < n_ctx and model.cfg.model_name != BUILTIN_NAME:
        correct = not tokenizer.decode([int(top[len(full) - 1])])[:1].isdigit()
    return dec, lens, correct, written(model, tokenizer, p, top.tolist())


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
            labels: Mapping[tuple[int, int], Sequence[Label | Heuristic]] | None = None,
            typical: Mapping[tuple[int, int], float] | None = None, top: int = 10,
            seeds: int = 5, typical_kv: Mapping[tuple[int, int], float] | None = None,
            ranking: str = "direct", top_set: np.ndarray | None = None,
            total: bool = True) -> Explanation:
    """Explain one prompt (module doc). ``labels``: (layer, neuron) -> its labels for this
    prompt's operator (None: not catalogued); ``typical`` / ``typical_kv``: each neuron's
    mean activation / KV value over the grid (a label's side is checked against them);
    ``seeds``: draws of each random control of the knockout (0: no knockout);
    ``ranking``: what picks the knockout's neurons on the prompt, "direct" or "total";
    ``top_set``: (n_layers, d_mlp) the pool of the paper's random control (None: every
    neuron); ``total``: compute the total effects (one backward; False: NaN, and the
    knockout must rank by direct terms)."""
    _check_ranking(ranking, total)
    p = build(model, tokenizer, text, config)
    dec, lens, correct, wrote = _one_pass(model, tokenizer, p)
    totals = total_effects(model, p.tokens[None], np.array([p.answer]), p.competitors)[0] \
        if total else np.full(dec.neurons.shape, np.nan)
    logits = torch.as_tensor(dec.logits, dtype=torch.float64)
    t = dec.target
    labelled_in = as_labels(labels)
    shape = dec.neurons.shape
    side_bits, member, here = _labels_on(model, p, dec, labelled_in, typical, typical_kv)
    toward, away, order = _shown_rows(dec, totals, here, typical, top)
    _annotate(model, tokenizer, config, p, toward + away, labelled_in)
    holds = {key for key, ls in here.items() if any(x.holds for x in ls)}
    masks = label_masks(shape, set(here), holds)
    by_family, by_label = held_contributions(dec.neurons, here, holds)
    shares, n_for, shares_total, n_for_total = _splits(dec, totals, masks, t, total)
    scored = {"direct": dec.neurons, **({"total": totals} if total else {})}
    ko = _knockout(model, config, p, scored[ranking], masks, member, side_bits, seeds,
                   ranking, top_set) if labelled_in and seeds else None
    return Explanation(
        prompt=p.text, a=p.a, op=p.op, b=p.b, result=p.result,
        predicted=tokenizer.decode([int(logits.argmax())]),
        correct=correct, p_answer=float(logits.softmax(-1)[p.answer]),
        rank_answer=int((logits > logits[p.answer]).sum()) + 1, target=t,
        neurons_total=float(dec.neurons.sum()), heads_total=float(dec.heads.sum()),
        embed=dec.embed, biases=dec.biases, error=dec.error,
        lens=lens, toward=toward, away=away, heads=top_heads(dec.heads, top),
        by_family=by_family, by_label=by_label, shares=shares, n_for=n_for,
        heuristics_in_80=heuristics_reached(order[:max(n_for["80%"], 0)], here, shape[1]),
        labelled=bool(labelled_in), knockout=ko,
        shares_total=shares_total, n_for_total=n_for_total,
        share_adds=_share_adds(scored, masks, member, side_bits, t) if labelled_in else {},
        written=wrote, answer_token=tokenizer.decode([int(p.answer)]))


def _annotate(model: HookedTransformer, tokenizer, config: ScienceConfig, p: Prompt,
              shown: list, labelled_in: Mapping) -> None:
    """The shown rows' promoted tokens and their labels' complements, in place."""
    for r, promotes in zip(shown, _promoted(
            model, tokenizer, [(r.layer, r.neuron, r.activation) for r in shown]), strict=True):
        r.promotes = promotes
    _note_complements(model, tokenizer, config, p, shown, labelled_in)


def _splits(dec, totals: np.ndarray, masks: tuple, t: float, total: bool) -> tuple:
    """(shares, n_for) of T over the direct terms, and over the total effects ({} where
    not computed)."""
    rest = float(dec.heads.sum()), dec.embed + dec.biases + dec.error
    shares, n_for = split(dec.neurons, masks, t, rest)
    return (shares, n_for, *(split(totals, masks, t, None) if total else ({}, {})))


def _check_ranking(ranking: str, total: bool) -> None:
    """A ranking the knockout knows, with the effects it needs."""
    if ranking not in RANKINGS:
        raise ValueError(f"ranking must be one of {RANKINGS}, not {ranking!r}")
    if ranking == "total" and not total:
        raise ValueError("ranking 'total' needs the total effects (total=True)")


def _labels_on(model: HookedTransformer, p: Prompt, dec, labelled_in: Mapping,
               typical: Mapping | None, typical_kv: Mapping | None
               ) -> tuple[np.ndarray, np.ndarray, dict]:
    """(each neuron's side bits on the prompt, each neuron's label kinds whose sets
    contain it, (layer, neuron) -> its labels with whether each holds here)."""
    shape = dec.neurons.shape
    lens_all = np.stack([lens_at(model, layer, np.array([p.answer]))[:, 0]
                         for layer in range(shape[0])]) if labelled_in else np.zeros(shape)
    side_bits = sides(dec.activations, lens_all, *typical_arrays(shape, typical, typical_kv))
    one = (np.array([p.a]), np.array([p.b]), np.array([p.result]))
    member = member_kinds(labelled_in, shape, *one)[0]
    here = {(layer, n): [LabelHere(x.heuristic.label, x.family, bool(
        x.heuristic.contains(*one)[0] and side_bits[layer, n] & kind(x)), x.side) for x in xs]
        for (layer, n), xs in labelled_in.items()}
    return side_bits, member, here


def _knockout(model: HookedTransformer, config: ScienceConfig, p: Prompt, score: np.ndarray,
              masks: tuple, member: np.ndarray, side_bits: np.ndarray, seeds: int,
              ranking: str, top_set: np.ndarray | None) -> PromptKnockout | None:
    """The prompt knockout with its controls (None where no labelled neuron holds)."""
    sets = knockout_masks(score[None], masks[0], member[None], side_bits[None],
                          config.knockout_neurons, seeds,
                          np.random.default_rng([config.seed, 47]), random_pool=top_set)
    return run_knockout(model, p.tokens, p.answer, sets, ranking) \
        if sets["knockout"][0].any() else None


def _share_adds(scored: dict[str, np.ndarray], masks: tuple, member: np.ndarray,
                side_bits: np.ndarray, t: float) -> dict:
    """What the labels add to each score's share of T (``label_excess``)."""
    return {name: {k: float(v[0]) for k, v in label_excess(
        x[None], masks[0], member[None], side_bits[None], np.array([t])).items()}
        for name, x in scored.items()}


def _shown_rows(dec, totals: np.ndarray, here: dict, typical: Mapping | None, top: int
                ) -> tuple[list[NeuronRow], list[NeuronRow], np.ndarray]:
    """(the ``top`` neurons pushing the answer most, the ``top`` pushing it away most,
    every neuron's position by direct term, largest first)."""
    t = dec.target

    def row(layer: int, n: int) -> NeuronRow:
        c = float(dec.neurons[layer, n])
        return NeuronRow(layer, n, c, c / t if t else float("nan"),
                         float(dec.activations[layer, n]),
                         None if typical is None else typical.get((layer, n)),
                         here.get((layer, n), []), total=float(totals[layer, n]))

    flat = dec.neurons.ravel()
    width = dec.neurons.shape[1]
    order = np.argsort(-flat, kind="stable")
    toward = [row(int(i) // width, int(i) % width) for i in order[:top] if flat[i] > 0]
    away = [row(int(i) // width, int(i) % width) for i in order[::-1][:top] if flat[i] < 0]
    return toward, away, order


def _note_complements(model: HookedTransformer, tokenizer, config: ScienceConfig, p: Prompt,
                      rows: list[NeuronRow], labels: Mapping[tuple[int, int], list]) -> None:
    """A note on each shown neuron labelled with a set and its complement on one side."""
    cells = None
    for r in rows:
        xs = labels.get((r.layer, r.neuron), [])
        if len(xs) < 2:
            continue
        if cells is None:
            cells = grid_cells(model, tokenizer, config, p.op)
        for x, y in complement_pairs(xs, *cells):
            r.notes.append(f"{x.text} and {y.text}: a set and its complement on the same "
                           "side, so the neuron is high (or low) almost everywhere; the "
                           "larger set's label comes from its base rate, only the smaller "
                           "says where it differs")


