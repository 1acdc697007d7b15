"""One prompt explained (catalog.explain): its cost after the model is loaded, against the
slow reference (one hooked forward per component, tests/reference.py), measured in the same
run.

The explanation without the knockout's seeds (issue 47's target: under 10 s for
Qwen2.5-Coder-0.5B on 2 CPU cores), median of --runs runs with the spread. The reference
is timed on a random sample of components (every head, 32 neurons) and scaled to every
component of the model (n_layers x (d_mlp + n_heads)): what the decomposition replaces.
Each sampled term is checked against the decomposition's on the way.

Run: .venv/bin/python bench/explain_prompt.py [--model qwen2.5-coder-0.5b] [--prompt 21+17=]
     [--runs 5] [--hi 30] [--shots 3] [--record]   (writes bench/results/explain_prompt.json)
"""

from __future__ import annotations

import argparse
import statistics
import time

from _common import RESULTS, ROOT, median_spread, save


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--prompt", default="21+17=")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--hi", type=int, default=30)
    parser.add_argument("--shots", type=int, default=3)
    parser.add_argument("--sample", type=int, default=32, help="neurons timed by the reference")
    parser.add_argument("--record", action="store_true",
                        help="also write bench/recorded/cpu_explain_prompt_<model>.json")
    args = parser.parse_args()

    import numpy as np
    import torch

    from catalog.config import ScienceConfig
    from catalog.config.settings import get_settings
    from catalog.explain.decompose import decompose
    from catalog.explain.prompt import build, explain
    from catalog.sources import load_model, registry

    from reference import reference_direct_effect

    if args.model in registry.KNOWN:
        registry.fetch(args.model, get_settings().ncat_home)
    t0 = time.perf_counter()
    lm = load_model(args.model)
    load_s = time.perf_counter() - t0
    model = lm.model
    config = ScienceConfig(operators=("+",), operand_hi=args.hi, shots=args.shots)
    times = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        e = explain(model, lm.tokenizer, args.prompt, config, seeds=0)
        times.append(time.perf_counter() - t0)
    p = build(model, lm.tokenizer, args.prompt, config)
    dec = decompose(model, p.tokens, p.answer, p.competitors)
    rng = np.random.default_rng(0)
    cfg = model.cfg
    comps = [("head", la, h) for la in range(cfg.n_layers) for h in range(cfg.n_heads)]
    heads_n = len(comps)
    comps += [("neuron", int(la), int(n)) for la, n in zip(
        rng.integers(0, cfg.n_layers, args.sample), rng.integers(0, cfg.d_mlp, args.sample),
        strict=True)]
    worst = 0.0
    t0 = time.perf_counter()
    head_s = neuron_s = 0.0
    for i, c in enumerate(comps):
        s = time.perf_counter()
        ref = reference_direct_effect(model, p.tokens, p.answer, p.competitors, c)
        took = time.perf_counter() - s
        if i < heads_n:
            head_s += took
        else:
            neuron_s += took
        got = dec.heads[c[1], c[2]] if c[0] == "head" else dec.neurons[c[1], c[2]]
        worst = max(worst, abs(got - ref))
    per_head, per_neuron = head_s / heads_n, neuron_s / args.sample
    naive_s = per_head * heads_n + per_neuron * cfg.n_layers * cfg.d_mlp
    median, spread = median_spread(times, 2)
    out = {
        "model": lm.info.name, "prompt": e.prompt, "config": {"hi": args.hi,
                                                               "shots": args.shots},
        "threads": torch.get_num_threads(), "load_s": round(load_s, 1),
        "explain_s": {"median": median, "spread": spread, "runs": [round(t, 3) for t in times]},
        "reference": {"per_head_s": round(per_head, 4), "per_neuron_s": round(per_neuron, 4),
                      "components": cfg.n_layers * (cfg.d_mlp + cfg.n_heads),
                      "every_component_s_estimated": round(naive_s, 1),
                      "sampled": len(comps), "largest_difference": worst,
                      "largest_term": float(max(np.abs(dec.neurons).max(),
                                                np.abs(dec.heads).max()))},
        "ratio_reference_over_explain": round(naive_s / statistics.median(times), 1),
        "answer": {"result": e.result, "predicted": e.predicted, "correct": e.correct,
                   "p": round(e.p_answer, 4), "target": round(e.target, 4),
                   "error": e.error, "shares": e.shares, "n_for": e.n_for},
    }
    save("explain_prompt", out)
    if args.record:
        import shutil

        shutil.copy(RESULTS / "explain_prompt.json",
                    ROOT / "bench" / "recorded" / f"cpu_explain_prompt_{args.model}.json")


if __name__ == "__main__":
    main()
