"""Bytes per neuron of the stored grids at --hi 300: raw full grids vs tiers.

Measures the built-in model's final checkpoint on the paper's grid (operands [0, 300),
all four operators; attribution patching only, which is what ranks the top set here)
and writes each layer's grids three ways into fresh databases on the same server:

- raw: every grid in full, the 8-bit codes as raw bytes (what the catalog stored before
  0.4.0; PostgreSQL's own TOAST compression applies, as it did then),
- zstd: every grid in full, one zstd frame each (``--full-grids all``),
- tiered: the default, ``--full-grids top:20``: the top 20 per layer and operator in
  full, a sketch for every other grid (schema.sketch).

Reports neuron_grid bytes (table, indexes and TOAST, pg_total_relation_size) per neuron
and the ratios, and the mean stored bytes of a full and of a sketch row, from which the
bytes per neuron of other widths follow (Pythia-70m's 2,048 neurons per layer,
Pythia-1.4B's 8,192): per operator (N full rows + (d_mlp - N) sketch rows) / d_mlp.

Run: .venv/bin/python bench/grid_tiers.py
"""

from __future__ import annotations

import time
import uuid

from _common import save

FULL_TOP = 20
HI = 300


def _fresh(server: str) -> str:
    from schema.engine import migrate

    url = f"{server}/ncat_grids_{uuid.uuid4().hex[:8]}"
    migrate(url)
    return url


def _write(url: str, lm, config, run, rows_by_layer: dict, raw: bool) -> dict:
    """Write every layer's grids (and the rows they hang off) and measure neuron_grid."""
    from jobs.store_results import register, write_layouts
    from schema import reads, store
    from schema.quantize import quantize_rows

    with store.connect(url, autocommit=True) as conn:
        ids = register(conn, lm, config)
        write_layouts(conn, run, ids)
        t = time.perf_counter()
        for rows in rows_by_layer.values():
            store.write_layer(conn, model_id=ids.model_id, checkpoint_id=ids.checkpoint_id,
                              config_id=ids.config_id, rows=rows)
            if raw:  # the layout before 0.4.0: raw codes, no codec
                with conn.transaction(), conn.cursor() as cur:
                    for o, op in enumerate(rows.ops):
                        q, _, _ = quantize_rows(rows.grids[o])
                        cur.executemany(
                            "UPDATE neuron_grid SET q = %s, codec = 0, sketch = false WHERE "
                            "checkpoint_id = %s AND config_id = %s AND layer = %s AND "
                            "neuron = %s AND op = %s",
                            [(q[n].tobytes(), ids.checkpoint_id, ids.config_id, rows.layer, n,
                              op) for n in range(rows.d_mlp)])
        seconds = time.perf_counter() - t
        conn.execute("VACUUM FULL ANALYZE neuron_grid")
        n_neurons = conn.execute("SELECT count(DISTINCT (layer, neuron)) FROM neuron_grid"
                                 ).fetchone()[0]
        by_tier = {bool(s): (int(c), float(b)) for s, c, b in conn.execute(
            "SELECT sketch, count(*), avg(pg_column_size(q)) FROM neuron_grid GROUP BY sketch"
        ).fetchall()}
        total = reads.table_bytes(conn, "neuron_grid")
    return {"neurons": n_neurons, "bytes": total, "bytes_per_neuron": round(total / n_neurons),
            "write_s": round(seconds, 2),
            "full_rows": by_tier.get(False, (0, 0.0))[0],
            "sketch_rows": by_tier.get(True, (0, 0.0))[0],
            "mean_full_row_bytes": round(by_tier.get(False, (0, 0.0))[1]),
            "mean_sketch_row_bytes": round(by_tier.get(True, (0, 0.0))[1])}


def main() -> None:
    import dataclasses

    from catalog import builtin
    from catalog.config import ScienceConfig
    from catalog.run.checkpoint import CheckpointRun
    from catalog.sources import load_model
    from jobs.store_results import layer_rows
    from schema import store
    from schema.database import resolve_database_url

    cfg = builtin.TrainConfig()
    builtin.train(cfg)  # cached after the first time
    lm = load_model("builtin", cfg.steps)
    config = ScienceConfig(operand_hi=HI, patching=("attribution",), pairs_per_op=20)
    t = time.perf_counter()
    run = CheckpointRun(lm.model, lm.tokenizer, config).prepare(progress=True)
    rows_by_layer = {}

    def keep_rows(result) -> None:
        rows_by_layer[result.layer] = layer_rows(result, run, lm.tokenizer)

    run.run_all(on_layer=keep_rows, summary=False)
    measure_s = time.perf_counter() - t
    server = resolve_database_url().rsplit("/", 1)[0]
    results = {}
    for name, top, raw in (("raw full (before 0.4.0)", None, True),
                           ("zstd full (--full-grids all)", None, False),
                           (f"tiered (--full-grids top:{FULL_TOP})", FULL_TOP, False)):
        layers = {k: dataclasses.replace(r, full_top=top) for k, r in rows_by_layer.items()}
        url = _fresh(server)
        try:
            results[name] = _write(url, lm, config, run, layers, raw)
        finally:
            store.drop_database(url)
    raw_r, zstd_r, tiered = results.values()
    full_b, sketch_b = tiered["mean_full_row_bytes"], tiered["mean_sketch_row_bytes"]
    overhead = (tiered["bytes"] - full_b * tiered["full_rows"]
                - sketch_b * tiered["sketch_rows"]) / (tiered["full_rows"] + tiered["sketch_rows"])
    ops = len(config.operators)

    def per_neuron(d_mlp: int) -> float:
        """Tiered bytes per neuron of a layer of d_mlp neurons, from the measured rows."""
        n = min(FULL_TOP, d_mlp)
        return ops * ((n * full_b + (d_mlp - n) * sketch_b) / d_mlp + overhead)

    raw_per_neuron = raw_r["bytes_per_neuron"]
    save("grid_tiers", {
        "model": f"built-in, step {cfg.steps}, {cfg.n_layers} layers x {cfg.d_mlp} neurons",
        "grid": f"[0, {HI}) x 4 operators", "measure_s": round(measure_s, 1),
        "results": results,
        "ratio_raw_over_tiered": round(raw_per_neuron / tiered["bytes_per_neuron"], 1),
        "ratio_raw_over_zstd_full": round(raw_per_neuron / zstd_r["bytes_per_neuron"], 2),
        "row_overhead_bytes": round(overhead),
        "extrapolated_bytes_per_neuron": {
            f"d_mlp {d}": {"tiered": round(per_neuron(d)),
                           "ratio_raw_over_tiered": round(raw_per_neuron / per_neuron(d), 1)}
            for d in (512, 2048, 8192)},
    })


if __name__ == "__main__":
    main()
