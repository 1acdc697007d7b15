"""What the label adds, over many prompts, with the control that can refute it.

Given every prompt's scores (``Scored``: the direct terms and total effects of every
neuron, and the side bits of ``catalog.explain.holds.sides``) and a set of labels, the
figures of "what the label adds" (``catalog.explain.shares.label_excess`` for the share
of T; the prompt knockout against its matched controls, ``catalog.explain.controls``,
with the knockout ranked by direct term, by total effect, and drawn as the paper draws)
are computed per prompt and averaged.

A mean over prompts has a standard error over prompts, but the labels are ONE placement
on the model's neurons: prompts share it, so a chance alignment of a few labels with
neurons that carry answers moves every prompt alike, and the prompts' standard error
does not see it. So every figure is computed again, by the same code, with the labels
placed at random on the neurons of the same layers (same counts per layer: each
neuron's list of labels moved whole, ``reassign``), ``placements`` times. The figure is
reported beside that null (its mean and spread over placements), and its interval
combines both errors: (figure - null mean) +- 1.96 sqrt(SE over prompts^2 + SD over
placements^2). Under labels that mean nothing that interval holds 0; the verdict says
"adds" only where it lies above.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from catalog.core.stats import mean_se
from catalog.explain.controls import MATCHED, Evaluator, evaluate_all, knockout_masks, verdict
from catalog.explain.holds import Label, member_kinds
from catalog.explain.shares import label_excess, neuron_mask

KNOCKOUT_RANKINGS = ("direct", "total", "paper")


@dataclass
class Scored:
    """What the label-dependent figures need of each prompt (P prompts)."""

    a: np.ndarray
    b: np.ndarray
    result: np.ndarray
    target: np.ndarray  # (P,) T
    scores: dict[str, np.ndarray]  # "direct", "total" -> (P, n_layers, d_mlp)
    sides: np.ndarray  # (P, n_layers, d_mlp) int8 (catalog.explain.holds.sides)
    activations: np.ndarray | None = None  # (P, n_layers, d_mlp) at the last position


def reassign(labels: Mapping[tuple[int, int], Sequence[Label]], d_mlp: int,
             rng: np.random.Generator) -> dict[tuple[int, int], list[Label]]:
    """The same labels placed at random: within each layer, each labelled neuron's list
    of labels moved whole to a neuron drawn without replacement (same counts per layer)."""
    by_layer: dict[int, list] = {}
    for (layer, _), xs in sorted(labels.items()):
        by_layer.setdefault(layer, []).append(list(xs))
    out = {}
    for layer, lists in by_layer.items():
        where = rng.choice(d_mlp, len(lists), replace=False)
        out.update({(layer, int(n)): xs for n, xs in zip(where, lists, strict=True)})
    return out


def knockouts(scored: Scored, labelled: np.ndarray, member: np.ndarray, per_layer: int,
              draws: int, rng: np.random.Generator, top_set: np.ndarray | None,
              evaluate: Evaluator, matched_only: bool = False) -> dict:
    """ranking -> set name -> (p (P, draws), top (P, draws), zeroed (P, draws)): every
    prompt's knockout and controls, each draw of each set one evaluation over all
    prompts, a ranking's in one ``evaluate_all``. The paper's ranking (random from
    ``top_set``) is left out without one."""
    out: dict = {}
    for ranking in KNOCKOUT_RANKINGS:
        if ranking == "paper" and top_set is None:
            continue
        masks = knockout_masks(None if ranking == "paper" else scored.scores[ranking],
                               labelled, member, scored.sides, per_layer, draws, rng,
                               top_set if ranking == "paper" else None, matched_only)
        # one ranking's sets at a time: their masks are all held until evaluated
        got = iter(evaluate_all(evaluate, [(m, None, None) for draws_of in masks.values()
                                           for m in draws_of]))
        out[ranking] = {}
        for name, draws_of in masks.items():
            res = [next(got) for _ in draws_of]
            out[ranking][name] = (np.stack([g[0] for g in res], 1),
                                  np.stack([g[1] for g in res], 1),
                                  np.stack([m.sum((1, 2)) for m in draws_of], 1))
    return out


def adds(scored: Scored, labels: Mapping[tuple[int, int], Sequence[Label]],
         shape: tuple[int, int], per_layer: int, draws: int, rng: np.random.Generator,
         top_set: np.ndarray | None, evaluate: Evaluator | None,
         matched_only: bool = False) -> dict:
    """Per prompt, what ``labels`` add: {"share": {ranking: {control: (P,)}},
    "knockout": {ranking: {control: (P,)}} (control's mean p minus the knockout's),
    "sets": the knockouts' raw results (``knockouts``), "member": the member bits}."""
    labelled = neuron_mask(labels, shape)
    member = member_kinds(labels, shape, scored.a, scored.b, scored.result)
    share = {r: label_excess(scored.scores[r], labelled, member, scored.sides, scored.target)
             for r in ("direct", "total")}
    out: dict = {"share": share, "knockout": {}, "sets": {}, "member": member,
                 "labelled": labelled}
    if evaluate is None or not labels:
        return out
    sets = knockouts(scored, labelled, member, per_layer, draws, rng, top_set, evaluate,
                     matched_only)
    out["sets"] = sets
    for ranking, by in sets.items():
        p_k = by["knockout"][0][:, 0]
        out["knockout"][ranking] = {c: np.nanmean(by[c][0], 1) - p_k for c in MATCHED}
    return out


def against_null(true: Mapping[str, np.ndarray], nulls: Sequence[Mapping[str, np.ndarray]]
                 ) -> dict[str, dict]:
    """control -> the figure over prompts (mean, SE, n), the null's mean and SD over
    placements, and the figure less the null mean with the combined interval and verdict
    (module doc)."""
    out = {}
    for control, x in true.items():
        stat = mean_se(x)
        null = np.array([mean_se(nl[control])["mean"] for nl in nulls if control in nl])
        null = null[np.isfinite(null)]
        mu = float(null.mean()) if len(null) else 0.0
        sd = float(null.std(ddof=1)) if len(null) > 1 else 0.0
        diff = stat["mean"] - mu
        se = float(np.hypot(stat["se"], sd)) if np.isfinite(stat["se"]) else float("nan")
        combined = {"mean": diff, "se": se, "ci": [diff - 1.96 * se, diff + 1.96 * se]}
        out[control] = {**stat, "null_mean": mu, "null_sd": sd, "placements": int(len(null)),
                        "adds": combined, "verdict": verdict(combined)}
    return out
