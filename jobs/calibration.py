"""Calibration: the model catalogued for real, twice, on small configs, into scratch
databases (docs/planning.md): each phase timed and fitted as fixed seconds plus seconds
per unit through the two runs, bytes per row from the larger. Calibrations and the
grid's heuristic costs are cached under ``$NCAT_HOME/plan`` per model, device and the
config choices that change a unit's cost."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from pathlib import Path

import numpy as np

from catalog.config import CATALOG_VERSION, ExecutionConfig, ScienceConfig
from jobs.costs import (
    Calibration,
    GridCosts,
    exact_row_macs,
    grid_cells,
    grid_costs,
    shape_macs,
    summary_units,
)
from schema.engine import scratch_url

CALIBRATION_SPAN = 60  # at most operands [lo, lo + 60): 2 x 2 sketch blocks


CALIBRATION_PAIRS = 32


CALIBRATION_FAITHFULNESS = 80


TABLES = ("neuron_op", "neuron_grid", "neuron_lens", "neuron_score")


# the config fields that change a unit's cost (the rest change how many units there are)
# bumped when a calibration's meaning changes, so older cached ones are measured again
# 3: grids coded with 2-D prediction (fewer bytes per cell); 4: correct shares (pairs and
# faithfulness prompts drawn from the correct prompts) and the label rule's time;
# 5: the periodic spectra's time (on by default since catalog 0.9.0); 6: the explanations
# of the KV maps alone (the K maps' are asked for: ExecutionConfig.k_explanations)
PLANNER_VERSION = 6


# the config fields that decide the grid-only costs (heuristics, matching)
GRID_FIELDS = ("operand_lo", "operand_hi", "operators", "families", "heuristic_variant",
               "score_floor", "pattern_top_k", "multi_result_top", "dedupe_heuristics")


COST_FIELDS = ("template", "few_shot", "shots", "shot_separator", "operators", "dtype",
               "families", "heuristic_variant", "score_bottom", "lens_top_k",
               "scores_per_family", "label_rule", "rank_statistic", "full_grids",
               "significance_level", "match_threshold", "score_floor", "null_strata",
               "dedupe_heuristics", "spectra")


SMALL_RUN = (20, 8, 20)  # (operand span, pairs, faithfulness prompts)


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


def store_calibration(home: Path, key: str, cal: Calibration) -> None:
    _store(home, key, cal.as_dict())


def cached_grid_costs(home: Path, config: ScienceConfig, limit: int | None, device: str,
                      with_bottom: bool, again: bool = False) -> GridCosts:
    """The request grid's heuristic and matching costs on ``device``: cached, or measured
    (``again``: measured even when cached)."""
    d = config.as_dict()
    key = json.dumps({"grid": True, "device": device, "limit": limit, "bottom": with_bottom,
                      "catalog": CATALOG_VERSION, **{k: d[k] for k in GRID_FIELDS}},
                     sort_keys=True)
    cached = None if again else _cached(home, key)
    if cached is not None:
        return GridCosts(**cached)
    costs = grid_costs(config, grid_cells(config, limit), device, with_bottom)
    _store(home, key, dataclasses.asdict(costs))
    return costs


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
    # measured as the worker runs (the K maps' explanations off; the plan doubles the
    # phase where a request asks for them)
    execution = dataclasses.replace(execution, k_explanations=False)
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
                       significance_ratio=large["significance_ratio"],
                       explanations_ratio=large["explanations_ratio"],
                       spectra_ratio=large["spectra_ratio"],
                       correct_share=large["correct_share"],
                       calibration_s=round(time.perf_counter() - t_all, 1),
                       measured_at=time.strftime("%Y-%m-%d %H:%M"),
                       block_macs=block_macs, unembed_macs=unembed_macs)


# phases whose cost is taken as proportional to their units (the larger run's ratio):
# their units hardly differ between the two runs, or their fixed part is noise
PROPORTIONAL = ("lens", "write")


def _warm_up(lm, config: ScienceConfig, execution: ExecutionConfig) -> None:
    """One small run first, untimed: the first forward passes and allocations of a
    process are slower than the rest and would inflate the small run's costs."""
    from catalog.run.checkpoint import CheckpointRun

    tiny = dataclasses.replace(config, operand_hi=config.operand_lo + 8, pairs_per_op=4,
                               faithfulness_prompts=4)
    layer = lm.model.cfg.n_layers - 1
    run = CheckpointRun(lm.model, lm.tokenizer, tiny, execution, [layer]).prepare()
    run.run_layer(layer)


def live_shares(lm, config: ScienceConfig, execution: ExecutionConfig) -> list[float]:
    """Per layer, the share of (neuron, operator) maps that are not constant (constant
    ones get no scores and are not matched), on the small calibration grid: one pass per
    layer, so memory stays one layer's activations."""
    from catalog.core.tokens import detect_number_tokens
    from catalog.measuring.grids import run_grid
    from catalog.measuring.prompts import build_prompts
    from catalog.run.checkpoint import constant_maps

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


def _calibration_run(url_server: str, lm, small: ScienceConfig, execution: ExecutionConfig,
                     progress=None) -> dict:
    """One calibration catalog: per phase (units, seconds), bytes per row."""
    from catalog.labels.heuristics import partitions_for
    from catalog.measuring import ablation
    from catalog.run.checkpoint import CheckpointRun, LayerResult
    from jobs.store_results import layer_rows, register, summary_dict, write_layouts
    from schema import reads, store
    from schema.engine import migrate
    from schema.sketch import GridGeometry

    say = progress or (lambda msg: None)
    n_layers = lm.model.cfg.n_layers
    block, unembed = shape_macs(lm.model.cfg)

    def row_macs(layer: int) -> float:
        return exact_row_macs(block, unembed, n_layers, layer)
    layers = sorted({max(n_layers - 2, 0), n_layers - 1})  # late layers: live neurons
    url = scratch_url(url_server, f"ncat_plan_{uuid.uuid4().hex[:10]}")
    try:
        migrate(url)  # creates the database: inside, so a stop while migrating drops it
        with store.connect(url, autocommit=True) as conn:
            base = {t: reads.table_bytes(conn, t) for t in TABLES}
            ids = register(conn, lm, small)
            say(f"calibrating: operands [{small.operand_lo}, {small.operand_hi}), grid pass")
            t = time.perf_counter()
            run = CheckpointRun(lm.model, lm.tokenizer, small, execution, layers).prepare()
            grid_s = time.perf_counter() - t
            # prepare also built the heuristics, whose cost follows the grid, not the model
            # (measured on the request's grid instead): take it out
            t = time.perf_counter()
            for op in small.operators:
                partitions_for(run.cells[op], small)
            grid_s = max(grid_s - (time.perf_counter() - t), 0.0)
            write_layouts(conn, run, ids)
            phases: dict[str, float] = {}
            used = {op: len(run.pairs[op][0]) for op in small.operators}  # pairs used
            tally = {"write": 0.0, "exact": 0.0}
            before: dict[str, int] = {}
            rows_before: dict[str, int] = {}

            def time_and_write(result: LayerResult) -> None:
                """Each layer's phases and exact-patching work; then its rows, timed (the
                bytes per row are what the last layer adds)."""
                nonlocal before, rows_before
                for k, v in result.seconds.items():
                    phases[k] = phases.get(k, 0.0) + v
                tally["exact"] += row_macs(result.layer) * sum(
                    int(result.is_exact[:, o].sum()) * used[op]
                    for o, op in enumerate(small.operators)) / 1e9
                if result.layer == layers[-1]:
                    reads.vacuum_analyze(conn)  # as a catalog is measured (free space map)
                    before = {t: reads.table_bytes(conn, t) for t in TABLES}
                    rows_before = _counts(conn)
                t = time.perf_counter()
                store.write_layer(conn, model_id=ids.model_id, checkpoint_id=ids.checkpoint_id,
                                  config_id=ids.config_id,
                                  rows=layer_rows(result, run, lm.tokenizer))
                tally["write"] += time.perf_counter() - t
                if result.layer != layers[-1]:
                    say(f"calibrating: layer {layers[layers.index(result.layer) + 1]}")

            say(f"calibrating: layer {layers[0]}")
            driven = run.run_all(on_layer=time_and_write)
            say("calibrating: summary")
            summ, summary_s = driven.summary, driven.summary_seconds
            assert summ is not None
            write_s, exact_work = tally["write"], tally["exact"]
            # the summary's mean activations are passes over their populations: timed apart
            t = time.perf_counter()
            mean_units = 0
            for population, context, cap in small.mean_passes():
                pop = ablation.mean_population(lm.tokenizer, run.table, small, population, cap,
                                               small.seed)
                ablation.position_means(lm.model, pop, context, execution.batch_size)
                mean_units += len(pop)
            means_s = time.perf_counter() - t
            # component effects scale with the pairs, not the faithfulness prompts
            comp_s = summ.seconds.get("component effects and residual lens", 0.0)
            summary_s = max(summary_s - means_s - comp_s, 0.0)
            store.write_summary(conn, checkpoint_id=ids.checkpoint_id, config_id=ids.config_id,
                                summary=summary_dict(summ))
            reads.vacuum_analyze(conn)
            after = {t: reads.table_bytes(conn, t) for t in TABLES}
            rows_after = _counts(conn)
            if len(layers) == 1:  # one layer: its bytes, less the empty tables'
                before, rows_before = base, {t: 0 for t in TABLES}
            sizes = {t: after[t] - before[t] for t in TABLES}
            n_op = rows_after["neuron_op"] - rows_before["neuron_op"]
            n_score = rows_after["neuron_score"] - rows_before["neuron_score"]
            live_last = reads.live_maps(conn, layers[-1])
            live_all = reads.live_maps(conn)
            # grid payloads by tier, against the cells (full) or codes (sketch) they hold
            geometry = {g.op: GridGeometry(g.side, g.valid) for g in run.grid_layouts()}
            payload = {False: 0.0, True: 0.0}
            held = {False: 0, True: 0}
            for op, sketch, n, q in reads.grid_payloads(conn, layers[-1]):
                payload[sketch] += float(q)
                held[sketch] += int(n) * (geometry[op].sketch_length if sketch
                                          else geometry[op].n_cells)
    finally:
        store.drop_database(url)
    ops = len(small.operators)
    n_pairs = sum(used.values())
    total_bytes = sum(sizes.values())
    # real maps against random ones on this grid: random maps on the request's grid,
    # times this ratio, are what matching will cost there
    live_maps = max(float(live_all), 1.0)  # live (neuron, op) maps scored
    random = grid_costs(small, {g.op: g.valid for g in run.grid_layouts()}, execution.device,
                        run.with_bottom)
    random_s = sum(random.per_neuron[op] * live_maps / ops for op in small.operators) \
        + len(layers) * sum(random.per_call.values())
    usable = run.table.usable()
    correct = {op: float(usable[run.table.op_index(op)].sum()) for op in small.operators}
    return {
        "matching_ratio": phases.get("matching", 0.0) / max(random_s, 1e-9),
        "significance_ratio": phases.get("significance", 0.0) / max(random_s, 1e-9),
        "explanations_ratio": phases.get("explanations", 0.0) / max(random_s, 1e-9),
        "spectra_ratio": phases.get("spectra", 0.0) / max(random_s, 1e-9),
        "correct_share": {op: correct[op] / max(len(run.table.op_index(op)), 1)
                          for op in small.operators},
        "units": {"grid": len(run.table), "lens": len(layers), "attribution": n_pairs,
                  "exact": exact_work, "summary": summary_units(small, correct),
                  "means": mean_units, "write": total_bytes,
                  "components": n_pairs if small.component_positions else 0},
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
    from schema import reads

    return {t: reads.row_count(conn, t) for t in TABLES}
