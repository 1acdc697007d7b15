"""One checkpoint of Pythia-shaped models on one device, timed per phase, with peak memory.

Each model has a published Pythia shape (70m: 6 x 2,048 neurons; 410m: 24 x 4,096; 1.4b:
24 x 8,192), Pythia's architecture (rotary, parallel residual) and vocabulary size
(50,304), and random weights, built in memory and weight-processed like a loaded
checkpoint. Its costs are those of the real model: the phases' work depends on the
shapes and the config, not on the weights, except matching (real maps have other tie
structures) and the number of correct prompts: random weights answer nothing, so every
prompt is treated as correct and each operator gets the config's pairs.

Per shape it runs the config (default: 4 operators, operands [0, 100), 100 pairs,
exact patching of the top 64 per layer by |attribution|) and reports the seconds of each
phase, peak GPU memory (torch's allocator) and, for the two matrix-bound phases, FLOP/s
against a matrix product measured in the same run:
- grid pass: prompts x tokens x 2 x (non-embedding parameters), last-position unembedding
  excluded;
- exact patching: every (pair, neuron) row is a single-position forward of the layers
  after the patched one plus the unembedding: 2 x (4 d^2 + 2 d d_mlp) per layer and
  2 d vocab, attention over the cached context left out.
Exact patching for all neurons (the default config) costs its measured seconds per row
times neurons x pairs x operators; the report gives that extrapolation, saying so.

Run: .venv/bin/python bench/pythia_shapes.py [--device cuda] [--shapes 70m,410m,1.4b]
     [--dtype float32] [--hi 100] [--pairs 100] [--exact top:64] [--patch-chunk 256]
Results: bench/results/pythia_shapes_<device>_<dtype>.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from _common import RESULTS, matmul_peak, sync  # first: it points the hub cache at a temp folder


def _peak_gib(device: str) -> float | None:
    import torch

    if not device.startswith("cuda"):
        return None
    return round(torch.cuda.max_memory_allocated() / 2**30, 2)


def measure(shape: str, args) -> dict:
    import numpy as np
    import torch

    from catalog.config import ExecutionConfig, ScienceConfig
    from catalog.measuring.prompts import sample_pairs
    from catalog.run.checkpoint import CheckpointRun

    from offline_models import pythia_shaped

    device = args.device
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    model, tokenizer = pythia_shaped(shape, device=device)
    config = ScienceConfig(operators=tuple(args.ops), operand_hi=args.hi,
                           pairs_per_op=args.pairs, exact=args.exact, dtype=args.dtype)
    if args.dtype != "float32":
        model.to(config.torch_dtype())
        model.cfg.dtype = config.torch_dtype()
    build_s = time.perf_counter() - t
    cfg = model.cfg
    execution = ExecutionConfig(device=device, batch_size=args.batch_size,
                                patch_chunk=args.patch_chunk,
                                activation_budget=args.activation_budget)
    run = CheckpointRun(model, tokenizer, config, execution)
    phases: dict[str, float] = {}
    peak: dict[str, float | None] = {"model": _peak_gib(device)}
    t = time.perf_counter()
    run.prepare()
    phases["prepare (prompts, grid pass, pairs, heuristics)"] = time.perf_counter() - t
    # random weights answer nothing correctly, so no prompt could be a pair: for timing,
    # every prompt counts as correct and the config's pairs are drawn (effects meaningless)
    accuracy = {op: float(run.table.correct[run.table.op_index(op)].mean())
                for op in config.operators}
    run.table.correct = np.ones(len(run.table), dtype=bool)
    run.pairs = {op: sample_pairs(run.table, op, config.pairs_per_op, config.seed)
                 for op in config.operators}
    peak["prepare"] = _peak_gib(device)
    n_prompts = len(run.table)
    one_pass = bool(run.held_layers)
    layer_phases: dict[str, float] = {}
    tally = {"exact_rows": 0.0, "flop_exact": 0.0, "mark": time.perf_counter()}
    per_layer_flop = 2 * (4 * cfg.d_model**2 + 2 * cfg.d_model * cfg.d_mlp)
    unembed_flop = 2 * cfg.d_model * cfg.d_vocab

    def account(result) -> None:
        sync(device)
        for k, v in result.seconds.items():
            layer_phases[k] = layer_phases.get(k, 0.0) + v
        rows = sum(f["n_exact"] * f["n_pairs"] for f in result.patching.values())
        tally["exact_rows"] += rows
        tally["flop_exact"] += rows * ((cfg.n_layers - result.layer - 1) * per_layer_flop
                                       + unembed_flop)
        now = time.perf_counter()
        print(f"{shape} layer {result.layer}: {now - tally['mark']:.1f} s", flush=True)
        tally["mark"] = now

    driven = run.run_all(on_layer=account, summary=False)
    exact_rows, flop_exact = int(tally["exact_rows"]), tally["flop_exact"]
    peak["layers"] = _peak_gib(device)
    t = time.perf_counter()
    run.summarize_digests(driven.digests)
    phases["summary (faithfulness, knockouts)"] = time.perf_counter() - t
    peak["summary"] = _peak_gib(device)
    n_pairs = {op: int(len(run.pairs[op][0])) for op in config.operators}
    n_neurons = cfg.n_layers * cfg.d_mlp
    exact_s = layer_phases.get("exact", 0.0)
    per_row = exact_s / exact_rows if exact_rows else float("nan")
    all_rows = n_neurons * sum(n_pairs.values())
    tokens = float(np.mean([len(t) for t in run.table.tokens]))
    non_embed = cfg.n_layers * (4 * cfg.d_model**2 + 2 * cfg.d_model * cfg.d_mlp)
    grid_s = layer_phases.get("activations", 0.0) + phases[
        "prepare (prompts, grid pass, pairs, heuristics)"]
    out = {
        "shape": shape, "n_layers": cfg.n_layers, "d_model": cfg.d_model, "d_mlp": cfg.d_mlp,
        "d_vocab": cfg.d_vocab, "neurons": n_neurons, "prompts": n_prompts,
        "pairs": n_pairs, "exact": config.exact, "one_grid_pass": one_pass,
        "build_s": round(build_s, 1),
        "seconds": {**{k: round(v, 2) for k, v in phases.items()},
                    **{f"layers: {k}": round(v, 2) for k, v in layer_phases.items()}},
        "total_s": round(sum(phases.values()) + sum(layer_phases.values()), 1),
        "exact_rows": exact_rows,
        "exact_s_per_million_rows": round(per_row * 1e6, 2),
        "exact_all_extrapolated_s": round(per_row * all_rows, 1),
        "exact_flop_per_s": flop_exact / exact_s if exact_s else None,
        # the grid pass's seconds include tokenizing and judging answers: a lower bound
        "grid_flop_per_s": n_prompts * tokens * 2 * non_embed / grid_s,
        "peak_gib": peak,
        "accuracy_of_the_random_weights": accuracy,
    }
    del run, model
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--shapes", default="70m,410m,1.4b")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--ops", default="+-*/")
    parser.add_argument("--hi", type=int, default=100)
    parser.add_argument("--pairs", type=int, default=100)
    parser.add_argument("--exact", default="top:64")
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--patch-chunk", type=int, default=64)
    parser.add_argument("--activation-budget", type=int, default=2 * 1024**3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    import torch

    dtype = getattr(torch, args.dtype)
    peak = matmul_peak(args.device, dtype)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"{name}: {args.dtype} matrix product {peak / 1e12:.1f} TFLOP/s", flush=True)
    results = {"device": args.device, "device_name": name, "dtype": args.dtype,
               "torch": torch.__version__, "threads": torch.get_num_threads(),
               "matmul_peak_tflops": round(peak / 1e12, 1),
               "config": {k: getattr(args, k) for k in ("ops", "hi", "pairs", "exact",
                                                         "batch_size", "patch_chunk",
                                                         "activation_budget")},
               "shapes": []}
    out = Path(args.out) if args.out else RESULTS / (
        f"pythia_shapes_{args.device.split(':')[0]}_{args.dtype}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    for shape in args.shapes.split(","):
        r = measure(shape, args)
        for phase in ("exact", "grid"):
            flops = r.pop(f"{phase}_flop_per_s")
            if flops is not None:
                r[f"{phase}_tflops"] = round(flops / 1e12, 2)
                r[f"{phase}_share_of_matmul_peak"] = round(flops / peak, 3)
        results["shapes"].append(r)
        out.write_text(json.dumps(results, indent=2))  # after every shape: a cut run keeps it
        print(json.dumps(r, indent=2), flush=True)


if __name__ == "__main__":
    main()
