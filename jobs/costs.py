"""The planner's model-free arithmetic: the calibration record, what one unit of each
phase's work is (multiply-adds of an exact-patching row, summary prompts, grid cells and
sketch codes), and the cost of building and matching a grid's heuristics, measured on
random maps. ``jobs.calibration`` measures a model; ``jobs.plan`` scales to a request."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np

from catalog.config import ScienceConfig


@dataclass
class Calibration:
    """Seconds per unit and bytes per row of one model on one device."""

    model: str
    device: str
    n_layers: int
    d_mlp: int
    gated: bool
    seconds: dict[str, list[float]]  # by phase: [fixed seconds, seconds per unit]
    bytes: dict[str, float]  # per row, by table and tier
    rows_per_neuron_op: float  # neuron_score rows per live (neuron, op)
    live_by_layer: list[float]  # share of (neuron, op) maps that are not constant
    matching_ratio: float  # real maps' matching time over random maps' on the same grid
    calibration_s: float
    measured_at: str = ""
    # exact patching's unit is a (neuron, pair, op) row weighted by its multiply-adds:
    # the blocks after the patched layer, then the unembedding (exact_row_macs)
    block_macs: float = 0.0
    unembed_macs: float = 0.0
    # per operator, the share of the large calibration grid's prompts the model answers
    # correctly (and are not solved examples): pairs and faithfulness prompts are drawn
    # from these, so a model that answers few has few to patch. Empty: every prompt.
    correct_share: dict[str, float] = dataclasses.field(default_factory=dict)
    # the label rule's time (significance) over random maps' matching time on that grid
    significance_ratio: float = 0.0
    # the stored explanations' time (held-out fits of the labelled maps; the phase
    # "explanations") over the same; calibrations before it counted it in significance
    explanations_ratio: float = 0.0
    # the periodic spectra's time (catalog.periodic.spectra) over the same, where the config asks
    spectra_ratio: float = 0.0

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def shape_macs(cfg) -> tuple[float, float]:
    """(multiply-adds of one block, of the unembedding) for one position of a model with
    TransformerLens config ``cfg``: attention projections (grouped key/value heads
    counted) and the MLP (three matrices when gated); attention over the context, the
    norms and the softmax are left out."""
    d, heads, d_head = cfg.d_model, cfg.n_heads, cfg.d_head
    kv = getattr(cfg, "n_key_value_heads", None) or heads
    attn = 2 * d * heads * d_head + 2 * d * kv * d_head
    mlp = (3 if cfg.gated_mlp else 2) * d * cfg.d_mlp
    return float(attn + mlp), float(d * cfg.d_vocab)


def exact_row_macs(block_macs: float, unembed_macs: float, n_layers: int, layer: int) -> float:
    """Multiply-adds of one exact-patching row of ``layer``: a single-position forward of
    the blocks after it, then the unembedding."""
    return (n_layers - 1 - layer) * block_macs + unembed_macs


def exact_units(cal: Calibration, rows_per_layer: float, layers: list[int]) -> float:
    """Exact patching's work in giga multiply-adds (rows per layer times each layer's row
    cost); a calibration without shapes (an older cache) counts plain rows."""
    if not cal.unembed_macs:
        return rows_per_layer * len(layers)
    return rows_per_layer * sum(exact_row_macs(cal.block_macs, cal.unembed_macs,
                                               cal.n_layers, layer) for layer in layers) / 1e9


def summary_units(config: ScienceConfig, correct: dict[str, float] | None = None) -> float:
    """The summary's work: faithfulness prompts x seeds x operators x protocols (each
    protocol's curve and controls run every drawn prompt; component effects are per pair
    and small beside them). ``correct``: per operator, the correct prompts there are to
    draw from (None: as many as asked)."""
    drawn = sum(config.faithfulness_prompts if correct is None
                else min(config.faithfulness_prompts, correct.get(op, 0.0))
                for op in config.operators)
    return drawn * config.faithfulness_seeds * len(config.faithfulness_protocols)


def expected_correct(cal: Calibration, cells: dict[str, int]) -> dict[str, float] | None:
    """Per operator, the correct prompts a request's grid should hold: its cells times the
    calibration grid's correct share (None for an older calibration that did not count
    them). Larger operands are usually answered less often, so this errs high."""
    if not cal.correct_share:
        return None
    return {op: cal.correct_share.get(op, 0.0) * n for op, n in cells.items()}


def pairs_per_op(config: ScienceConfig, correct: dict[str, float] | None) -> dict[str, float]:
    """Per operator, the counterfactual pairs a run draws: as many as asked, at most one
    per correct prompt (none where fewer than two correct prompts exist)."""
    return {op: float(config.pairs_per_op) if correct is None
            else (min(config.pairs_per_op, correct.get(op, 0.0))
                  if sum(correct.values()) >= 2 else 0.0)
            for op in config.operators}


def grid_cells(config: ScienceConfig, limit: int | None) -> dict[str, np.ndarray]:
    """Per operator the valid cells' (a, b) of the request's grid (limit None: none)."""
    from catalog.core.arith import is_valid
    from catalog.measuring.prompts import UNLIMITED

    r = np.arange(config.operand_lo, config.operand_hi)
    a, b = (x.reshape(-1) for x in np.meshgrid(r, r, indexing="ij"))
    out = {}
    for op in config.operators:
        ok = is_valid(op, a, b, UNLIMITED if limit is None else limit)
        out[op] = ok
    return out


def sketch_codes(config: ScienceConfig, valid: np.ndarray) -> int:
    """Codes in one sketch of a grid with this valid mask (schema.sketch)."""
    from schema.sketch import GridGeometry

    return GridGeometry(config.operand_hi - config.operand_lo, valid).sketch_length


@dataclass
class GridCosts:
    """Model-free costs of the request's grid on the device: building its heuristics
    (once per checkpoint) and matching, per operator: seconds per live neuron and fixed
    seconds per (layer, operator) call."""

    heuristics_s: float
    per_neuron: dict[str, float]
    per_call: dict[str, float]


MATCH_SIZES = (32, 160)  # random maps timed; the slope is the per-neuron cost


def grid_costs(config: ScienceConfig, valid: dict[str, np.ndarray], device: str,
               with_bottom: bool) -> GridCosts:
    """Time the heuristics and the matching of the request's grid on random maps."""
    import torch

    from catalog.core.arith import apply_op
    from catalog.labels.families import chosen_on
    from catalog.labels.heuristics import Cells, partitions_for
    from catalog.labels.matching import score_partitions

    r = np.arange(config.operand_lo, config.operand_hi)
    a, b = (x.reshape(-1) for x in np.meshgrid(r, r, indexing="ij"))
    rng = np.random.default_rng(0)
    build, per_neuron, per_call = 0.0, {}, {}
    for o, op in enumerate(config.operators):
        ok = valid[op]
        cells = Cells(op, a[ok], b[ok], apply_op(op, a[ok], b[ok]), config.operand_lo,
                      config.operand_hi)
        t = time.perf_counter()
        parts = partitions_for(cells, config)
        build += time.perf_counter() - t
        took = []
        for n in MATCH_SIZES:
            k = torch.as_tensor(rng.standard_normal((n, int(ok.sum()))).astype(np.float32),
                                device=device)
            kv = torch.as_tensor(rng.standard_normal(k.shape).astype(np.float32),
                                 device=device)
            t = time.perf_counter()
            score_partitions(k, kv, parts, config.score_floor, with_bottom,
                             config.pattern_top_k, cells=cells, op=o)
            for fam in chosen_on(config.families, op):
                if fam.score is not None:
                    fam.score(kv.cpu(), cells.result, config, o)
            took.append(time.perf_counter() - t)
        (n1, n2), (t1, t2) = MATCH_SIZES, took
        per_neuron[op] = max((t2 - t1) / (n2 - n1), t2 / n2 / 4)
        per_call[op] = max(t1 - n1 * per_neuron[op], 0.0)
    return GridCosts(build, per_neuron, per_call)
