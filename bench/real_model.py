"""The whole of a real pretrained model through the catalog, timed per phase.

Qwen2.5-Coder-0.5B-Instruct (GGUF Q4_K_M, dequantized to float32): all 24 layers,
116,736 neurons; '+' on operands [0, 30) (900 prompts), 3 solved examples before each
prompt, 50 counterfactual pairs, attribution patching for every neuron and exact patching
for the top 50 per layer (``--exact top:50``). It writes the rows into a catalog database,
then renders ``ncat report`` (into bench/results/real_model_report/), whose figures the
README sets beside the heuristics paper's. Target on 2 CPU cores: under 30 minutes.

Run: .venv/bin/python bench/real_model.py [--device cuda] [--exact all] [--ops +-*/]
     [--hi 30] [--patch-chunk 64] [--batch-size 256] [--database-url URL]
(fetches the model once with `ncat fetch qwen2.5-coder-0.5b`; without --database-url it
uses the catalog's database: DATABASE_URL, a local PostgreSQL, or an embedded one).
"""

from __future__ import annotations

import argparse
import json
import platform
import socket
import time
from pathlib import Path

from _common import RESULTS, save

MODEL = "qwen2.5-coder-0.5b"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--exact", default="top:50")
    parser.add_argument("--ops", default="+")
    parser.add_argument("--hi", type=int, default=30)
    parser.add_argument("--pairs", type=int, default=50)
    parser.add_argument("--shots", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--patch-chunk", type=int, default=64)
    parser.add_argument("--protocols", default="paper,all-layers",
                        help="faithfulness protocols, comma-separated (paper, all-layers, "
                             "counterfactual)")
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()

    import torch

    from catalog.config import ExecutionConfig, ScienceConfig
    from catalog.config.settings import get_settings
    from catalog.run.checkpoint import CheckpointRun
    from catalog.sources import load_model, registry
    from jobs.store_results import layer_rows, register, summary_dict, write_layouts
    from reports.report import report
    from schema import store
    from schema.database import resolve_database_url
    from schema.engine import migrate

    phases: dict[str, float] = {}
    t = time.perf_counter()
    registry.fetch(MODEL, get_settings().ncat_home, progress=True)
    phases["fetch (cached after the first run)"] = time.perf_counter() - t
    t = time.perf_counter()
    config = ScienceConfig(operators=tuple(args.ops), operand_hi=args.hi, shots=args.shots,
                           pairs_per_op=args.pairs, exact=args.exact, dtype=args.dtype,
                           faithfulness_protocols=tuple(args.protocols.split(",")))
    lm = load_model(MODEL, device=args.device, dtype=config.torch_dtype())
    phases["load (dequantize, convert, process weights)"] = time.perf_counter() - t
    execution = ExecutionConfig(device=args.device, batch_size=args.batch_size,
                                patch_chunk=args.patch_chunk)
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    url = args.database_url or resolve_database_url()
    migrate(url)
    run = CheckpointRun(lm.model, lm.tokenizer, config, execution)
    t = time.perf_counter()
    run.prepare(progress=True)
    phases["prepare (prompts, grid pass with prefix reuse, pairs, heuristics)"] = \
        time.perf_counter() - t
    layer_s = []
    per_phase: dict[str, float] = {}
    with store.connect(url) as conn:
        ids = register(conn, lm, config)
        write_layouts(conn, run, ids)
        mark = [time.perf_counter()]

        def write(result) -> None:
            store.write_layer(conn, model_id=ids.model_id, checkpoint_id=ids.checkpoint_id,
                              config_id=ids.config_id,
                              rows=layer_rows(result, run, lm.tokenizer),
                              worker=socket.gethostname())
            now = time.perf_counter()
            layer_s.append(now - mark[0])
            mark[0] = now
            result_seconds = dict(result.seconds)
            for k, v in result_seconds.items():
                per_phase[k] = per_phase.get(k, 0.0) + v
            result_seconds["compute+write"] = layer_s[-1]
            per_phase["write"] = per_phase.get("write", 0.0) + layer_s[-1] - sum(
                result.seconds.values())
            print(f"layer {result.layer}: {layer_s[-1]:.1f} s "
                  + " ".join(f"{k} {v:.1f}" for k, v in result_seconds.items()), flush=True)

        driven = run.run_all(on_layer=write, summary=False)
        phases["layers (lens, patching, matching, write), all"] = sum(layer_s)
        t = time.perf_counter()
        summ = run.summarize_digests(driven.digests)
        with conn.transaction():
            store.write_summary(conn, checkpoint_id=ids.checkpoint_id, config_id=ids.config_id,
                                summary=summary_dict(summ))
        store.refresh_views(conn)
        phases["summary (components, curves, knockouts, write)"] = time.perf_counter() - t
    t = time.perf_counter()
    out = RESULTS / "real_model_report"
    report(url, MODEL, None, out, top_n=50)
    phases["report"] = time.perf_counter() - t
    total = sum(v for k, v in phases.items() if not k.startswith("fetch"))
    numbers = json.loads((out / "report.html").read_text().split("id='report-data'>")[1]
                         .split("</script>")[0].replace("&quot;", '"').replace("&#x27;", "'"))
    save("real_model" + ("" if args.device == "cpu" else f"_{args.device.split(':')[0]}"), {
        "model": MODEL, "device": args.device,
        "machine": f"{platform.processor() or platform.machine()}, "
                   f"{torch.get_num_threads()} threads",
        "device_name": torch.cuda.get_device_name() if cuda else None,
        "torch": torch.__version__,
        "config": {"ops": args.ops, "hi": args.hi, "shots": args.shots, "pairs": args.pairs,
                   "exact": args.exact, "dtype": args.dtype, "batch_size": args.batch_size,
                   "patch_chunk": args.patch_chunk, "protocols": args.protocols},
        "peak_gpu_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
        "neurons": lm.model.cfg.n_layers * lm.model.cfg.d_mlp,
        "seconds_per_phase": {k: round(v, 1) for k, v in phases.items()},
        "layer_seconds_by_phase": {k: round(v, 1) for k, v in per_phase.items()},
        "seconds_per_layer": {"min": round(min(layer_s), 1), "median":
                              round(sorted(layer_s)[len(layer_s) // 2], 1),
                              "max": round(max(layer_s), 1)},
        "total_minutes_without_fetch": round(total / 60, 1),
        "accuracy": summ.accuracy, "n_pairs": summ.n_pairs,
        "summary_seconds": {k: round(v, 1) for k, v in summ.seconds.items()},
        "faithfulness": {op: [[k, round(f, 3)] for k, f in c]
                         for op, c in summ.faithfulness.items()},
        "curves": [{k: v for k, v in c.as_dict().items() if k != "points"}
                   | {"ranked": {m: c.curve(metric=m, stat=st) for m in ("nl", "logprob")
                                 for st in ("ratio_of_means",)},
                      "points": [p for p in c.points if p["metric"] in ("nl", "logprob")]}
                   for c in summ.curves],
        "residual_lens": summ.residual_lens,
        "n_heuristic_neurons": summ.n_heuristic_neurons,
        "report": {k: numbers[k] for k in ("top_labelled", "all_labelled", "layer_share",
                                           "top_by_family")},
        "report_path": str(Path(out) / "report.html"),
    })


if __name__ == "__main__":
    main()
