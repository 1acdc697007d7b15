"""What the knockout's controls and the total effects cost one explained prompt (issue 77:
at most 2x, Qwen2.5-Coder-0.5B on 2 CPU cores, median of 5).

In one run, on the same prompt and labels, alternating:

- before: the explanation as issue 47 left it: the direct decomposition with labels and
  no total effects (``explain(..., seeds=0, total=False)``), then its knockout, as that
  code ran it: the clean prompt, the knockout set and 5 random draws, each one full
  forward with the neurons zeroed (this file's ``old_knockout``, the naive reference);
- now: ``explain(..., seeds=5)``: the same plus the total effects (one backward) and the
  knockout beside its four controls (5 + 5 + 1 + 5 sets), their rows run at the last
  position only against the prompt's cached keys and values.

The labels come from bench/explain_grid.py's run of the same model (its pickle in
bench/results); without it, random labels of the same count per layer (the cost does not
depend on what the labels are).

Run: .venv/bin/python bench/explain_controls.py [--model qwen2.5-coder-0.5b]
     [--prompt 21+17=] [--runs 5] [--hi 30] [--shots 3] [--record]
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import time

from _common import RESULTS, ROOT, median_spread, save


def old_knockout(model, tokens, answer, sets) -> list[float]:
    """The knockout as catalog 0.10 ran it: one full forward per set (the clean prompt
    first), the set's neurons zeroed at every position."""
    import torch

    out = []
    toks = torch.as_tensor(tokens, dtype=torch.long)[None]
    for s in [[]] + sets:
        by_layer: dict[int, list[int]] = {}
        for layer, n in s:
            by_layer.setdefault(layer, []).append(n)

        def hook_for(idx):
            def hook(post, hook):
                post[..., idx] = 0.0
                return post
            return hook
        with torch.no_grad():
            logits = model.run_with_hooks(toks, fwd_hooks=[
                (f"blocks.{la}.mlp.hook_post", hook_for(torch.as_tensor(ns)))
                for la, ns in by_layer.items()])[0, -1].double()
        out.append(float(logits.softmax(-1)[answer]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--prompt", default="21+17=")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--hi", type=int, default=30)
    parser.add_argument("--shots", type=int, default=3)
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()

    import numpy as np
    import torch

    from catalog.config import ScienceConfig
    from catalog.config.settings import get_settings
    from catalog.explain.prompt import build, explain
    from catalog.sources import load_model, registry

    if args.model in registry.KNOWN:
        registry.fetch(args.model, get_settings().ncat_home)
    lm = load_model(args.model)
    model = lm.model
    config = ScienceConfig(operators=("+",), operand_hi=args.hi, shots=args.shots)
    path = RESULTS / f"explain_grid_{args.model.replace('/', '_')}_labels.pkl"
    if path.exists():
        labels = pickle.loads(path.read_bytes())
        source = str(path.relative_to(ROOT))
    else:
        rng = np.random.default_rng(0)
        # a result range that holds for the prompt, so that the knockout and its
        # controls run (labels that do not hold leave nothing to knock out)
        from catalog.explain.syntax import parse
        from catalog.labels.heuristics import Heuristic

        a, op, b = parse(args.prompt, config)
        result = {"+": a + b, "-": a - b, "*": a * b, "/": a // max(b, 1)}[op]
        h = Heuristic("range", "result", (result // 10 * 10, 10))  # (start, width)
        labels = {(int(la), int(n)): [h] for la in range(model.cfg.n_layers)
                  for n in rng.choice(int(model.cfg.d_mlp), int(model.cfg.d_mlp) // 2, False)}
        source = f"random neurons, half of each layer, labelled {h.key} (holds)"
    p = build(model, lm.tokenizer, args.prompt, config)
    before, now, e = [], [], None
    for _ in range(args.runs):
        t0 = time.perf_counter()
        e0 = explain(model, lm.tokenizer, args.prompt, config, labels=labels, seeds=0,
                     total=False)
        rng = np.random.default_rng(0)
        knock = [(r.layer, r.neuron) for r in e0.toward[:10]]
        sets = [knock] + [[(la, int(rng.integers(model.cfg.d_mlp))) for la, _ in knock]
                          for _ in range(5)]
        old_knockout(model, p.tokens, p.answer, sets)
        before.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        e = explain(model, lm.tokenizer, args.prompt, config, labels=labels, seeds=5)
        now.append(time.perf_counter() - t0)
    assert e is not None
    ratios = [b / a for a, b in zip(before, now, strict=True)]
    out = {"model": lm.info.name, "prompt": args.prompt, "labels": source,
           "n_labelled": len(labels), "threads": torch.get_num_threads(),
           "before_s": dict(zip(("median", "spread"), median_spread(before, 2), strict=True)),
           "now_s": dict(zip(("median", "spread"), median_spread(now, 2), strict=True)),
           "ratio_median": round(statistics.median(now) / statistics.median(before), 2),
           "ratio_per_run": dict(zip(("median", "spread"), median_spread(ratios, 2),
                                     strict=True)),
           "knockout": None if e.knockout is None else {
               "neurons": len(e.knockout.neurons), "p_clean": e.knockout.p_clean,
               "p_knocked": e.knockout.p_knocked, "label_adds": e.knockout.label_adds,
               "controls": {k: v.p_mean for k, v in e.knockout.controls.items()}},
           "runs": {"before": [round(x, 3) for x in before], "now": [round(x, 3) for x in now]}}
    save(f"explain_controls_{args.model.replace('/', '_')}", out)
    print(out)
    if args.record:
        import shutil
        name = f"explain_controls_{args.model.replace('/', '_')}.json"
        shutil.copy(RESULTS / name, ROOT / "bench" / "recorded" / f"cpu_{name}")


if __name__ == "__main__":
    main()
