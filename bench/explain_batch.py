"""A checkpoint summary's prompt explanations (catalog.explain.grid.explain_prompts): their
cost on a real model against the forward passes they cannot avoid.

Every explained prompt needs one forward of the model over it; the decomposition then adds
one product per layer with W_out and W_O (float64) over the batch. The floor measured here
is the same prompts' plain forwards, batched the same way (by token count, 128 at a time),
interleaved with the explanation runs: median of --runs runs each, with the spread.

Run: .venv/bin/python bench/explain_batch.py [--model qwen2.5-coder-0.5b] [--prompts 142]
     [--hi 30] [--shots 3] [--runs 3] [--record]
(writes bench/results/explain_batch.json; --record also to
bench/recorded/cpu_explain_batch_<model>.json)
"""

from __future__ import annotations

import argparse
import shutil
import time

import numpy as np

from _common import RESULTS, ROOT, median_spread, save


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--prompts", type=int, default=142,
                        help="prompts explained (a Qwen summary's knockout draws: 142)")
    parser.add_argument("--hi", type=int, default=30)
    parser.add_argument("--shots", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()

    import torch

    from catalog.config import ScienceConfig
    from catalog.config.settings import get_settings
    from catalog.explain.grid import explain_prompts
    from catalog.explain.prompt import build_many
    from catalog.sources import load_model, registry

    if args.model in registry.KNOWN:
        registry.fetch(args.model, get_settings().ncat_home)
    lm = load_model(args.model, progress=False)
    model = lm.model
    config = ScienceConfig(operators=("+",), operand_hi=args.hi, shots=args.shots)
    rng = np.random.default_rng(0)
    cells = rng.choice(args.hi * args.hi, size=min(args.prompts, args.hi ** 2), replace=False)
    a, b = cells // args.hi, cells % args.hi
    prompts = build_many(model, lm.tokenizer, "+", a, b, config)
    lengths = np.array([len(p.tokens) for p in prompts])

    @torch.no_grad()
    def forwards() -> None:
        for length in np.unique(lengths):
            idx = np.nonzero(lengths == length)[0]
            for start in range(0, len(idx), 128):
                sel = idx[start:start + 128]
                model(torch.as_tensor(np.stack([prompts[i].tokens for i in sel])))

    explain_s, forward_s = [], []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        terms = explain_prompts(model, lm.tokenizer, config, "+", a, b, {})
        explain_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        forwards()
        forward_s.append(time.perf_counter() - t0)
    e_med, e_spread = median_spread(explain_s, 1)
    f_med, f_spread = median_spread(forward_s, 1)
    out = {"model": lm.info.name, "prompts": len(prompts), "lengths": sorted(
               {int(x) for x in lengths}), "config": {"hi": args.hi, "shots": args.shots},
           "threads": torch.get_num_threads(),
           "explain_s": {"median": e_med, "spread": e_spread, "runs": explain_s},
           "forward_s": {"median": f_med, "spread": f_spread, "runs": forward_s},
           "ratio_to_forwards": round(float(np.median(explain_s) / np.median(forward_s)), 2),
           "per_prompt_s": round(float(np.median(explain_s)) / len(prompts), 3),
           "median_target": float(np.median(terms.target))}
    save("explain_batch", out)
    if args.record:
        shutil.copy(RESULTS / "explain_batch.json",
                    ROOT / "bench" / "recorded" / f"cpu_explain_batch_{args.model}.json")


if __name__ == "__main__":
    main()
