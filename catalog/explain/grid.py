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

Labels exist only in the layers the catalog measured: the shares are of the whole model's
T, and "other neurons" includes every neuron of an unmeasured layer (``layers`` says which).
Prompts are batched by token count; only their last position is kept.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from transformer_lens import HookedTransformer

from catalog.config import ScienceConfig
from catalog.core.stats import median_ci, wilson
from catalog.explain.decompose import decompose_batch
from catalog.explain.prompt import build_many
from catalog.labels.heuristics import Heuristic

PARTS = ("labelled, heuristic holds", "labelled, heuristic does not hold", "other neurons",
         "heads", "embeddings and biases")


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


def _first_reach(sorted_terms: np.ndarray, target: np.ndarray, frac: float) -> np.ndarray:
    """Per row, how many of the (descending) terms it takes for their running sum to reach
    ``frac`` of the row's target (-1 where it never does, or the target is not positive)."""
    cum = np.cumsum(sorted_terms, axis=1)
    hit = cum >= frac * target[:, None]
    first = hit.argmax(1) + 1
    return np.where(hit.any(1) & (target > 0), first, -1)


def explain_prompts(model: HookedTransformer, tokenizer, config: ScienceConfig, op: str,
                    a: np.ndarray, b: np.ndarray,
                    labels: Mapping[tuple[int, int], Sequence[Heuristic]],
                    batch: int = 128) -> PromptTerms:
    """The split of T for each prompt ``a[i] op b[i] =`` (module doc); ``labels``:
    (layer, neuron) -> the heuristics labelled for ``op``."""
    prompts = build_many(model, tokenizer, op, np.asarray(a), np.asarray(b), config)
    n_layers, d_mlp = model.cfg.n_layers, int(model.cfg.d_mlp or 0)
    keys = sorted(k for k, hs in labels.items() if hs)
    flat = np.array([layer * d_mlp + n for layer, n in keys], dtype=np.int64)
    a_all = np.array([p.a for p in prompts])
    b_all = np.array([p.b for p in prompts])
    r_all = np.array([p.result for p in prompts])
    # hold[p, k]: some heuristic of labelled neuron k holds for prompt p
    by_key: dict[str, np.ndarray] = {}
    hold = np.zeros((len(prompts), len(keys)), dtype=bool)
    label_of: list[list[str]] = []
    for k, key in enumerate(keys):
        names = []
        for h in labels[key]:
            if h.key not in by_key:
                by_key[h.key] = np.asarray(h.contains(a_all, b_all, r_all), dtype=bool)
            hold[:, k] |= by_key[h.key]
            names.append(h.key)
        label_of.append(names)
    position = {int(f): k for k, f in enumerate(flat)}
    n = len(prompts)
    target = np.zeros(n)
    shares = {part: np.zeros(n) for part in PARTS}
    n_for = {"50%": np.zeros(n, np.int64), "80%": np.zeros(n, np.int64)}
    in80 = np.zeros(n, np.int64)
    held_sum, held_n = np.zeros(len(keys)), np.zeros(len(keys), np.int64)
    not_sum, not_n = np.zeros(len(keys)), np.zeros(len(keys), np.int64)
    lengths = np.array([len(p.tokens) for p in prompts])
    for length in np.unique(lengths):
        idx_all = np.nonzero(lengths == length)[0]
        for start in range(0, len(idx_all), batch):
            idx = idx_all[start:start + batch]
            dec = decompose_batch(model, np.stack([prompts[i].tokens for i in idx]),
                                  np.array([prompts[i].answer for i in idx]),
                                  np.union1d(prompts[idx[0]].competitors,
                                              [prompts[idx[0]].answer]))
            terms = dec.neurons.reshape(len(idx), -1)
            t = dec.target
            lab = terms[:, flat] if len(flat) else np.zeros((len(idx), 0))
            here = hold[idx]
            s_hold = (lab * here).sum(1)
            s_other = (lab * ~here).sum(1)
            held_sum += (lab * here).sum(0)
            held_n += here.sum(0)
            not_sum += (lab * ~here).sum(0)
            not_n += (~here).sum(0)
            parts = {PARTS[0]: s_hold, PARTS[1]: s_other,
                     PARTS[2]: terms.sum(1) - s_hold - s_other,
                     PARTS[3]: dec.heads.reshape(len(idx), -1).sum(1),
                     PARTS[4]: t - terms.sum(1) - dec.heads.reshape(len(idx), -1).sum(1)}
            with np.errstate(divide="ignore", invalid="ignore"):
                for part, v in parts.items():
                    shares[part][idx] = np.where(t != 0, v / t, np.nan)
            target[idx] = t
            order = np.argsort(-terms, axis=1, kind="stable")
            ranked = np.take_along_axis(terms, order, 1)
            for name, frac in (("50%", 0.5), ("80%", 0.8)):
                n_for[name][idx] = _first_reach(ranked, t, frac)
            for j, i in enumerate(idx):
                top = order[j, :max(int(n_for["80%"][i]), 0)]
                carried = {key for f in top if (at := position.get(int(f))) is not None
                           and hold[i, at] for key in label_of[at] if by_key[key][i]}
                in80[i] = len(carried)
    return PromptTerms(a=a_all, b=b_all, result=r_all, target=target, shares=shares,
                       n_for=n_for, heuristics_in_80=in80, n_holding=hold.sum(1),
                       n_neurons=n_layers * d_mlp, n_labelled=len(keys),
                       layer_of=np.array([layer for layer, _ in keys], dtype=np.int64),
                       held_sum=held_sum,
                       held_n=held_n, not_sum=not_sum, not_n=not_n)


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

    def mean_se(x: np.ndarray) -> dict:
        return {"mean": float(x.mean()) if len(x) else float("nan"),
                "se": float(x.std(ddof=1) / np.sqrt(len(x))) if len(x) > 1 else float("nan")}

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
    }
