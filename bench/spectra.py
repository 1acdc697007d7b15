"""Periodic structure of a model's neurons across its checkpoints (issue 34's figures): per
checkpoint, layer, operator and axis, how many live maps are significantly periodic, with
a Wilson 95% interval and the dominant periods; their overlap with the heuristic labels;
what the spectra cost beside the whole run; and their bytes beside neuron_op's.

    python bench/spectra.py [MODEL] [--steps 0,256,3000] [--hi 100] [--ops +-*/]
                            [--layers 20,21] [--shots 3] [--pairs 50] [--exact top:50]
                            [--repeat 3] [--database-url URL]
    python bench/spectra.py --markdown bench/results/spectra_builtin.json

Defaults: the built-in model at every cached checkpoint, the demo's config (operands
[0, 100)). Each checkpoint is catalogued into a scratch database on the server of
--database-url (default: the catalog's), the answers read through the views, and the
database dropped; --repeat N catalogs each checkpoint N times and reports the cost as the
median of the N runs with its range (the figures must come out the same each time: the
run stops otherwise). Writes bench/results/spectra_<model>.json and, from it, the tables the
README and docs/periodic.md quote (spectra_<model>.md): per checkpoint, layer and axis the
periodic maps of all operators with a Wilson 95% interval and the commonest periods, and
the labels' agreement with the periodic account beside its base rate.
"""

import argparse
import json
import sys
import time
import uuid
from pathlib import Path

import numpy as np

import _common  # noqa: F401  (sets the offline Hugging Face cache first)
from _common import RESULTS, save


def main() -> int:
    from catalog.config import ScienceConfig
    from catalog.config.settings import get_settings
    from catalog.sources import list_checkpoints, load_model
    from schema.database import resolve_database_url

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", default="builtin")
    p.add_argument("--steps", default=None, help="comma-separated steps (default: all)")
    p.add_argument("--hi", type=int, default=100)
    p.add_argument("--ops", default="+-*/")
    p.add_argument("--layers", default=None)
    p.add_argument("--shots", type=int, default=None)
    p.add_argument("--pairs", type=int, default=None)
    p.add_argument("--exact", default=None)
    p.add_argument("--repeat", type=int, default=1, help="runs per checkpoint (cost median)")
    p.add_argument("--database-url", default=None)
    p.add_argument("--markdown", default=None, help="only render this results file's tables")
    args = p.parse_args()
    if args.markdown:
        print(markdown(json.loads(Path(args.markdown).read_text())))
        return 0
    steps = ([int(s) for s in args.steps.split(",")] if args.steps
             else list_checkpoints(args.model) or [None])
    layers = [int(x) for x in args.layers.split(",")] if args.layers else None
    extra = {k: v for k, v in (("shots", args.shots), ("pairs_per_op", args.pairs),
                               ("exact", args.exact)) if v is not None}
    config = ScienceConfig(operand_hi=args.hi, operators=tuple(args.ops), spectra=True, **extra)
    server = args.database_url or resolve_database_url()
    out: dict = {"model": args.model, "config": {"operand_hi": args.hi, "ops": args.ops,
                                                 **extra},
                 "layers": layers, "checkpoints": []}
    for step in steps:
        lm = load_model(args.model, step, progress=False,
                        cache_root=get_settings().builtin_root)
        runs = [_one_run(server, lm, config, layers, step) for _ in range(max(1, args.repeat))]
        c = runs[0]
        for r in runs[1:]:
            if (r["by_axis"], r["overlap"]) != (c["by_axis"], c["overlap"]):
                raise SystemExit(f"step {step}: a repeated run gave other figures")
        shares = sorted(r["cost_share"] for r in runs)
        c["runs"] = [{k: r[k] for k in ("seconds_total", "spectra_s", "cost_share")}
                     for r in runs]
        c["cost_share"] = float(np.median(shares))
        c["cost_share_range"] = [shares[0], shares[-1]]
        c["spectra_s"] = float(np.median([r["spectra_s"] for r in runs]))
        c["seconds_total"] = float(np.median([r["seconds_total"] for r in runs]))
        out["checkpoints"].append(c)
        print(f"step {step}: {c['periodic_maps']} periodic of {c['live_maps']} live maps "
              f"(axes x ops x layers); spectra {c['spectra_s']:.1f} s of "
              f"{c['seconds_total']:.1f} s ({c['cost_share']:.1%}, {shares[0]:.1%}-"
              f"{shares[-1]:.1%} over {len(runs)} runs); columns {c['storage_share']:.1%} "
              "of neuron_op", file=sys.stderr)
    name = f"spectra_{args.model.replace('/', '_')}"
    save(name, out)
    (RESULTS / f"{name}.md").write_text(markdown(out))
    return 0


def _one_run(server: str, lm, config, layers, step) -> dict:
    """Catalog one checkpoint into a scratch database, time its phases, read the figures
    back through the views, and drop the database."""
    from catalog.run import checkpoint as run_module
    from jobs.store_results import catalog_checkpoint
    from schema import store
    from schema.engine import migrate, scratch_url

    url = scratch_url(server, f"ncat_spectra_{uuid.uuid4().hex[:10]}")
    migrate(url)
    try:
        t0 = time.perf_counter()
        seconds: dict[str, float] = {}
        original = run_module.CheckpointRun.run_layer

        def timed_layer(self, layer, _orig=original, seconds=seconds):
            result = _orig(self, layer)
            for k, v in result.seconds.items():
                seconds[k] = seconds.get(k, 0.0) + v
            return result
        run_module.CheckpointRun.run_layer = timed_layer
        try:
            catalog_checkpoint(url, lm, config, layers=layers)
        finally:
            run_module.CheckpointRun.run_layer = original
        total = time.perf_counter() - t0
        with store.connect(url) as conn:
            return _read(conn, step, total, seconds)
    finally:
        store.drop_database(url)


def _pct(k: int, n: int) -> str:
    from reports.periodic import share_text  # k/n, the share and its Wilson interval

    return share_text(k, n)


def markdown(out: dict) -> str:
    """The figures as markdown: periodic maps per checkpoint, layer and axis (all
    operators pooled, with the commonest significant periods), then the labels'
    agreement with the periodic account at each checkpoint."""
    axes = ("op1", "op2", "result", "kv")
    lines = [f"Model `{out['model']}`, config {json.dumps(out['config'])}.", "",
             "| step | layer | " + " | ".join(axes) + " |",
             "|---|---|" + "---|" * len(axes)]
    for c in out["checkpoints"]:
        cells: dict = {}
        for e in c["by_axis"]:
            k, n, periods = cells.setdefault((e["layer"], e["axis"]), [0, 0, {}])
            cells[(e["layer"], e["axis"])][0] += e["n_periodic"]
            cells[(e["layer"], e["axis"])][1] += e["n_live"]
            for t, m in e["top_periods"]:
                periods[t] = periods.get(t, 0) + m
        for layer in sorted({k[0] for k in cells}):
            row = []
            for x in axes:
                k, n, periods = cells.get((layer, x), [0, 0, {}])
                top = sorted(periods.items(), key=lambda tm: -tm[1])[:3]
                row.append(_pct(k, n) + (" " + ", ".join(f"T={t}: {m}" for t, m in top)
                                         if top else ""))
            lines.append(f"| {c['step']} | {layer} | " + " | ".join(row) + " |")
    lines += ["", "| step | operator | labels | target | agree with the periodic account "
              "| base rate among live maps |", "|---|---|---|---|---|---|"]
    for c in out["checkpoints"]:
        for o in c["overlap"]:
            lines.append(f"| {c['step']} | `{o['op']}` | {o['family']} | {o['target']} | "
                         f"{_pct(o['n_agree'], o['n_labelled'])} | "
                         f"{_pct(o['n_base'], o['n_live'])} |")
    lines += ["", "| step | spectra s | whole run s | share | spectrum bytes / neuron_op "
              "bytes |", "|---|---|---|---|---|"]
    for c in out["checkpoints"]:
        lo, hi = c.get("cost_share_range", [c["cost_share"]] * 2)
        spread = f" ({100 * lo:.1f}-{100 * hi:.1f}%, {len(c['runs'])} runs)" if "runs" in c else ""
        lines.append(f"| {c['step']} | {c['spectra_s']:.1f} | {c['seconds_total']:.1f} | "
                     f"{100 * c['cost_share']:.1f}%{spread} | {100 * c['storage_share']:.1f}% |")
    return "\n".join(lines) + "\n"


def _read(conn, step, total: float, seconds: dict) -> dict:
    from catalog.periodic.spectra import SPECTRUM_COLS

    dist = [dict(zip(("layer", "op", "axis", "period", "n", "n_periodic", "n_live", "share",
                      "low", "high"), r, strict=True)) for r in conn.execute(
        "SELECT layer, op, axis, period, n, n_periodic, n_live, share, share_low, share_high "
        "FROM period_distribution ORDER BY layer, op, axis, n DESC")]
    by_axis: dict = {}
    for r in dist:
        key = (r["layer"], r["op"], r["axis"])
        e = by_axis.setdefault(key, {"layer": r["layer"], "op": r["op"], "axis": r["axis"],
                                     "n_periodic": r["n_periodic"], "n_live": r["n_live"],
                                     "top_periods": []})
        if r["period"] is not None and len(e["top_periods"]) < 3:
            e["top_periods"].append([r["period"], r["n"]])
    for e in by_axis.values():
        k, n = e["n_periodic"], e["n_live"]
        low, high = conn.execute("SELECT wilson_low(%s, %s), wilson_high(%s, %s)",
                                 (k, n, k, n)).fetchone()
        e.update(share=k / n if n else None, low=low, high=high)
    overlap = [dict(zip(("op", "family", "target", "n_labelled", "n_agree", "share", "low",
                         "high", "n_live", "n_base", "base_rate"), r, strict=True))
               for r in conn.execute(
        "SELECT op, family, target, n_labelled, n_agree, share, share_low, share_high, "
        "n_live, n_base, base_rate FROM period_label_overlap ORDER BY op, family, target")]
    helix = conn.execute(
        "SELECT count(*), avg(helix_r2), percentile_cont(0.9) WITHIN GROUP (ORDER BY helix_r2) "
        "FROM neuron_spectrum").fetchone()
    cols = " + ".join(f"coalesce(pg_column_size({c}), 0)" for c in SPECTRUM_COLS)
    col_bytes = conn.execute(f"SELECT sum({cols}) FROM neuron_op").fetchone()[0] or 0
    index_bytes = conn.execute(
        "SELECT coalesce(sum(pg_relation_size(i.indexrelid)), 0) FROM pg_index i "
        "JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname LIKE '%period%'").fetchone()[0]
    table_bytes = conn.execute(
        "SELECT sum(pg_total_relation_size(inhrelid)) FROM pg_inherits "
        "WHERE inhparent = 'neuron_op'::regclass").fetchone()[0]
    live = sum(e["n_live"] for e in by_axis.values())
    periodic = sum(e["n_periodic"] for e in by_axis.values())
    spectra_s = seconds.get("spectra", 0.0)
    return {"step": step, "seconds_total": round(total, 2), "spectra_s": round(spectra_s, 3),
            "cost_share": spectra_s / total if total else None,
            "phase_seconds": {k: round(v, 3) for k, v in seconds.items()},
            "spectrum_bytes": int(col_bytes) + int(index_bytes),
            "neuron_op_bytes": int(table_bytes),
            "storage_share": (int(col_bytes) + int(index_bytes)) / int(table_bytes),
            "live_maps": live, "periodic_maps": periodic,
            "by_axis": list(by_axis.values()), "overlap": overlap,
            "helix": {"n": helix[0], "mean_r2": helix[1], "p90_r2": helix[2]}}


if __name__ == "__main__":
    sys.exit(main())
