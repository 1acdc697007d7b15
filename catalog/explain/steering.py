"""Steering a heuristic: do its labelled neurons move the answer into (or out of) its set?

A label says a neuron's map is high (or low) on a heuristic's set S_H. If the neurons
labelled with a result heuristic carry it, setting them, at a prompt's last position, to
the activation they have where the heuristic holds should move the answer into S_H on a
prompt whose result is outside it ("into"), and setting them to their activation where
it does not hold should move the answer out of S_H on a prompt inside it ("out of").

For each result heuristic with at least ``min_neurons`` labelled neurons (either side:
the target is the neurons' own mean activation over the prompts inside, or outside,
S_H), up to ``max_prompts`` correct prompts per direction:

- success "into": the top token after the edit is a first token of a result in S_H and
  of no result outside it (tokens shared by results on both sides decide nothing: a
  heuristic whose results share every first token with others is skipped); "out of":
  the top token is a first token of results outside S_H only;
- the control: the same edit on as many UNLABELLED neurons of the same layers, drawn at
  random (``draws`` times), each set to its own mean over the same prompts;
- per family: the success rates of the labelled neurons and of the control, with Wilson
  intervals, and their difference with Newcombe's interval: "moves" where it lies above
  0, "below control" where below (the control drew neurons that carry the heuristic
  better than its labelled ones), "nil" otherwise.

Under labels placed at random the labelled neurons are random neurons and succeed as
often as the control (tested on a hand-built model, where the true labels succeed far
more often).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from catalog.core.stats import newcombe, wilson
from catalog.explain.controls import Evaluator, evaluate_all
from catalog.explain.holds import Label, kind
from catalog.explain.shares import neuron_mask
from catalog.labels.heuristics import Heuristic

DIRECTIONS = ("into", "out of")


@dataclass
class Steered:
    """One heuristic, one direction: how many prompts moved as it predicts."""

    heuristic: Heuristic
    direction: str
    n_neurons: int
    n_prompts: int
    success: int
    control: list[int]  # successes per control draw (same prompts)


def result_tokens(h: Heuristic, results: np.ndarray, first_token: Mapping[int, int]
                  ) -> tuple[set[int], set[int]]:
    """(first tokens of results only inside S_H, of results only outside it) over the
    operator's ``results``; a token shared by both sides is in neither."""
    results = np.unique(results)
    inside = np.asarray(h.contains(np.zeros_like(results), np.zeros_like(results), results),
                        dtype=bool)
    tin = {first_token[int(r)] for r in results[inside]}
    tout = {first_token[int(r)] for r in results[~inside]}
    return tin - tout, tout - tin


def steer(labels: Mapping[tuple[int, int], Sequence[Label]], activations: np.ndarray,
          sides: np.ndarray, a: np.ndarray, b: np.ndarray, result: np.ndarray,
          results: np.ndarray,
          first_token: Mapping[int, int], evaluate: Evaluator, rng: np.random.Generator,
          min_neurons: int = 2, max_prompts: int = 64, max_heuristics: int = 24,
          draws: int = 2) -> list[Steered]:
    """Every steerable result heuristic of ``labels`` (module doc). ``activations`` (P,
    n_layers, d_mlp): each prompt's activations at its last position, ``sides`` their
    side bits (catalog.explain.holds.sides); ``a``, ``b``,
    ``result``: the P prompts (correct ones); ``results``: every result of the operator
    on the grid; ``first_token``: result -> its first token; ``evaluate``: the prompts'
    ``Evaluator`` (catalog.explain.controls)."""
    shape = activations.shape[1:]
    by_h: dict[str, tuple[Heuristic, list[tuple[int, int]], list[int]]] = {}
    for key, xs in sorted(labels.items()):
        for x in xs:
            if x.heuristic.target == "result":
                got = by_h.setdefault(x.heuristic.key, (x.heuristic, [], []))
                got[1].append(key)
                got[2].append(kind(x))
    labelled = neuron_mask(labels, shape)
    ranked = sorted(by_h.values(), key=lambda x: (-len(x[1]), x[0].key))
    # every steered set is drawn first, then all are run in one ``evaluate_all``
    planned: list[tuple[Heuristic, str, int, int, set]] = []
    requests = []
    for h, neurons, kinds in ranked:
        if len(planned) >= 2 * max_heuristics:
            break
        if len(neurons) < min_neurons:
            continue
        tin, tout = result_tokens(h, results, first_token)
        inside = np.asarray(h.contains(a, b, result), dtype=bool)
        if not tin or not tout or inside.all() or not inside.any():
            continue
        for direction in DIRECTIONS:
            src = inside if direction == "into" else ~inside  # the value's prompts
            target = np.nonzero(~src)[0]
            target = np.sort(rng.permutation(target)[:max_prompts])
            want = tin if direction == "into" else tout
            sets = [list(neurons)] + [_matched(neurons, ~labelled, rng) for _ in range(draws)]
            for chosen in sets:
                mask = neuron_mask(chosen, shape)
                values = np.where(mask, activations[src].mean(0), 0.0)
                if direction == "into":  # each set as its labels would have it: held
                    values = _where_held(values, activations, sides, inside, chosen, kinds)
                requests.append((np.broadcast_to(mask, (len(target), *shape)),
                                 np.broadcast_to(values, (len(target), *shape)), target))
            planned.append((h, direction, len(neurons), len(target), want))
    results_of = iter(evaluate_all(evaluate, requests))
    out: list[Steered] = []
    for h, direction, n_neurons, n_target, want in planned:
        hits = [int(np.isin(next(results_of)[2], list(want)).sum())
                for _ in range(draws + 1)]
        out.append(Steered(h, direction, n_neurons, n_target, hits[0], hits[1:]))
    return out


def _where_held(values: np.ndarray, activations: np.ndarray, sides: np.ndarray,
                inside: np.ndarray, neurons: Sequence[tuple[int, int]], kinds: Sequence[int]
                ) -> np.ndarray:
    """Each labelled neuron's mean activation over the prompts where its label holds (in
    the set and on the label's side), where it holds on some prompt: a neuron that needs
    more than the heuristic (a residue neuron that also needs its operands' residues)
    fires on part of the set only, and its mean over the whole set understates what it
    writes when it fires."""
    values = values.copy()
    for (layer, n), k in zip(neurons, kinds, strict=False):
        held = inside & ((sides[:, layer, n] & k) != 0)
        if held.any():
            values[layer, n] = activations[held, layer, n].mean()
    return values


def _matched(neurons: Sequence[tuple[int, int]], pool: np.ndarray,
             rng: np.random.Generator) -> list[tuple[int, int]]:
    """One neuron of ``pool`` in the same layer for each of ``neurons``, drawn at random
    without replacement, in the same order (so each takes its partner's label kind)."""
    out = []
    for layer in sorted({la for la, _ in neurons}):
        k = sum(1 for la, _ in neurons if la == layer)
        cand = np.nonzero(pool[layer])[0]
        out.append((layer, rng.choice(cand, min(k, len(cand)), replace=False)))
    drawn = {layer: list(ns) for layer, ns in out}
    return [(la, int(drawn[la].pop(0))) for la, _ in neurons if drawn[la]]


def summarize_steering(rows: Sequence[Steered]) -> dict:
    """Per family and direction: heuristics, prompts, the labelled neurons' success rate
    and the control's (Wilson 95%), their difference (Newcombe 95%) and a verdict
    ("moves", "below control" or "nil": module doc)."""
    out: dict = {}
    for family in sorted({r.heuristic.family for r in rows}):
        for direction in DIRECTIONS:
            sel = [r for r in rows if r.heuristic.family == family and r.direction == direction]
            if sel:
                out.setdefault(family, {})[direction] = _steered_group(sel)
    return out


def _steered_group(sel: Sequence[Steered]) -> dict:
    """One family and direction's figures (``summarize_steering``)."""
    n = sum(r.n_prompts for r in sel)
    k = sum(r.success for r in sel)
    draws = min(len(r.control) for r in sel)
    nc = n * draws
    kc = sum(sum(r.control[:draws]) for r in sel)
    both = bool(n and nc)
    nan = float("nan")
    lo, hi = newcombe(k, n, kc, nc) if both else (nan, nan)
    return {
        "heuristics": len(sel), "prompts": n, "success": k,
        "rate": k / n if n else nan, "ci": list(wilson(k, n)),
        "control_success": kc, "control_n": nc,
        "control_rate": kc / nc if nc else nan,
        "control_ci": list(wilson(kc, nc)),
        "difference": (k / n - kc / nc) if both else nan,
        "difference_ci": [lo, hi],
        "verdict": _verdict(lo, hi),
        "examples": [{"heuristic": r.heuristic.label, "neurons": r.n_neurons,
                      "prompts": r.n_prompts, "success": r.success,
                      "control": r.control} for r in sel[:5]]}


def _verdict(lo: float, hi: float) -> str:
    """"moves" where the difference's interval is above 0, "below control" where it is
    below, else "nil" (NaN bounds: "nil")."""
    if lo == lo and lo > 0:
        return "moves"
    if hi == hi and hi < 0:
        return "below control"
    return "nil"
