"""One layer's measurements as the writer takes them: plain arrays and the labels'
records (``LayerRows``), built by ``jobs.store_results.layer_rows``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from schema.sketch import (
    GridGeometry,
)


class HeuristicLike(Protocol):
    """What the writer reads of a heuristic (``catalog.labels.heuristics.Heuristic`` is one)."""

    @property
    def key(self) -> str: ...
    @property
    def family(self) -> str: ...
    @property
    def target(self) -> str: ...
    @property
    def params(self) -> tuple: ...
    @property
    def label(self) -> str: ...


class MatchArrays(Protocol):
    """One layer's heuristic scores as parallel arrays (``catalog.labels.matching.Matches`` is
    one): neuron, op (index into ``LayerRows.ops``), heuristic (index into
    ``heuristics``), score, bottom."""

    neuron: np.ndarray
    op: np.ndarray
    heuristic: np.ndarray
    score: np.ndarray
    bottom: np.ndarray
    heuristics: Sequence[HeuristicLike]
    base_rate: np.ndarray  # |S_H| / cells per row (NaN: not defined)
    p_value: np.ndarray  # exact p-value per row (NaN: not defined)
    implements: np.ndarray  # the label rule's verdict per row
    testable: np.ndarray  # the grid can test the row's heuristic at the rule's level


@dataclass
class LayerRows:
    """One layer's measurements as plain arrays.

    ops: operator symbols, the order of every ``op`` axis.
    stats: NEURON_OP_COLS -> (d_mlp, n_ops) arrays (NaN = not measured).
    op_accuracy: (n_ops,) the model's accuracy on each operator.
    grids: one (d_mlp, n_cells_of_op) float32 array per operator (valid cells in the
        grid layout's order).
    layouts: per operator, the grid's geometry (side and valid mask), which sketches need.
    full_top: grids stored in full per operator: those of rank < full_top; None: all
        (schema.sketch; every other grid is stored as a sketch).
    lens_numbers: (d_mlp, n_numbers); lens top/bottom tokens (strings) and values (d_mlp, k).
    matches: the layer's heuristic scores, one entry per stored score.
    """

    layer: int
    ops: list[str]
    stats: dict[str, np.ndarray]
    op_accuracy: np.ndarray
    grids: list[np.ndarray]
    lens_numbers: np.ndarray
    lens_top_tokens: list[list[str]]
    lens_top_values: np.ndarray
    lens_bottom_tokens: list[list[str]]
    lens_bottom_values: np.ndarray
    matches: MatchArrays
    patching: dict | None = None  # op -> pairs used, neurons patched exactly, Spearman
    label_control: dict | None = None  # op -> labels on relabelled-value maps (0021)
    # which label is shown: "specific" (the smallest labelled set, since 0.6.0) or "score"
    # (the highest-scoring label: the paper rule's, whose labels are scores alone)
    best_label: str = "specific"
    layouts: list[GridGeometry] | None = None
    full_top: int | None = None

    @property
    def d_mlp(self) -> int:
        return self.stats["rank"].shape[0]
