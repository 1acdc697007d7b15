"""Whether a neuron's label holds for a prompt: its heuristic's set AND its side.

Algorithm 1 scores a neuron's map twice: the heuristic's cells among its top-k values,
and (where the config scores the bottom) among its bottom-k values; a label keeps the
side that scored (``Matches.bottom``). So a label says "this neuron is HIGH on S_H" or
"this neuron is LOW on S_H", and the two are different claims: a neuron labelled
"result in [0, 30)" on its top side and "result in [30, 60)" on its bottom side is one
that pushes small results and holds back middle ones; it does not "hold" for every
result below 60.

A label holds for a prompt when the prompt is in S_H and the neuron's value on the map
the label was scored on is on the label's side of that map's typical value (its mean
over the operator's grid): the activation against ``mean_act`` for operand labels (the
K map), the activation times the lens value of the prompt's answer against ``mean_kv``
for result labels (the KV map, the neuron's direct push on the answer). Where the
typical value is not known (rows written before migration 0034 have no ``mean_kv``),
the side is not checked: only the set is.

Sets of one neuron's labels that are disjoint can never hold together; a heuristic and
its complement on the grid ON THE SAME SIDE ("result even" high and "result odd" high)
is a neuron high almost everywhere, whose larger label comes from its base rate:
``complement_pairs`` names such pairs so a display can say it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from catalog.labels.heuristics import Heuristic


@dataclass(frozen=True)
class Label:
    """A heuristic a neuron implements for one operator, with the side of its map that
    scored: ``bottom`` False means high on S_H, True means low on S_H."""

    heuristic: Heuristic
    bottom: bool = False

    @property
    def side(self) -> str:
        return "low" if self.bottom else "high"

    @property
    def text(self) -> str:
        """The heuristic's label with its side, e.g. "result in [30, 60) (low)"."""
        return f"{self.heuristic.label} ({self.side})"

    @property
    def key(self) -> str:
        return f"{self.heuristic.key}:{self.side}"

    @property
    def family(self) -> str:
        return self.heuristic.family

    @property
    def direct(self) -> bool:
        return self.heuristic.direct


def as_label(x: Label | Heuristic) -> Label:
    """A ``Label``; a bare heuristic is taken as a top-side label."""
    return x if isinstance(x, Label) else Label(x)


def as_labels(labels: Mapping[tuple[int, int], Sequence[Label | Heuristic]] | None
              ) -> dict[tuple[int, int], list[Label]]:
    """(layer, neuron) -> its labels, each a ``Label`` (neurons without one dropped)."""
    return {key: [as_label(x) for x in xs] for key, xs in (labels or {}).items() if xs}


# a label's kind: which map it was scored on and its side, as bits, so that "some label of
# this neuron whose set holds here is on its side here" is one AND of two bit masks
K_HIGH, K_LOW, KV_HIGH, KV_LOW = 1, 2, 4, 8


def kind(label: Label) -> int:
    """The label's map (K for operand labels, KV for result labels) and side, as a bit."""
    if label.direct:
        return KV_LOW if label.bottom else KV_HIGH
    return K_LOW if label.bottom else K_HIGH


def on_side(bottom: bool | np.ndarray, value: np.ndarray | float,
            typical: np.ndarray | float) -> np.ndarray:
    """Whether ``value`` is on the label's side of ``typical``: above it for a top-side
    label, below it for a bottom-side one (a NaN typical: not checked, True)."""
    value = np.asarray(value, dtype=np.float64)
    typical = np.asarray(typical, dtype=np.float64)
    side = np.where(bottom, value < typical, value > typical)
    return np.where(np.isnan(typical), True, side)


def sides(activation: np.ndarray, answer_lens: np.ndarray, mean_act: np.ndarray,
          mean_kv: np.ndarray) -> np.ndarray:
    """Per neuron (any shape, the four arrays alike), the bits of the kinds whose side
    condition its value here meets: K_HIGH where the activation is above its mean, K_LOW
    below, KV_HIGH / KV_LOW for activation x the answer's lens value against the mean KV
    value (a NaN mean: both sides met, the side is not checked)."""
    kv = np.asarray(activation, dtype=np.float64) * answer_lens
    out = np.zeros(np.shape(activation), dtype=np.int8)
    for bit, bottom, value, ref in ((K_HIGH, False, activation, mean_act),
                                    (K_LOW, True, activation, mean_act),
                                    (KV_HIGH, False, kv, mean_kv), (KV_LOW, True, kv, mean_kv)):
        out |= np.where(on_side(bottom, value, ref), bit, 0).astype(np.int8)
    return out


def member_kinds(labels: Mapping[tuple[int, int], Sequence[Label]], shape: tuple[int, int],
                 a: np.ndarray, b: np.ndarray, result: np.ndarray) -> np.ndarray:
    """(P, n_layers, d_mlp) int8: per prompt and neuron, the OR of the kinds of its labels
    whose set contains the prompt (0: none does, or no label)."""
    out = np.zeros((len(a), *shape), dtype=np.int8)
    cache: dict[str, np.ndarray] = {}
    for (layer, n), xs in labels.items():
        for x in xs:
            key = x.heuristic.key
            if key not in cache:
                cache[key] = np.asarray(x.heuristic.contains(a, b, result), dtype=bool)
            out[cache[key], layer, n] |= np.int8(kind(x))
    return out


def holds(label: Label, a: np.ndarray, b: np.ndarray, result: np.ndarray,
          activation: np.ndarray, answer_lens: np.ndarray | float,
          typical: float | None, typical_kv: float | None) -> np.ndarray:
    """Per prompt (arrays over prompts): the prompt is in the label's set and the neuron's
    map value there (the activation; times the answer's lens value for a result label) is
    on the label's side of the map's typical value (None: side not checked)."""
    member = np.asarray(label.heuristic.contains(np.asarray(a), np.asarray(b),
                                                 np.asarray(result)), dtype=bool)
    bits = sides(np.asarray(activation, dtype=np.float64), np.asarray(answer_lens),
                 np.asarray(np.nan if typical is None else typical, dtype=np.float64),
                 np.asarray(np.nan if typical_kv is None else typical_kv, dtype=np.float64))
    return member & ((bits & kind(label)) != 0)


def typical_arrays(shape: tuple[int, int], typical: Mapping[tuple[int, int], float] | None,
                   typical_kv: Mapping[tuple[int, int], float] | None
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(mean activation, mean KV value) as (n_layers, d_mlp) arrays, NaN where unknown."""
    out = []
    for m in (typical, typical_kv):
        arr = np.full(shape, np.nan)
        for (layer, n), v in (m or {}).items():
            if v is not None:
                arr[layer, n] = v
        out.append(arr)
    return out[0], out[1]


def complement_pairs(labels: Iterable[Label], a: np.ndarray, b: np.ndarray,
                     result: np.ndarray) -> list[tuple[Label, Label]]:
    """Pairs of ``labels`` (one neuron's, one operator's) on the same side whose sets
    split the grid's cells (``a``, ``b``, ``result``: every valid cell) into a set and
    its complement."""
    labels = list(labels)
    sets = [np.asarray(x.heuristic.contains(a, b, result), dtype=bool) for x in labels]
    out = []
    for i in range(len(labels)):
        for j in range(i + 1, len(labels)):
            if labels[i].bottom == labels[j].bottom and not (sets[i] & sets[j]).any() \
                    and (sets[i] | sets[j]).all():
                out.append((labels[i], labels[j]))
    return out


def labels_from_rows(rows) -> dict[tuple[int, int], list[Label]]:
    """(layer, neuron) -> labels from stored label rows (layer, neuron, family, target,
    params[, bottom]), as ``schema.explanations.labels_at`` returns them (a row without
    its side is a top-side label)."""
    out: dict[tuple[int, int], list[Label]] = {}
    for row in rows:
        layer, neuron, family, target, params = row[:5]
        bottom = bool(row[5]) if len(row) > 5 else False
        out.setdefault((int(layer), int(neuron)), []).append(
            Label(Heuristic(family, target, tuple(params)), bottom))
    return out


def labels_of(matches: Mapping, o: int) -> dict[tuple[int, int], list[Label]]:
    """(layer, neuron) -> the labels for operator index ``o`` in each layer's ``Matches``
    (``catalog.labels.matches``), each with the side that scored."""
    out: dict[tuple[int, int], list[Label]] = {}
    for layer, m in matches.items():
        for i in np.nonzero((m.op == o) & m.implements)[0]:
            out.setdefault((int(layer), int(m.neuron[i])), []).append(
                Label(m.row_heuristic(int(i)), bool(m.bottom[i])))
    return out


@dataclass
class Means:
    """A layer's (d_mlp, op) means of the K and KV maps (None: not known)."""

    mean_act: np.ndarray | None
    mean_kv: np.ndarray | None


def typical_of(layers: Mapping, o: int) -> tuple[dict, dict]:
    """({(layer, neuron): mean activation}, {(layer, neuron): mean KV value}) of operator
    index ``o`` from per-layer objects with ``mean_act`` and ``mean_kv`` (d_mlp, op) arrays
    (``LayerResult``, ``LayerDigest``; a missing or NaN value is left out)."""
    act: dict[tuple[int, int], float] = {}
    kv: dict[tuple[int, int], float] = {}
    for layer, r in layers.items():
        for name, out in (("mean_act", act), ("mean_kv", kv)):
            values = getattr(r, name, None)
            if values is None:
                continue
            col = np.asarray(values[:, o], dtype=np.float64)
            for n in np.nonzero(np.isfinite(col))[0]:
                out[(int(layer), int(n))] = float(col[n])
    return act, kv


def top_set_of(rank: Mapping[tuple[int, int], int], shape: tuple[int, int], per_layer: int
               ) -> np.ndarray | None:
    """(n_layers, d_mlp) the neurons ranked below ``per_layer`` in their layer (the
    paper's top set, from the catalog's ranks); None when no rank is known."""
    if not rank:
        return None
    out = np.zeros(shape, dtype=bool)
    for (layer, n), r in rank.items():
        out[layer, n] = r < per_layer
    return out


def catalog_context(got, model, config) -> dict:
    """explain()'s ``typical``, ``typical_kv`` and the paper's ``top_set`` from what a
    catalog holds of a checkpoint for one operator (an object with ``typical``,
    ``typical_kv`` and ``rank`` mappings: ``schema.explanations.CatalogLabels``; None:
    nothing known)."""
    if got is None:
        return {}
    from catalog.circuits.paper import circuit_sizes

    shape = (model.cfg.n_layers, int(model.cfg.d_mlp or 0))
    per_layer = circuit_sizes(shape[1], (config.top_set_fraction,))[0]
    return {"typical": got.typical, "typical_kv": got.typical_kv,
            "top_set": top_set_of(got.rank, shape, per_layer)}


def labels_from_result(result, op: str) -> dict[tuple[int, int], list[Label]]:
    """(layer, neuron) -> the labels for ``op`` in a ``CheckpointResult`` measured with its
    layers kept (``catalog.measure``)."""
    return labels_of({layer: lr.matches for layer, lr in result.layers.items()},
                     list(result.config.operators).index(op))
