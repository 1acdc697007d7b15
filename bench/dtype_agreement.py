"""Exact effects in bfloat16 against float32 on the same request: may bfloat16 be used?

Runs the whole of Qwen2.5-Coder-0.5B-Instruct (every layer, no database) once per dtype on
the same request, keeps every neuron's exact and attribution effects, and compares the
two runs layer by layer: Spearman rank agreement of the exact effects (all neurons, and
the top 5% by float32's |effect|), overlap of the top-50 sets, and each layer's share of
the total |effect|. Also times the exact-patching phase per dtype and counts its FLOPs
against the device's measured matrix peak in that dtype.

Run: .venv/bin/python bench/dtype_agreement.py --device cuda [--exact all] [--ops +]
     [--hi 30] [--pairs 50] [--dtypes float32,bfloat16]
(needs the model: `ncat fetch qwen2.5-coder-0.5b`, or the file under NCAT_HOME).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from _common import RESULTS, flop_per_row, matmul_peak, save

MODEL = "qwen2.5-coder-0.5b"
TOP = 50


def one_dtype(args, dtype: str) -> dict:
    import torch

    from catalog.config import ExecutionConfig, ScienceConfig
    from catalog.measuring.grids import accuracy_by_operator
    from catalog.run.checkpoint import CheckpointRun
    from catalog.sources import load_model

    t = time.perf_counter()
    config = ScienceConfig(operators=tuple(args.ops), operand_hi=args.hi, shots=args.shots,
                           pairs_per_op=args.pairs, exact=args.exact, dtype=dtype)
    lm = load_model(MODEL, device=args.device, dtype=config.torch_dtype())
    load_s = time.perf_counter() - t
    execution = ExecutionConfig(device=args.device, batch_size=args.batch_size,
                                patch_chunk=args.patch_chunk)
    layers = None if args.layers is None else [int(x) for x in args.layers.split(",")]
    run = CheckpointRun(lm.model, lm.tokenizer, config, execution, layers=layers)
    t = time.perf_counter()
    run.prepare(progress=False)
    prepare_s = time.perf_counter() - t
    exact, attr, rank, seconds = {}, {}, {}, {}

    flop = {"exact": 0.0, "rows": 0}
    per_block, unembed = flop_per_row(lm.model)

    def keep(result) -> None:
        rows = sum(f["n_exact"] * f["n_pairs"] for f in result.patching.values())
        flop["rows"] += rows
        flop["exact"] += rows * ((cfg.n_layers - result.layer - 1) * per_block + unembed)
        exact[result.layer] = result.effect_exact[:, 0].astype(np.float64)
        attr[result.layer] = result.effect_attr[:, 0].astype(np.float64)
        rank[result.layer] = result.rank_value[:, 0].astype(np.float64)
        for k, v in result.seconds.items():
            seconds[k] = seconds.get(k, 0.0) + v
        print(f"{dtype} layer {result.layer}: " + " ".join(
            f"{k} {v:.1f}" for k, v in result.seconds.items()), flush=True)

    cfg = lm.model.cfg
    t = time.perf_counter()
    run.run_all(on_layer=keep, summary=False)
    layers_s = time.perf_counter() - t
    accuracy = {op: round(float(a), 4) for op, a in accuracy_by_operator(run.table).items()}
    out = {"dtype": dtype, "load_s": round(load_s, 1), "prepare_s": round(prepare_s, 1),
           "layers_s": round(layers_s, 1),
           "phase_s": {k: round(v, 1) for k, v in seconds.items()},
           "exact_rows": flop["rows"],
           "exact_tflops": round(flop["exact"] / seconds["exact"] / 1e12, 2),
           "accuracy": accuracy, "n_layers": cfg.n_layers, "d_mlp": cfg.d_mlp,
           "exact": {str(k): v for k, v in exact.items()},
           "attr": {str(k): v for k, v in attr.items()},
           "rank": {str(k): v for k, v in rank.items()}}
    del run, lm
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return out


def compare(ref: dict, other: dict, kind: str) -> dict:
    """Per layer, on effects ``kind`` ('exact': the paper's mean; 'rank': the catalog's
    ranking statistic, a trimmed mean of log-space effects): Spearman of other's effects
    against ref's (all neurons; the top 5% by ref's |effect|), the overlap of the two
    top-50 sets by |effect|, and each run's share of the total |effect|."""
    from catalog.core.stats import spearman  # after _common has set the offline hub

    layers = sorted(int(k) for k in ref["exact"])
    total = {name: sum(np.nansum(np.abs(run[kind][str(layer)])) for layer in layers)
             for name, run in (("ref", ref), ("other", other))}
    rows = []
    for layer in layers:
        a = ref[kind][str(layer)]
        b = other[kind][str(layer)]
        n_top = max(3, len(a) // 20)
        top_a = np.argsort(-np.abs(np.nan_to_num(a)))
        top_b = np.argsort(-np.abs(np.nan_to_num(b)))
        rows.append({
            "layer": layer,
            "spearman_all": round(spearman(a, b), 4),
            "spearman_top5pct": round(spearman(a[top_a[:n_top]], b[top_a[:n_top]]), 4),
            "top50_overlap": len(set(top_a[:TOP].tolist()) & set(top_b[:TOP].tolist())),
            "share_ref": round(float(np.nansum(np.abs(a)) / total["ref"]), 4),
            "share_other": round(float(np.nansum(np.abs(b)) / total["other"]), 4),
            "max_abs_diff_top50": round(float(np.max(np.abs(a[top_a[:TOP]] - b[top_a[:TOP]]))),
                                        4),
            "median_abs_top50_ref": round(float(np.median(np.abs(a[top_a[:TOP]]))), 4),
        })
    return {"ref": ref["dtype"], "other": other["dtype"], "effect": kind, "layers": rows,
            "spearman_all_median": float(np.median([r["spearman_all"] for r in rows])),
            "spearman_all_min": float(np.min([r["spearman_all"] for r in rows])),
            "top50_overlap_median": float(np.median([r["top50_overlap"] for r in rows])),
            "share_max_abs_diff": float(np.max([abs(r["share_ref"] - r["share_other"])
                                                for r in rows]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--exact", default="all")
    parser.add_argument("--ops", default="+")
    parser.add_argument("--hi", type=int, default=30)
    parser.add_argument("--pairs", type=int, default=50)
    parser.add_argument("--shots", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--patch-chunk", type=int, default=256)
    parser.add_argument("--layers", default=None, help="comma-separated (default: all)")
    parser.add_argument("--compare", nargs="+", default=None, metavar="JSON",
                        help="compare runs saved by earlier invocations (each with one "
                             "dtype) instead of running")
    args = parser.parse_args()

    import torch

    suffix = "" if args.device == "cpu" else f"_{args.device.split(':')[0]}"
    if args.compare:
        saved = [json.loads(Path(f).read_text()) for f in args.compare]
        runs = []
        for f, s in zip(args.compare, saved, strict=True):
            effects = np.load(Path(f).with_suffix(".npz"))
            for r in s["runs"]:
                runs.append(r | {kind: {k.rsplit("_", 1)[1]: effects[k] for k in effects.files
                                        if k.startswith(f"{r['dtype']}_{kind}_")}
                                 for kind in ("exact", "attr", "rank")})
        head = {k: saved[0][k] for k in ("model", "device", "device_name", "torch", "request")}
        peaks = {k: v for s in saved for k, v in s["matmul_peak_tflops"].items()}
        name = "dtype_agreement" + suffix
    else:
        runs = [one_dtype(args, d) for d in args.dtypes.split(",")]
        peaks = {d: round(matmul_peak(args.device, getattr(torch, d)) / 1e12, 1)
                 for d in args.dtypes.split(",")}
        head = {"model": MODEL, "device": args.device,
                "device_name": (torch.cuda.get_device_name()
                                if args.device.startswith("cuda") else None),
                "torch": torch.__version__,
                "request": {"ops": args.ops, "hi": args.hi, "shots": args.shots,
                            "pairs": args.pairs, "exact": args.exact,
                            "batch_size": args.batch_size, "patch_chunk": args.patch_chunk}}
        name = "dtype_agreement" + suffix + "_" + "_".join(args.dtypes.split(","))
        # every neuron's effects, for comparing runs made apart (--compare)
        RESULTS.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(RESULTS / f"{name}.npz", **{
            f"{r['dtype']}_{kind}_{layer}": v for r in runs
            for kind in ("exact", "attr", "rank") for layer, v in r[kind].items()})
    comparisons = [compare(runs[0], r, kind) for r in runs[1:] for kind in ("rank", "exact")]
    for c in comparisons:
        print(f"{c['other']} against {c['ref']}, {c['effect']}: Spearman median "
              f"{c['spearman_all_median']:.4f}"
              f" (min {c['spearman_all_min']:.4f}), top-50 overlap median "
              f"{c['top50_overlap_median']}, largest layer-share difference "
              f"{c['share_max_abs_diff']:.4f}", flush=True)
    save(name, head | {
        "matmul_peak_tflops": peaks,
        "runs": [{k: v for k, v in r.items() if k not in ("exact", "attr", "rank")}
                 for r in runs],
        "comparisons": comparisons,
    })

if __name__ == "__main__":
    main()
