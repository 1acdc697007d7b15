"""How a prompt's T splits over labelled and other neurons, and what the label adds.

Per prompt, every MLP neuron has a score on the answer's logit difference T: its direct
term (``catalog.explain.decompose``, the parts add up to T) or its first-order total
effect (``catalog.explain.total``, which need not add up). ``split`` gives the shares of
T carried by the labelled neurons whose label holds, the labelled ones whose label does
not, and the others, and the neurons (largest first) it takes to reach 50% and 80% of T.

A share alone cannot say whether the label matters: a layer's neurons carry T whatever
their labels. ``label_excess`` compares the labelled neurons that hold with what as many
neurons of the same layers would carry had the prompt's labels been placed at random on
them (the matched controls of ``catalog.explain.controls``: the unlabelled neurons, or
the labelled neurons whose labels' sets do not contain the prompt), the side condition
applied alike; the difference is divided by T. Under labels placed at random (same
counts per layer) it is 0 in expectation.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

PARTS = ("labelled, heuristic holds", "labelled, heuristic does not hold", "other neurons",
         "heads", "embeddings and biases")
RANKINGS = ("direct", "total")


def neuron_mask(keys: Iterable[tuple[int, int]], shape: tuple[int, ...]) -> np.ndarray:
    """(n_layers, d_mlp) bool: True at each (layer, neuron) of ``keys``."""
    out = np.zeros(shape, dtype=bool)
    for layer, n in keys:
        out[layer, n] = True
    return out


def label_masks(shape: tuple[int, int], labelled: set[tuple[int, int]],
                holds: set[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """((n_layers, d_mlp) labelled, (n_layers, d_mlp) labelled and holding) from keys."""
    lab = neuron_mask(labelled, shape)
    return lab, neuron_mask(holds, shape) & lab


def first_reach(sorted_terms: np.ndarray, target: np.ndarray, frac: float) -> np.ndarray:
    """Per row, how many of the (descending) terms it takes for their running sum to reach
    ``frac`` of the row's target (-1 where it never does, or the target is not positive)."""
    cum = np.cumsum(sorted_terms, axis=1)
    hit = cum >= frac * target[:, None]
    first = hit.argmax(1) + 1
    return np.where(hit.any(1) & (target > 0), first, -1)


def split(terms: np.ndarray, masks: tuple[np.ndarray, np.ndarray], t: float,
          rest: tuple[float, float] | None) -> tuple[dict[str, float], dict[str, int]]:
    """(shares of T, neurons for 50% / 80%) of one prompt's (n_layers, d_mlp) ``terms``;
    ``rest``: (the heads' sum, embeddings and biases) for a split that adds up to T, None
    for the neurons' parts alone (total effects)."""
    labelled, hold = masks
    s_hold = float(terms[hold].sum())
    s_other = float(terms[labelled & ~hold].sum())
    parts = {PARTS[0]: s_hold, PARTS[1]: s_other, PARTS[2]: float(terms.sum()) - s_hold - s_other}
    if rest is not None:
        parts.update({PARTS[3]: rest[0], PARTS[4]: rest[1]})
    shares = {k: v / t if t else float("nan") for k, v in parts.items()}
    ranked = -np.sort(-terms.ravel())[None]
    n_for = {name: int(first_reach(ranked, np.array([t]), frac)[0])
             for name, frac in (("50%", 0.5), ("80%", 0.8))}
    return shares, n_for


def label_excess(terms: np.ndarray, labelled: np.ndarray, member: np.ndarray,
                 sides: np.ndarray, t: np.ndarray) -> dict[str, np.ndarray]:
    """Per prompt, what the label adds to the share of T (module doc), against the
    ``unlabelled`` pool and the ``not holding`` pool (``catalog.explain.controls``):
    ``terms`` (P, n_layers, d_mlp), ``labelled`` (n_layers, d_mlp), ``member`` / ``sides``
    (P, n_layers, d_mlp) the bits of ``catalog.explain.holds``, ``t`` (P,). The expected
    sum of a random placement is exact: each labelled neuron whose labels' sets contain
    the prompt adds the pool's mean of (term where its kinds' side holds, else 0). NaN
    where a layer with such neurons has an empty pool, or T is 0."""
    lab = labelled[None]
    cand = lab & (member != 0)
    s_hold = (terms * (cand & ((member & sides) != 0))).sum((1, 2))
    pools = {"unlabelled": np.broadcast_to(~lab, member.shape),
             "not holding": lab & (member == 0)}
    out = {}
    with np.errstate(divide="ignore", invalid="ignore"):
        for name, pool in pools.items():
            size = pool.sum(-1)  # (P, n_layers)
            expect = np.zeros(member.shape[:2])
            for bits in np.unique(member[cand]):
                count = (cand & (member == bits)).sum(-1)
                meet = pool & ((sides & bits) != 0)
                mean = np.where(size > 0, (terms * meet).sum(-1) / np.maximum(size, 1), np.nan)
                expect = expect + np.where(count > 0, count * mean, 0.0)
            out[name] = np.where(t != 0, (s_hold - expect.sum(1)) / t, np.nan)
    return out


def held_contributions(neurons: np.ndarray, here: dict, holds: set
                       ) -> tuple[dict[str, float], dict[str, float]]:
    """The direct terms (``neurons``, (n_layers, d_mlp)) of the neurons whose labels hold
    (``holds``; ``here``: (layer, neuron) -> labels with ``holds``, ``family``, ``label``),
    summed per family (a neuron counted once per family) and per label."""
    by_family: dict[str, float] = {}
    by_label: dict[str, float] = {}
    for (layer, n) in holds:
        c = float(neurons[layer, n])
        for x in {x.family: x for x in here[(layer, n)] if x.holds}.values():
            by_family[x.family] = by_family.get(x.family, 0.0) + c
        for x in here[(layer, n)]:
            if x.holds:
                by_label[x.label] = by_label.get(x.label, 0.0) + c
    return by_family, by_label


def heuristics_reached(reach: np.ndarray, here: dict, width: int) -> int:
    """How many distinct labels hold on the neurons ``reach`` (flat indices: those that
    reach 80% of T, largest direct terms first)."""
    return len({x.label for i in reach for x in here.get((int(i) // width, int(i) % width), [])
                if x.holds})


def top_heads(heads: np.ndarray, top: int) -> list[tuple[int, int, float]]:
    """(layer, head, term) of the ``top`` heads of largest |term|."""
    h_order = np.argsort(-np.abs(heads.ravel()), kind="stable")[:top]
    return [(int(i) // heads.shape[1], int(i) % heads.shape[1], float(heads.ravel()[i]))
            for i in h_order]
