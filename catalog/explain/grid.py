"""The explanation of one prompt, aggregated over many prompts of an operator.

For each prompt (a, op, b) the exact direct decomposition of T (``catalog.explain.decompose``)
is split as ``catalog.explain.prompt.explain`` splits it: labelled neurons whose heuristic
holds for the prompt, labelled neurons whose heuristics do not, other neurons, heads, and
embeddings and biases; the neurons (largest terms first) it takes to reach 50% and 80% of
T, and how many distinct heuristics holding for the prompt those neurons carry.

Over the prompts (``summarize_prompts``):

- how often the answer's T is mostly carried by labelled neurons whose heuristic holds
  (share >= 0.5), with a Wilson interval, beside the share of the neurons that are such
  neurons (the base rate: what the share of T would be if a term did not depend on the
  label);
- the medians, with distribution-free 95% intervals, of the shares, of the neurons for
  50% / 80% of T and of the heuristics combining in the 80%;
- the paired check of the claim "a neuron pushes the answer because its heuristic holds":
  the mean term of a labelled neuron on the prompts where its heuristic holds against the
  same neuron on the prompts where it does not (the same neurons, layers and operator: only
  the label's condition differs), averaged over the labelled neurons, with its standard
  error over neurons; and the same per layer (most labelled neurons of a deep model sit
  where their direct terms are near zero whatever the prompt).

- on the neurons' total effects too (``catalog.explain.total``: first order, through every
  later layer), the same shares and neurons for 50% / 80%;
- what the label adds: to the share of T (``catalog.explain.shares.label_excess``), and
  to the prompt knockout, against controls chosen the same way except for the label
  (``catalog.explain.controls``), with the knockout's neurons ranked on each prompt by
  direct term, by total effect, or drawn at random from the top set as the paper draws
  them; each as a mean over prompts with its standard error and 95% interval, and a
  verdict ("adds", "nil", "takes away").

A label holds for a prompt where its set contains it and the neuron is on the label's
side of its typical value (``catalog.explain.holds``; ``typical`` / ``typical_kv``).
Labels exist only in the layers the catalog measured: the shares are of the whole model's
T, and "other neurons" includes every neuron of an unmeasured layer (``layers`` says which).
Prompts are batched by token count; only their last position is kept.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from transformer_lens import HookedTransformer

from catalog.config import ScienceConfig
from catalog.core.stats import mean_se, median_ci, wilson
from catalog.core.tokens import encode_number
from catalog.explain.controls import Evaluator, masked_last_position
from catalog.explain.decompose import decompose_batch
from catalog.explain.holds import Label, as_labels, kind, sides, typical_arrays
from catalog.explain.label_figures import Scored, adds, against_null, reassign
from catalog.explain.prompt import build_many, grid_cells
from catalog.explain.shares import PARTS, first_reach
from catalog.explain.steering import Steered, steer, summarize_steering
from catalog.explain.total import total_effects
from catalog.labels.heuristics import Heuristic
from catalog.measuring.lens import lens_at


@dataclass
class PromptTerms:
    """Per prompt (P,) arrays of the split of T; ``shares``: part -> (P,)."""

    a: np.ndarray
    b: np.ndarray
    result: np.ndarray
    target: np.ndarray
    shares: dict[str, np.ndarray]
    n_for: dict[str, np.ndarray]  # "50%", "80%": neurons to reach it (-1: never)
    heuristics_in_80: np.ndarray
    n_holding: np.ndarray  # labelled neurons whose heuristic holds, per prompt
    n_neurons: int  # neurons of the model
    n_labelled: int  # labelled neurons (over the measured layers)
    layer_of: np.ndarray  # the layer of each labelled neuron
    # per labelled neuron: the sum and count of its terms where its heuristic holds / not
    held_sum: np.ndarray
    held_n: np.ndarray
    not_sum: np.ndarray
    not_n: np.ndarray
    # the same split of the neurons' total effects (parts 0-2 of PARTS)
    shares_total: dict[str, np.ndarray] = field(default_factory=dict)
    n_for_total: dict[str, np.ndarray] = field(default_factory=dict)
    # what the labels add per prompt (catalog.explain.label_figures.adds), and the same
    # with the labels placed at random, once per placement
    label_adds: dict = field(default_factory=dict)
    null_adds: list[dict] = field(default_factory=list)
    p_clean: np.ndarray | None = None
    # the steering test of each result heuristic (catalog.explain.steering)
    steering: list[Steered] = field(default_factory=list)


def score_prompts(model: HookedTransformer, prompts: list, layers: Sequence[int],
                  typical: Mapping | None, typical_kv: Mapping | None, batch: int
                  ) -> tuple[Scored, np.ndarray]:
    """Every prompt's direct terms, total effects and side bits (over ``layers``: the
    layers with labels), batched by token count; and the heads' sums of T (P,)."""
    n_layers, d_mlp = model.cfg.n_layers, int(model.cfg.d_mlp or 0)
    shape = (n_layers, d_mlp)
    n = len(prompts)
    mean_act, mean_kv = typical_arrays(shape, typical, typical_kv)
    # the direct terms in float64: their parts add up to T
    scores: dict[str, np.ndarray] = {"direct": np.zeros((n, *shape)),
                                     "total": np.zeros((n, *shape), dtype=np.float32)}
    side_all = np.zeros((n, *shape), dtype=np.int8)
    acts = np.zeros((n, *shape), dtype=np.float32)
    target, heads = np.zeros(n), np.zeros(n)
    lengths = np.array([len(p.tokens) for p in prompts])
    for length in np.unique(lengths):
        idx_all = np.nonzero(lengths == length)[0]
        for start in range(0, len(idx_all), batch):
            idx = idx_all[start:start + batch]
            toks = np.stack([prompts[i].tokens for i in idx])
            answers = np.array([prompts[i].answer for i in idx])
            comp = np.union1d(prompts[idx[0]].competitors, [prompts[idx[0]].answer])
            dec = decompose_batch(model, toks, answers, comp)
            scores["direct"][idx] = dec.neurons
            scores["total"][idx] = total_effects(model, toks, answers, comp)
            lens_all = np.zeros((len(idx), *shape))
            for layer in layers:
                lens_all[:, layer] = lens_at(model, layer, answers).T
            side_all[idx] = sides(dec.activations, lens_all, mean_act, mean_kv)
            acts[idx] = dec.activations
            target[idx] = dec.target
            heads[idx] = dec.heads.reshape(len(idx), -1).sum(1)
    return Scored(a=np.array([p.a for p in prompts]), b=np.array([p.b for p in prompts]),
                  result=np.array([p.result for p in prompts]), target=target,
                  scores=scores, sides=side_all, activations=acts), heads


def explain_prompts(model: HookedTransformer, tokenizer, config: ScienceConfig, op: str,
                    a: np.ndarray, b: np.ndarray,
                    labels: Mapping[tuple[int, int], Sequence[Label | Heuristic]],
                    batch: int = 128, typical: Mapping | None = None,
                    typical_kv: Mapping | None = None, draws: int = 2,
                    evaluate: Evaluator | None = None, top_set: np.ndarray | None = None,
                    knockouts: bool = True, placements: int = 8,
                    steering: bool = True, steer_heuristics: int = 12) -> PromptTerms:
    """The split of T for each prompt ``a[i] op b[i] =`` (module doc); ``labels``:
    (layer, neuron) -> the labels for ``op``; ``typical`` / ``typical_kv``: each neuron's
    mean activation / KV value (the labels' sides); ``draws``: of each random control;
    ``evaluate``: (P, n_layers, d_mlp) masks -> each prompt's (p of its answer, top) with
    its mask zeroed at the last position (default: full forwards); ``top_set``: the
    paper's pool (None: no paper knockout); ``placements``: random placements of the
    labels for the figures' null (catalog.explain.label_figures); ``steering``: the
    steering test of the result heuristics with the most labelled neurons, up to
    ``steer_heuristics`` (catalog.explain.steering; with the knockouts)."""
    prompts = build_many(model, tokenizer, op, np.asarray(a), np.asarray(b), config)
    n_layers, d_mlp = model.cfg.n_layers, int(model.cfg.d_mlp or 0)
    labels = as_labels(labels)
    keys = sorted(labels)
    flat = np.array([layer * d_mlp + n for layer, n in keys], dtype=np.int64)
    scored, heads = score_prompts(model, prompts, sorted({la for la, _ in keys}), typical,
                                  typical_kv, batch)
    n = len(prompts)
    per_label, label_cols, hold_labels, hold = holding(scored, labels, keys, flat)
    t = scored.target
    shares, n_for, shares_total, n_for_total, in80 = _splits(scored, heads, flat, hold,
                                                             hold_labels, per_label,
                                                             label_cols)
    direct = scored.scores["direct"].reshape(n, -1)
    run = _evaluator(model, prompts, evaluate) if knockouts and len(keys) and n else None
    p_clean, true, nulls, steered = _knockout_figures(
        model, tokenizer, config, op, scored, labels, run, draws, top_set, placements,
        steer_heuristics if steering else 0)
    return PromptTerms(a=scored.a, b=scored.b, result=scored.result, target=t, shares=shares,
                       n_for=n_for, heuristics_in_80=in80, n_holding=hold.sum(1),
                       n_neurons=n_layers * d_mlp, n_labelled=len(keys),
                       layer_of=np.array([layer for layer, _ in keys], dtype=np.int64),
                       **_held_sums(direct, flat, hold), shares_total=shares_total,
                       n_for_total=n_for_total, label_adds=true, null_adds=nulls,
                       p_clean=p_clean, steering=steered)


def holding(scored: Scored, labels: Mapping, keys: list, flat: np.ndarray
             ) -> tuple[list, list[list[int]], np.ndarray, np.ndarray]:
    """(each (labelled neuron's position, label), each labelled neuron's label columns,
    (P, labels) whether each label holds on each prompt, (P, labelled neurons) whether
    any of the neuron's labels holds): a label holds where the prompt is in its set and
    its side condition holds on the neuron (``sides`` bits)."""
    n = len(scored.a)
    per_label = [(k, x) for k, key in enumerate(keys) for x in labels[key]]
    label_cols: list[list[int]] = [[] for _ in keys]
    hold_labels = np.zeros((n, len(per_label)), dtype=bool)
    bits = scored.sides.reshape(n, -1)[:, flat] if len(flat) else np.zeros((n, 0), np.int8)
    for col, (k, x) in enumerate(per_label):
        label_cols[k].append(col)
        inside = np.asarray(x.heuristic.contains(scored.a, scored.b, scored.result), dtype=bool)
        hold_labels[:, col] = inside & ((bits[:, k] & kind(x)) != 0)
    hold = np.zeros((n, len(keys)), dtype=bool)
    for col, (k, _) in enumerate(per_label):
        hold[:, k] |= hold_labels[:, col]
    return per_label, label_cols, hold_labels, hold


def _label_figures(scored: Scored, labels: Mapping, shape: tuple[int, int], per_layer: int,
                   draws: int, rng: np.random.Generator, top_set: np.ndarray | None,
                   run: Evaluator | None, placements: int) -> tuple[dict, list[dict]]:
    """What the labels add (catalog.explain.label_figures) and the same figures with the
    labels placed at random ``placements`` times (the null: the matched sets only),
    without the masks they were drawn from."""
    true = adds(scored, labels, shape, per_layer, draws, rng, top_set, run)
    nulls = [adds(scored, reassign(labels, shape[1], rng), shape, per_layer, 1, rng, top_set,
                  run, matched_only=True) for _ in range(placements)]
    for fig in [true, *nulls]:
        fig.pop("member", None)
        fig.pop("labelled", None)
    for fig in nulls:
        fig.pop("sets", None)
    return true, nulls


def _splits(scored: Scored, heads: np.ndarray, flat: np.ndarray, hold: np.ndarray,
            hold_labels: np.ndarray, per_label: list, label_cols: list[list[int]]) -> tuple:
    """Per prompt: the shares of T and the neurons for 50% / 80% of it, on the direct
    terms and on the total effects, and the heuristics combining in the direct 80%."""
    n, t = len(scored.a), scored.target
    shares = {part: np.zeros(n) for part in PARTS}
    shares_total = {part: np.zeros(n) for part in PARTS[:3]}
    n_for = {"50%": np.zeros(n, np.int64), "80%": np.zeros(n, np.int64)}
    n_for_total = {"50%": np.zeros(n, np.int64), "80%": np.zeros(n, np.int64)}
    in80 = np.zeros(n, np.int64)
    everyone = np.arange(n)
    direct = scored.scores["direct"].reshape(n, -1)
    _split_rows(direct, flat, hold, t, everyone, shares, n_for, heads)
    _split_rows(scored.scores["total"].reshape(n, -1), flat, hold, t, everyone, shares_total,
                n_for_total, None)
    _heuristics_in_80(direct, flat, hold_labels, everyone, n_for, label_cols,
                      [x.heuristic.label for _, x in per_label], in80)
    return shares, n_for, shares_total, n_for_total, in80


def _knockout_figures(model: HookedTransformer, tokenizer, config: ScienceConfig, op: str,
                      scored: Scored, labels: Mapping, run: Evaluator | None, draws: int,
                      top_set: np.ndarray | None, placements: int, steer_heuristics: int
                      ) -> tuple:
    """(each prompt's clean p of its answer, what the labels add, the same under random
    placements, the steering tests): no knockout, null or steering without ``run``, no
    steering with ``steer_heuristics`` 0."""
    n, shape = len(scored.a), scored.sides.shape[1:]
    rng = np.random.default_rng([config.seed, 77])
    p_clean = run(np.zeros((n, *shape), dtype=bool))[0] if run is not None else None
    true, nulls = _label_figures(scored, labels, shape, config.knockout_neurons, draws, rng,
                                 top_set, run, placements if labels else 0)
    steered = _steered(model, tokenizer, config, op, scored, labels, run, rng,
                       steer_heuristics) if run is not None and steer_heuristics else []
    return p_clean, true, nulls, steered


def _evaluator(model: HookedTransformer, prompts: list, evaluate: Evaluator | None
               ) -> Evaluator:
    """``evaluate``, or the prompts' own masked forwards at their last position."""
    return evaluate or masked_last_position(model, [p.tokens for p in prompts],
                                            np.array([p.answer for p in prompts]))


def _steered(model: HookedTransformer, tokenizer, config: ScienceConfig, op: str,
             scored: Scored, labels: Mapping, run: Evaluator, rng: np.random.Generator,
             steer_heuristics: int) -> list[Steered]:
    """The steering test of the result heuristics with the most labelled neurons
    (catalog.explain.steering), over the operator's results on the grid."""
    results = grid_cells(model, tokenizer, config, op)[2]
    first = {int(r): encode_number(tokenizer, int(r))[0] for r in np.unique(results)}
    assert scored.activations is not None
    return steer(labels, scored.activations, scored.sides, scored.a, scored.b,
                 scored.result, results, first, run, rng, max_heuristics=steer_heuristics)


def _split_rows(terms: np.ndarray, flat: np.ndarray, hold: np.ndarray, t: np.ndarray,
                idx: np.ndarray, shares: dict, reach: dict, heads: np.ndarray | None) -> None:
    """A batch's shares of T and neurons for 50% / 80% into ``shares`` / ``reach`` at
    ``idx``: ``terms`` (B, neurons), ``hold`` (B, labelled) whose label holds; ``heads``
    the heads' sums (None: the neurons' parts only)."""
    lab = terms[:, flat] if len(flat) else np.zeros((len(terms), 0))
    s_hold = (lab * hold).sum(1)
    s_other = (lab * ~hold).sum(1)
    parts = {PARTS[0]: s_hold, PARTS[1]: s_other, PARTS[2]: terms.sum(1) - s_hold - s_other}
    if heads is not None:
        parts.update({PARTS[3]: heads, PARTS[4]: t - terms.sum(1) - heads})
    with np.errstate(divide="ignore", invalid="ignore"):
        for part, v in parts.items():
            shares[part][idx] = np.where(t != 0, v / t, np.nan)
    ranked = -np.sort(-terms, axis=1)
    for name, frac in (("50%", 0.5), ("80%", 0.8)):
        reach[name][idx] = first_reach(ranked, t, frac)


def _heuristics_in_80(terms: np.ndarray, flat: np.ndarray, hold_labels: np.ndarray,
                      idx: np.ndarray, n_for: dict, label_cols: list[list[int]],
                      names: list[str], in80: np.ndarray) -> None:
    """How many distinct heuristics that hold are carried by the neurons (largest direct
    terms first) that reach 80% of T; ``hold_labels`` (P, labels) whether each label
    holds, ``label_cols[k]`` the columns of labelled neuron k's labels, ``names`` each
    column's heuristic."""
    position = {int(f): k for k, f in enumerate(flat)}
    order = np.argsort(-terms, axis=1, kind="stable")
    for j, i in enumerate(idx):
        top = order[j, :max(int(n_for["80%"][i]), 0)]
        in80[i] = len({names[c] for f in top if (k := position.get(int(f))) is not None
                       for c in label_cols[k] if hold_labels[i, c]})


def _held_sums(terms: np.ndarray, flat: np.ndarray, hold: np.ndarray) -> dict:
    """Per labelled neuron: the sum and count of its direct terms where its label holds
    and where it does not (the paired check)."""
    lab = terms[:, flat].astype(np.float64) if len(flat) else np.zeros((len(terms), 0))
    return {"held_sum": (lab * hold).sum(0), "held_n": hold.sum(0),
            "not_sum": (lab * ~hold).sum(0), "not_n": (~hold).sum(0)}


def _median(x: np.ndarray) -> dict:
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    lo, hi = median_ci(x)
    return {"median": float(np.median(x)) if len(x) else float("nan"), "ci": [lo, hi],
            "n": int(len(x))}


def summarize_prompts(terms: PromptTerms, layers: Sequence[int]) -> dict:
    """The aggregates of the module doc, as a JSON-ready dict."""
    n = len(terms.target)
    mostly = int((terms.shares[PARTS[0]] >= 0.5).sum())
    reached = {k: v[v > 0] for k, v in terms.n_for.items()}
    both = (terms.held_n > 0) & (terms.not_n > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        held_all = terms.held_sum / terms.held_n
        not_all = terms.not_sum / terms.not_n
    held_mean, not_mean = held_all[both], not_all[both]
    diff = held_mean - not_mean
    m = int(both.sum())
    by_layer = {}
    for layer in np.unique(terms.layer_of[both]):
        d = (held_all - not_all)[both & (terms.layer_of == layer)]
        by_layer[str(int(layer))] = {**mean_se(d), "n_neurons": int(len(d)),
                                     "higher_when_holds": int((d > 0).sum())}
    return {
        "n_prompts": n,
        "layers": [int(x) for x in layers],
        "n_neurons": terms.n_neurons,
        "n_labelled": terms.n_labelled,
        "target": _median(terms.target),
        "mostly_labelled": {"count": mostly, "n": n, "ci": list(wilson(mostly, n))},
        "neuron_base_rate": float(terms.n_holding.mean() / terms.n_neurons) if n else
        float("nan"),
        "shares": {part: _median(v) for part, v in terms.shares.items()},
        "n_for": {k: {**_median(v), "never": int((terms.n_for[k] <= 0).sum())}
                  for k, v in reached.items()},
        "heuristics_in_80": _median(terms.heuristics_in_80[terms.n_for["80%"] > 0]),
        "paired": {"n_neurons": m, "holds": mean_se(held_mean), "does_not": mean_se(not_mean),
                   "difference": mean_se(diff),
                   "higher_when_holds": int((diff > 0).sum()), "by_layer": by_layer},
        "shares_total": {part: _median(v) for part, v in terms.shares_total.items()},
        "n_for_total": {k: {**_median(v[v > 0]), "never": int((v <= 0).sum())}
                        for k, v in terms.n_for_total.items()},
        "share_adds": {r: against_null(by, [nl["share"][r] for nl in terms.null_adds])
                       for r, by in terms.label_adds.get("share", {}).items()},
        "knockouts": {r: {**summarize_knockout(sets, terms.p_clean), "label_adds": against_null(
            terms.label_adds["knockout"][r],
            [nl["knockout"][r] for nl in terms.null_adds if r in nl["knockout"]])}
            for r, sets in terms.label_adds.get("sets", {}).items()},
        "steering": summarize_steering(terms.steering),
    }


def summarize_knockout(sets: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]],
                       p_clean: np.ndarray | None) -> dict:
    """One ranking's knockout over prompts: per set, the answer's mean probability after it
    (each prompt's mean over draws) and how often the answer stays on top, over every
    prompt (a prompt whose knockout zeroes nothing keeps its clean answer), and over the
    prompts whose knockout zeroes something."""
    p_k, top_k, zeroed_k = sets["knockout"]
    some = zeroed_k[:, 0] > 0
    out: dict = {"n_prompts": int(len(p_k)), "n_knocked": int(some.sum()),
                 "mean_zeroed": float(zeroed_k[some, 0].mean()) if some.any() else 0.0,
                 "p_clean": mean_se(p_clean) if p_clean is not None else None,
                 "sets": {}}
    for name, (p, top, _) in sets.items():
        rate = top.mean(1)
        k = int(round(float(rate.sum()))) if name == "knockout" else None
        out["sets"][name] = {"p": mean_se(np.nanmean(p, 1)), "top": mean_se(rate),
                             "p_knocked_only": mean_se(np.nanmean(p, 1)[some]),
                             "draws": int(p.shape[1]),
                             **({"top_count": k, "top_ci": list(wilson(k, len(rate)))}
                                if k is not None else {})}
    return out
