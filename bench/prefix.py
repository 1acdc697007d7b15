"""Grid pass with a 3-shot prefix: prefix keys/values computed once vs full forwards.

Qwen2.5-Coder-0.5B (fetched with `ncat fetch qwen2.5-coder-0.5b`), '+' on operands
[0, 30): 900 prompts after 3 solved examples. Both ways give the same activations (checked
to 1e-4 here, and in tests/unit/test_prefix.py); the ratio is the median of --runs runs
of each, with the spread. The matmul FLOPs of each way (2 x block weights x tokens;
attention scores and the unembedding left out) are set against this machine's measured
float32 matmul peak.

Run: .venv/bin/python bench/prefix.py [--runs 3] [--hi 30]
"""

from __future__ import annotations

import argparse
import statistics
import time

from _common import matmul_peak, save


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--hi", type=int, default=30)
    args = parser.parse_args()

    import numpy as np

    from catalog.config import ScienceConfig
    from catalog.config.settings import get_settings
    from catalog.core.tokens import detect_number_tokens
    from catalog.measuring.grids import run_grid
    from catalog.measuring.prompts import build_prompts
    from catalog.sources import load_model, registry

    registry.fetch("qwen2.5-coder-0.5b", get_settings().ncat_home)
    lm = load_model("qwen2.5-coder-0.5b")
    model = lm.model
    config = ScienceConfig(operators=("+",), operand_hi=args.hi, shots=3)
    table = build_prompts(lm.tokenizer, detect_number_tokens(lm.tokenizer, prepend_bos=False),
                          config)
    layers = list(range(model.cfg.n_layers))
    times: dict[bool, list[float]] = {True: [], False: []}
    acts = {}
    for _ in range(args.runs):
        for reuse in (True, False):
            t = time.perf_counter()
            acts[reuse] = run_grid(model, table, layers, batch_size=256, reuse_prefix=reuse)
            times[reuse].append(time.perf_counter() - t)
    worst = max(float(np.abs(acts[True][la] - acts[False][la]).max()) for la in layers)
    scale = max(float(np.abs(acts[False][la]).max()) for la in layers)
    assert worst <= 1e-4 * max(1.0, scale), (worst, scale)
    # the blocks' weight matrices (the unembedding runs on the answer positions only)
    weights = sum(p.numel() for n, p in model.named_parameters()
                  if n.startswith("blocks.") and p.dim() >= 2)
    prefix = len(table.prefix_tokens[0])
    full_tokens = sum(len(t) for t in table.tokens)
    suffix_tokens = full_tokens - prefix * len(table) + prefix
    peak = matmul_peak()
    med = {k: statistics.median(v) for k, v in times.items()}
    save("prefix", {
        "prompts": len(table), "prefix_tokens": prefix,
        "tokens_per_prompt": full_tokens / len(table),
        "reuse_s": {"median": round(med[True], 2), "min": round(min(times[True]), 2),
                    "max": round(max(times[True]), 2)},
        "full_s": {"median": round(med[False], 2), "min": round(min(times[False]), 2),
                   "max": round(max(times[False]), 2)},
        "ratio_median": round(med[False] / med[True], 2),
        "max_abs_difference": worst,
        "matmul_peak_gflops": round(peak / 1e9, 1),
        "reuse_share_of_peak": round(2 * weights * suffix_tokens / med[True] / peak, 3),
        "full_share_of_peak": round(2 * weights * full_tokens / med[False] / peak, 3),
        "runs": args.runs,
    })


if __name__ == "__main__":
    main()
