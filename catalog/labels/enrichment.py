"""Are important neurons labelled more often than others? (docs/method.md section 7,
"Enrichment").

The heuristics paper reports that 91% of the top-200-per-layer neurons of Llama3-8B
implement a heuristic. That share means something only beside the share of neurons that
are not important: if 90% of all neurons are labelled, 91% of the top ones is no
evidence. Per layer and operator this module sets the labelled share of the top set (the
``top_set_fraction`` of the layer by the catalog's rank) beside that of a random set of
as many other neurons of the same layer (seeded) and beside the whole layer, with Wilson
95% intervals, the difference top - random with Newcombe's interval, and the one-sided
Fisher exact p-value that the top set is labelled more often than the random set. The
same per heuristic family (a neuron counts for a family when it carries one of its
labels), and pooled over the layers.
"""

from __future__ import annotations

import math

import numpy as np

from catalog.core.stats import fisher_greater, newcombe, wilson


def compare(k_top: int, n_top: int, k_rand: int, n_rand: int, k_all: int, n_all: int) -> dict:
    """The numbers of one comparison (see the module docstring)."""
    def share(k: int, n: int) -> float:
        return k / n if n else float("nan")

    return {"n_top": n_top, "labelled_top": k_top, "share_top": share(k_top, n_top),
            "ci_top": wilson(k_top, n_top),
            "n_random": n_rand, "labelled_random": k_rand,
            "share_random": share(k_rand, n_rand), "ci_random": wilson(k_rand, n_rand),
            "n_layer": n_all, "labelled_layer": k_all, "share_layer": share(k_all, n_all),
            "ci_layer": wilson(k_all, n_all),
            "difference": share(k_top, n_top) - share(k_rand, n_rand),
            "ci_difference": newcombe(k_top, n_top, k_rand, n_rand),
            "fisher_p": fisher_greater(k_top, n_top, k_rand, n_rand)}


def enrichment(ranks: dict[int, np.ndarray], labels: dict[int, dict[str, np.ndarray]],
               ops: tuple[str, ...], fraction: float, seed: int) -> list[dict]:
    """Rows of the enrichment table.

    ranks: layer -> (neurons, ops) rank (0 = most important). labels: layer -> family
    ("any" for every family) -> (neurons, ops) bool, the neuron carries a label of that
    family on that operator. One row per (layer, or "all" pooled over layers; operator;
    family) with the fields of ``compare``; the random set of a layer is the same for
    every family."""
    rows: list[dict] = []
    families = sorted({f for per in labels.values() for f in per} | {"any"})
    pooled: dict[tuple[str, str], np.ndarray] = {}
    for layer in sorted(ranks):
        width = ranks[layer].shape[0]
        n_top = max(1, math.ceil(fraction * width))
        for o, op in enumerate(ops):
            rank = ranks[layer][:, o]
            top = rank < n_top
            rest = np.nonzero(~top)[0]
            gen = np.random.default_rng([seed, layer, o])
            rand = np.zeros(width, dtype=bool)
            rand[gen.choice(rest, size=min(n_top, len(rest)), replace=False)] = True
            for fam in families:
                lab = labels.get(layer, {}).get(fam, np.zeros((width, len(ops)), bool))[:, o]
                counts = np.array([int((lab & top).sum()), int(top.sum()),
                                   int((lab & rand).sum()), int(rand.sum()),
                                   int(lab.sum()), width])
                pooled[(op, fam)] = pooled.get((op, fam), 0) + counts
                rows.append({"layer": layer, "op": op, "family": fam, **compare(*counts)})
    for (op, fam), counts in pooled.items():
        rows.append({"layer": "all", "op": op, "family": fam,
                     **compare(*(int(c) for c in counts))})
    return rows


def label_masks(matches, width: int, n_ops: int) -> dict[str, np.ndarray]:
    """family -> (width, ops) bool from one layer's labelled rows (``Matches``), plus
    "any" for a label of any family."""
    out = {"any": np.zeros((width, n_ops), dtype=bool)}
    sel = matches.implements
    fam = np.array([h.family for h in matches.heuristics] or [""])[matches.heuristic[sel]]
    neuron, op = matches.neuron[sel], matches.op[sel]
    out["any"][neuron, op] = True
    for f in np.unique(fam):
        mask = np.zeros((width, n_ops), dtype=bool)
        mask[neuron[fam == f], op[fam == f]] = True
        out[str(f)] = mask
    return out
