"""What a catalog request will cost, before it is queued: ``ncat plan``.

The estimate is a short measured run scaled by counted work, per phase:

1. **Calibration** (cached per model, device and the config choices that change cost
   per unit: template, shots, operators, dtype, families, ...): the model is catalogued
   for real, twice, into scratch databases: on operands [lo, lo + 20), then on the
   request's grid up to [lo, lo + 60) (which has sketches), each with few pairs, exact
   patching of one chunk of neurons, few faithfulness prompts and two layers. Every
   phase is timed and fitted as fixed seconds plus seconds per unit through the two
   runs; every table is measured in the larger (``pg_total_relation_size`` less the
   empty tables').
2. **Heuristics and matching** are measured apart, on the requested grid itself: they
   cost the same whatever the model, so the grid's heuristics are built and random
   maps (32, then 160 per operator: the slope is the cost per neuron) scored on the
   device.
3. **Scaling**: each phase's seconds per unit of work times the request's units:

   ============== ===================================================================
   phase          unit of work
   ============== ===================================================================
   grid pass      prompts (one pass, or one more per layer over the activation budget)
   heuristics     the request's grid (built once per checkpoint)
   lens           layers
   attribution    pairs x operators (one backward pass per operator and checkpoint)
   exact patching neurons patched x pairs x operators, per layer
   matching       live neurons x operators, per layer (constant neurons are skipped)
   components     pairs x operators (every head and MLP layer patched per pair)
   summary        faithfulness prompts x seeds x operators x protocols, plus the mean
                  activations' passes over their populations
   writing        bytes written
   ============== ===================================================================

   Storage per table: bytes per row (per neuron-operator, per neuron, per score row)
   from the calibration catalog; grids by tier: a full grid's bytes per cell and a
   sketch's bytes per code, times the request's cells and sketch codes.

The estimate is for one checkpoint; a request's total is that times its checkpoints
(every checkpoint of a model has the same shapes). Tested against measured runs of the
built-in model and the Pythia-14m shape: time within 2x, storage within 10%.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from catalog.config import CATALOG_VERSION, ExecutionConfig, ScienceConfig

CALIBRATION_SPAN = 60  # at most operands [lo, lo + 60): 2 x 2 sketch blocks
CALIBRATION_PAIRS = 32
CALIBRATION_FAITHFULNESS = 80
TABLES = ("neuron_op", "neuron_grid", "neuron_lens", "neuron_score")
# the config fields that change a unit's cost (the rest change how many units there are)
# bumped when a calibration's meaning changes, so older cached ones are measured again
PLANNER_VERSION = 3  # 3: grids coded with 2-D prediction (fewer bytes per cell)
# the config fields that decide the grid-only costs (heuristics, matching)
GRID_FIELDS = ("operand_lo", "operand_hi", "operators", "families", "heuristic_variant",
               "score_floor", "pattern_top_k", "multi_result_top", "dedupe_heuristics")
COST_FIELDS = ("template", "few_shot", "shots", "shot_separator", "operators", "dtype",
               "families", "heuristic_variant", "score_bottom", "lens_top_k",
               "scores_per_family", "label_rule", "rank_statistic", "full_grids",
               "significance_level", "match_threshold", "score_floor", "null_strata",
               "dedupe_heuristics")


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


@dataclass
class Phase:
    name: str
    units: float
    unit: str
    seconds: float


@dataclass
class Plan:
    model: str
    device: str
    checkpoints: int
    layers: int
    d_mlp: int
    prompts: int
    phases: list[Phase]
    storage: dict[str, float]  # bytes per checkpoint, by table
    calibration: Calibration
    notes: list[str] = field(default_factory=list)

    @property
    def seconds_per_checkpoint(self) -> float:
        return sum(p.seconds for p in self.phases)

    @property
    def bytes_per_checkpoint(self) -> float:
        return sum(self.storage.values())

    def render(self) -> str:
        """The estimate as a table for the terminal."""
        lines = [f"Estimate for {self.model} on {self.device}:",
                 f"{self.checkpoints} checkpoint(s) x {self.layers} layer(s) x {self.d_mlp} "
                 f"neurons, {self.prompts:,} prompts per checkpoint",
                 "", f"{'phase':<16}{'work per checkpoint':>34}{'time':>12}"]
        for p in self.phases:
            lines.append(f"{p.name:<16}{f'{p.units:,.0f} {p.unit}':>34}"
                         f"{_duration(p.seconds):>12}")
        lines.append(f"{'per checkpoint':<16}{'':>34}{_duration(self.seconds_per_checkpoint):>12}")
        lines += ["", f"{'table':<16}{'per checkpoint':>16}{'all checkpoints':>18}"]
        for table, b in self.storage.items():
            lines.append(f"{table:<16}{_size(b):>16}{_size(b * self.checkpoints):>18}")
        lines.append(f"{'total':<16}{_size(self.bytes_per_checkpoint):>16}"
                     f"{_size(self.bytes_per_checkpoint * self.checkpoints):>18}")
        lines += ["", f"Total: {_duration(self.seconds_per_checkpoint * self.checkpoints)} "
                      f"of one worker, {_size(self.bytes_per_checkpoint * self.checkpoints)}."]
        c = self.calibration
        lines.append(f"Calibrated {c.measured_at} on {c.device} in {c.calibration_s:.0f} s "
                     "(cached; --recalibrate measures again).")
        lines += self.notes
        return "\n".join(lines)


def _duration(s: float) -> str:
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    if s < 172800:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


def _size(b: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if b < 1000 or unit == "TB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1000
    return f"{b:.1f} TB"


# ------------------------------------------------------------------ work counts


def grid_cells(config: ScienceConfig, limit: int | None) -> dict[str, np.ndarray]:
    """Per operator the valid cells' (a, b) of the request's grid (limit None: none)."""
    from catalog.arith import is_valid
    from catalog.prompts import UNLIMITED

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


# ------------------------------------------------------------------ calibration


def cost_key(model: str, device: str, config: ScienceConfig) -> str:
    d = config.as_dict()
    return json.dumps({"model": model, "device": device, "catalog": CATALOG_VERSION,
                       "planner": PLANNER_VERSION, "runs": calibration_runs(config),
                       **{k: d[k] for k in COST_FIELDS}}, sort_keys=True)


def _cache_path(home: Path) -> Path:
    return home / "plan" / "calibrations.json"


def _cached(home: Path, key: str) -> dict | None:
    path = _cache_path(home)
    if not path.exists():
        return None
    return json.loads(path.read_text()).get(key)


def _store(home: Path, key: str, entry: dict) -> None:
    path = _cache_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    have = json.loads(path.read_text()) if path.exists() else {}
    have[key] = entry
    tmp = path.with_suffix(f".{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(json.dumps(have, indent=1))
    tmp.replace(path)


def cached_calibration(home: Path, key: str) -> Calibration | None:
    entry = _cached(home, key)
    return Calibration(**entry) if entry else None


def _store_calibration(home: Path, key: str, cal: Calibration) -> None:
    _store(home, key, cal.as_dict())


SMALL_RUN = (20, 8, 20)  # (operand span, pairs, faithfulness prompts)


def calibration_runs(config: ScienceConfig) -> list[tuple[int, int, int]]:
    """The two calibration runs: a small one, and one on the request's grid up to
    CALIBRATION_SPAN operands a side (bytes per row are taken from it)."""
    span = max(min(config.operand_hi - config.operand_lo, CALIBRATION_SPAN), SMALL_RUN[0] + 10)
    return [SMALL_RUN, (span, CALIBRATION_PAIRS, CALIBRATION_FAITHFULNESS)]


def calibration_config(config: ScienceConfig, d_mlp: int, chunk: int,
                       span: int = CALIBRATION_SPAN,
                       pairs: int = CALIBRATION_PAIRS,
                       faithfulness: int = CALIBRATION_FAITHFULNESS) -> ScienceConfig:
    """The request's config on a small grid: the same choices, fewer units."""
    changes: dict = {"operand_hi": config.operand_lo + span,
                     "pairs_per_op": min(config.pairs_per_op, pairs),
                     "faithfulness_prompts": min(config.faithfulness_prompts, faithfulness),
                     "full_grids": config.full_grids}
    if "exact" in config.patching:  # one chunk of neurons, picked by attribution
        changes.update(patching=("exact", "attribution"),
                       exact=f"top:{min(d_mlp, chunk)}")
    return dataclasses.replace(config, **changes)


def calibrate(url_server: str, lm, config: ScienceConfig, execution: ExecutionConfig,
              progress=None) -> Calibration:
    """Catalog ``lm`` twice on small configs (calibration_runs) into scratch databases
    on the server of ``url_server`` (dropped after): each phase's cost is fitted as
    fixed seconds plus seconds per unit through the two runs; bytes per row come from
    the larger run."""
    t_all = time.perf_counter()
    cfg = lm.model.cfg
    block_macs, unembed_macs = shape_macs(cfg)
    _warm_up(lm, config, execution)
    runs = [_calibration_run(url_server, lm, calibration_config(
        config, cfg.d_mlp, execution.patch_chunk, span, pairs, faith), execution, progress)
        for span, pairs, faith in calibration_runs(config)]
    large = runs[-1]
    live = live_shares(lm, config, execution)
    fitted = {}
    for phase in large["units"]:
        (u1, t1), (u2, t2) = ((r["units"][phase], r["seconds"][phase]) for r in runs)
        if phase in PROPORTIONAL or not (u2 > u1 and t2 > t1):
            fitted[phase] = [0.0, t2 / max(u2, 1)]
            continue
        per = (t2 - t1) / (u2 - u1)
        fitted[phase] = [max(t2 - per * u2, 0.0), per]  # [fixed, per unit]
    return Calibration(model=lm.info.name, device=execution.device, n_layers=cfg.n_layers,
                       d_mlp=cfg.d_mlp, gated=bool(cfg.gated_mlp), seconds=fitted,
                       bytes=large["bytes"], rows_per_neuron_op=large["rows_per_neuron_op"],
                       live_by_layer=live,
                       matching_ratio=large["matching_ratio"],
                       calibration_s=round(time.perf_counter() - t_all, 1),
                       measured_at=time.strftime("%Y-%m-%d %H:%M"),
                       block_macs=block_macs, unembed_macs=unembed_macs)


# phases whose cost is taken as proportional to their units (the larger run's ratio):
# their units hardly differ between the two runs, or their fixed part is noise
PROPORTIONAL = ("lens", "write")


def _warm_up(lm, config: ScienceConfig, execution: ExecutionConfig) -> None:
    """One small run first, untimed: the first forward passes and allocations of a
    process are slower than the rest and would inflate the small run's costs."""
    from catalog.run import CheckpointRun

    tiny = dataclasses.replace(config, operand_hi=config.operand_lo + 8, pairs_per_op=4,
                               faithfulness_prompts=4)
    layer = lm.model.cfg.n_layers - 1
    run = CheckpointRun(lm.model, lm.tokenizer, tiny, execution, [layer]).prepare()
    run.run_layer(layer)


def live_shares(lm, config: ScienceConfig, execution: ExecutionConfig) -> list[float]:
    """Per layer, the share of (neuron, operator) maps that are not constant (constant
    ones get no scores and are not matched), on the small calibration grid: one pass per
    layer, so memory stays one layer's activations."""
    from catalog.grids import run_grid
    from catalog.prompts import build_prompts
    from catalog.run import constant_maps
    from catalog.tokens import detect_number_tokens

    small = dataclasses.replace(config, operand_hi=config.operand_lo + SMALL_RUN[0])
    numbers = detect_number_tokens(lm.tokenizer,
                                   prepend_bos=lm.model.cfg.default_prepend_bos)
    table = build_prompts(lm.tokenizer, numbers, small)
    out = []
    for layer in range(lm.model.cfg.n_layers):
        acts = run_grid(lm.model, table, [layer], batch_size=execution.batch_size)[layer]
        out.append(float(np.mean([(~constant_maps(acts[table.op_index(op)].T)).mean()
                                  for op in small.operators])))
    return out


def summary_units(config: ScienceConfig) -> int:
    """The summary's work: faithfulness prompts x seeds x operators x protocols (each
    protocol's curve and controls run every drawn prompt; component effects are per pair
    and small beside them)."""
    return (config.faithfulness_prompts * config.faithfulness_seeds * len(config.operators)
            * len(config.faithfulness_protocols))


def _calibration_run(url_server: str, lm, cal: ScienceConfig, execution: ExecutionConfig,
                     progress=None) -> dict:
    """One calibration catalog: per phase (units, seconds), bytes per row."""
    from catalog import ablation
    from catalog.heuristics import partitions_for
    from catalog.run import CheckpointRun
    from jobs.store_results import layer_rows, register, summary_dict, write_layouts
    from schema import store
    from schema.engine import migrate
    from schema.sketch import GridGeometry

    say = progress or (lambda msg: None)
    n_layers = lm.model.cfg.n_layers
    block, unembed = shape_macs(lm.model.cfg)

    def row_macs(layer: int) -> float:
        return exact_row_macs(block, unembed, n_layers, layer)
    layers = sorted({max(n_layers - 2, 0), n_layers - 1})  # late layers: live neurons
    url = scratch_url(url_server, f"ncat_plan_{uuid.uuid4().hex[:10]}")
    migrate(url)
    try:
        with store.connect(url, autocommit=True) as conn:
            base = {t: store.table_bytes(conn, t) for t in TABLES}
            ids = register(conn, lm, cal)
            say(f"calibrating: operands [{cal.operand_lo}, {cal.operand_hi}), grid pass")
            t = time.perf_counter()
            run = CheckpointRun(lm.model, lm.tokenizer, cal, execution, layers).prepare()
            grid_s = time.perf_counter() - t
            # prepare also built the heuristics, whose cost follows the grid, not the model
            # (measured on the request's grid instead): take it out
            t = time.perf_counter()
            for op in cal.operators:
                partitions_for(run.cells[op], cal)
            grid_s = max(grid_s - (time.perf_counter() - t), 0.0)
            write_layouts(conn, run, ids)
            phases: dict[str, float] = {}
            write_s, effects, matches, attribution, exact_work = 0.0, {}, {}, {}, 0.0
            used = {op: len(run.pairs[op][0]) for op in cal.operators}  # pairs used
            before: dict[str, int] = {}
            for i, layer in enumerate(layers):
                if i == len(layers) - 1:  # bytes per row are what the last layer adds
                    conn.execute("VACUUM ANALYZE")  # as a catalog is measured (free space map)
                    before = {t: store.table_bytes(conn, t) for t in TABLES}
                    rows_before = _counts(conn)
                say(f"calibrating: layer {layer}")
                result = run.run_layer(layer)
                for k, v in result.seconds.items():
                    phases[k] = phases.get(k, 0.0) + v
                exact_work += row_macs(layer) * sum(
                    int(result.is_exact[:, o].sum()) * used[op]
                    for o, op in enumerate(cal.operators)) / 1e9
                t = time.perf_counter()
                store.write_layer(conn, model_id=ids.model_id, checkpoint_id=ids.checkpoint_id,
                                  config_id=ids.config_id,
                                  rows=layer_rows(result, run, lm.tokenizer))
                write_s += time.perf_counter() - t
                effects[layer] = result.effect(cal.rank_sign)
                matches[layer] = result.matches
                attribution[layer] = result.attribution_score()
                run.release(layer)
            say("calibrating: summary")
            t = time.perf_counter()
            summ = run.summarize(effects, matches, attribution=attribution)
            summary_s = time.perf_counter() - t
            # the summary's mean activations are passes over their populations: timed apart
            t = time.perf_counter()
            mean_units = 0
            for population, context, cap in cal.mean_passes():
                pop = ablation.mean_population(lm.tokenizer, run.table, cal, population, cap,
                                               cal.seed)
                ablation.position_means(lm.model, pop, context, execution.batch_size)
                mean_units += len(pop)
            means_s = time.perf_counter() - t
            # component effects scale with the pairs, not the faithfulness prompts
            comp_s = summ.seconds.get("component effects and residual lens", 0.0)
            summary_s = max(summary_s - means_s - comp_s, 0.0)
            store.write_summary(conn, checkpoint_id=ids.checkpoint_id, config_id=ids.config_id,
                                summary=summary_dict(summ))
            conn.execute("VACUUM ANALYZE")
            after = {t: store.table_bytes(conn, t) for t in TABLES}
            rows_after = _counts(conn)
            if len(layers) == 1:  # one layer: its bytes, less the empty tables'
                before, rows_before = base, {t: 0 for t in TABLES}
            sizes = {t: after[t] - before[t] for t in TABLES}
            n_op = rows_after["neuron_op"] - rows_before["neuron_op"]
            n_score = rows_after["neuron_score"] - rows_before["neuron_score"]
            live_last = store.scalar(conn.execute(
                "SELECT count(*) FILTER (WHERE NOT coalesce(constant, false)) FROM neuron_op "
                "WHERE layer = %s", (layers[-1],)))
            live_all = store.scalar(conn.execute(
                "SELECT count(*) FILTER (WHERE NOT coalesce(constant, false)) FROM neuron_op"))
            # grid payloads by tier, against the cells (full) or codes (sketch) they hold
            geometry = {g.op: GridGeometry(g.side, g.valid) for g in run.grid_layouts()}
            payload = {False: 0.0, True: 0.0}
            held = {False: 0, True: 0}
            for op, sketch, n, q in conn.execute(
                    "SELECT g.op, g.sketch, count(*), sum(pg_column_size(g.q)) FROM neuron_grid g "
                    "JOIN neuron_op n USING (model_id, checkpoint_id, config_id, layer, neuron, "
                    "op) WHERE g.layer = %s AND NOT coalesce(n.constant, false) "
                    "GROUP BY g.op, g.sketch", (layers[-1],)).fetchall():
                payload[sketch] += float(q)
                held[sketch] += int(n) * (geometry[op].sketch_length if sketch
                                          else geometry[op].n_cells)
    finally:
        store.drop_database(url)
    ops = len(cal.operators)
    n_pairs = sum(used.values())
    total_bytes = sum(sizes.values())
    # real maps against random ones on this grid: random maps on the request's grid,
    # times this ratio, are what matching will cost there
    live_maps = max(float(live_all), 1.0)  # live (neuron, op) maps scored
    random = grid_costs(cal, {g.op: g.valid for g in run.grid_layouts()}, execution.device,
                        run._with_bottom())
    random_s = sum(random.per_neuron[op] * live_maps / ops for op in cal.operators) \
        + len(layers) * sum(random.per_call.values())
    return {
        "matching_ratio": phases.get("matching", 0.0) / max(random_s, 1e-9),
        "units": {"grid": len(run.table), "lens": len(layers), "attribution": n_pairs,
                  "exact": exact_work, "summary": summary_units(cal),
                  "means": mean_units, "write": total_bytes,
                  "components": n_pairs if cal.component_positions else 0},
        "seconds": {"grid": grid_s, "lens": phases.get("lens", 0.0),
                    "attribution": phases.get("attribution", 0.0),
                    "exact": phases.get("exact", 0.0), "summary": summary_s,
                    "means": means_s, "write": write_s, "components": comp_s},
        "bytes": {
            "neuron_op": sizes["neuron_op"] / n_op,
            "neuron_lens": sizes["neuron_lens"] / (n_op / ops),
            "neuron_score": sizes["neuron_score"] / max(n_score, 1),
            # a constant grid's payload is a few bytes: counted in the row's overhead
            "grid_row": (sizes["neuron_grid"] - payload[False] - payload[True]) / n_op,
            "grid_full_cell": payload[False] / max(held[False], 1),
            "grid_sketch_code": payload[True] / max(held[True], 1),
        },
        "rows_per_neuron_op": n_score / max(live_last, 1),
    }


def _counts(conn) -> dict[str, int]:
    return {t: int(conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]) for t in TABLES}


@dataclass
class GridCosts:
    """Model-free costs of the request's grid on the device: building its heuristics
    (once per checkpoint) and matching, per operator: seconds per live neuron and fixed
    seconds per (layer, operator) call."""

    heuristics_s: float
    per_neuron: dict[str, float]
    per_call: dict[str, float]


MATCH_SIZES = (32, 160)  # random maps timed; the slope is the per-neuron cost


def scratch_url(url: str, database: str) -> str:
    """``url`` with another database name; the host, port and query (an embedded
    server's unix-socket ``?host=/path``) stay as they are."""
    from sqlalchemy.engine import make_url

    return make_url(url).set(database=database).render_as_string(hide_password=False)


def grid_costs(config: ScienceConfig, valid: dict[str, np.ndarray], device: str,
               with_bottom: bool) -> GridCosts:
    """Time the heuristics and the matching of the request's grid on random maps."""
    import torch

    from catalog.arith import apply_op
    from catalog.heuristics import Cells, partitions_for
    from catalog.matching import multi_result_matches, score_partitions

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
            if op == "/" and "multi_result" in config.families:
                multi_result_matches(kv.cpu(), cells.result, top=config.multi_result_top,
                                     floor=config.score_floor, op=o)
            took.append(time.perf_counter() - t)
        (n1, n2), (t1, t2) = MATCH_SIZES, took
        per_neuron[op] = max((t2 - t1) / (n2 - n1), t2 / n2 / 4)
        per_call[op] = max(t1 - n1 * per_neuron[op], 0.0)
    return GridCosts(build, per_neuron, per_call)


# ------------------------------------------------------------------ the estimate


def estimate(cal: Calibration, config: ScienceConfig, *, n_checkpoints: int,
             layers: list[int] | None, limit: int | None, costs: GridCosts,
             execution: ExecutionConfig | None = None) -> Plan:
    """Scale a calibration to a request (``limit``: the single-token limit, None for a
    digit-level tokenizer)."""
    execution = execution or ExecutionConfig(device=cal.device)
    todo = list(range(cal.n_layers)) if layers is None else sorted(set(layers))
    n_layers, d_mlp = len(todo), cal.d_mlp
    valid = grid_cells(config, limit)
    cells = {op: int(v.sum()) for op, v in valid.items()}
    prompts = sum(cells.values())
    ops = len(config.operators)
    def s(phase: str, units: float) -> float:
        fixed, per = cal.seconds.get(phase, (0.0, 0.0))
        return fixed + per * units if units else 0.0

    fits = prompts * n_layers * d_mlp * 4 <= execution.activation_budget
    passes = 1 if fits else 1 + n_layers
    phases = [Phase("grid pass", prompts * passes, "prompts", passes * s("grid", prompts)),
              Phase("heuristics", ops, "operators", costs.heuristics_s),
              Phase("lens", n_layers, "layers", s("lens", n_layers))]
    if "attribution" in config.patching:
        units = config.pairs_per_op * ops
        phases.append(Phase("attribution", units, "pairs x ops", s("attribution", units)))
    if "exact" in config.patching:
        top = config.exact_top()
        per_layer = d_mlp if top is None else min(top, d_mlp)
        rows = per_layer * config.pairs_per_op * ops
        units = exact_units(cal, rows, todo)
        phases.append(Phase("exact patching", units, "G multiply-adds" if cal.unembed_macs
                            else "neurons x pairs x ops", s("exact", units)))
    live_share = [cal.live_by_layer[layer] for layer in todo]
    live = sum(live_share) * d_mlp  # live neurons x layers (averaged over operators)
    phases.append(Phase("matching", live * ops, "live neurons x ops", cal.matching_ratio * (
        live * sum(costs.per_neuron.values()) + n_layers * sum(costs.per_call.values()))))
    if config.component_positions:  # every head and MLP layer patched per pair
        units = config.pairs_per_op * ops
        phases.append(Phase("component effects", units, "pairs x ops",
                            s("components", units)))
    units = summary_units(config)  # every run ends with one
    means = sum(config.mean_population_size(kind, cap, prompts)
                for kind, _, cap in config.mean_passes())
    phases.append(Phase("summary", units, "prompts x seeds x ops x protocols",
                        s("summary", units) + s("means", means)))
    b = cal.bytes
    top = config.full_grid_top()
    side = config.operand_hi - config.operand_lo
    grid = 0.0
    for share in live_share:  # constant grids cost only their row
        n_live = share * d_mlp
        for op in config.operators:
            n_full = n_live if top is None or side <= 32 else min(top, n_live)
            grid += (n_full * cells[op] * b["grid_full_cell"]
                     + (n_live - n_full) * sketch_codes(config, valid[op])
                     * b["grid_sketch_code"] + d_mlp * b["grid_row"])
    storage = {
        "neuron_op": b["neuron_op"] * d_mlp * ops * n_layers,
        "neuron_grid": grid,
        "neuron_lens": b["neuron_lens"] * d_mlp * n_layers,
        "neuron_score": b["neuron_score"] * cal.rows_per_neuron_op * live * ops,
    }
    total = sum(storage.values())
    phases.append(Phase("writing", total, "bytes", s("write", total)))
    notes = []
    if not fits:
        notes.append(f"The activations do not fit NCAT_ACTIVATION_BUDGET "
                     f"({execution.activation_budget:,} bytes): one grid pass per layer.")
    return Plan(model=cal.model, device=cal.device, checkpoints=n_checkpoints,
                layers=n_layers, d_mlp=d_mlp, prompts=prompts, phases=phases,
                storage=storage, calibration=cal, notes=notes)


def plan_request(url: str, model: str, checkpoints, config: ScienceConfig,
                 layers: list[int] | None = None, execution: ExecutionConfig | None = None,
                 recalibrate: bool = False, home: Path | None = None,
                 progress=None, calibrate_if_missing: bool = True) -> Plan | None:
    """The estimate of a request (validated as ``ncat enqueue`` validates it). Calibrates
    on the first checkpoint when no cached calibration fits (or ``recalibrate``); with
    ``calibrate_if_missing`` False returns None instead."""
    from catalog.settings import get_settings
    from catalog.sources import load_model
    from jobs.enqueue import plan as validate

    execution = execution or ExecutionConfig()
    planned = validate(model, checkpoints, config, layers)
    name = planned[0].model
    home = home or get_settings().ncat_home
    key = cost_key(name, execution.device, config)
    cal = None if recalibrate else cached_calibration(home, key)
    if cal is None:
        if not calibrate_if_missing:
            return None
        settings = get_settings()
        lm = load_model(name, planned[0].step, device=execution.device,
                        dtype=config.torch_dtype(), cache_root=settings.builtin_root)
        cal = calibrate(url, lm, config, execution, progress)
        _store_calibration(home, key, cal)
    from catalog.sources import inspect_model

    numbers = inspect_model(name, planned[0].step).numbers
    limit = None if numbers.digit_level else numbers.limit
    with_bottom = config.score_bottom == "always" or (config.score_bottom == "auto"
                                                      and cal.gated)
    d = config.as_dict()
    grid_key = json.dumps({"grid": True, "device": execution.device, "limit": limit,
                           "bottom": with_bottom, "catalog": CATALOG_VERSION,
                           **{k: d[k] for k in GRID_FIELDS}}, sort_keys=True)
    cached = None if recalibrate else _cached(home, grid_key)
    if cached is None:
        costs = grid_costs(config, grid_cells(config, limit), execution.device, with_bottom)
        _store(home, grid_key, dataclasses.asdict(costs))
    else:
        costs = GridCosts(**cached)
    return estimate(cal, config, n_checkpoints=len(planned), layers=layers, limit=limit,
                    costs=costs, execution=execution)
