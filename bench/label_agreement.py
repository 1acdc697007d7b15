"""Does every result label agree with the comparison stored beside it? (issue 78)

One checkpoint run of a model (the built-in model's last checkpoint by default) under the
default science config (or --hi, --ops), every layer: for each (layer, neuron, operator)
with a result label that stands, the stored held-out comparison (``kv_fit_other``, the
best rival with the operands, against ``kv_fit_joint``, the own result with them, as the
store keeps them in float32) must not favour the rival. Prints and writes the counts per
operator, the labelled maps' best rivals by name, and how many value-labelled maps the
rivals took.

Run: .venv/bin/python bench/label_agreement.py [--model builtin] [--hi 100] [--ops +,-,*,/]
     [--record]   (bench/results/label_agreement_<model>.json; --record: bench/recorded/)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import numpy as np

from _common import RESULTS, ROOT, save


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin")
    parser.add_argument("--hi", type=int, default=None)
    parser.add_argument("--ops", default=None)
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()

    from catalog.config import ScienceConfig
    from catalog.run.checkpoint import CheckpointRun
    from catalog.sources import load_model

    config = ScienceConfig()
    if args.hi is not None:
        config = dataclasses.replace(config, operand_hi=args.hi)
    if args.ops is not None:
        config = dataclasses.replace(config, operators=tuple(args.ops.split(",")))
    t0 = time.perf_counter()
    lm = load_model(args.model)
    run = CheckpointRun(lm.model, lm.tokenizer, config).prepare()
    per_op = {op: {"result_labelled_maps": 0, "agree": 0} for op in config.operators}
    rivals: dict[str, int] = {}
    taken = {op: 0 for op in config.operators}
    for layer in run.layers:
        res = run.run_layer(layer)
        m, ex = res.matches, res.explanations
        assert ex is not None, "the config's labels are not gated"
        is_r = np.array([h.target == "result" and h.family != "multi_result"
                         for h in m.heuristics] or [False])[m.heuristic]
        for o, op in enumerate(config.operators):
            sel = m.implements & is_r & (m.op == o)
            maps = np.unique(m.neuron[sel])
            joint = ex["kv_fit_joint"][maps, o].astype(np.float32)
            other = np.nan_to_num(ex["kv_fit_other"][maps, o], nan=-np.inf).astype(np.float32)
            per_op[op]["result_labelled_maps"] += int(len(maps))
            per_op[op]["agree"] += int((other <= joint).sum())
            for name in ex["kv_fit_other_op"][maps, o]:
                rivals[str(name)] = rivals.get(str(name), 0) + 1
            explained = np.nonzero(np.isfinite(ex["kv_fit_joint"][:, o]))[0]
            lost = np.setdiff1d(explained, maps)
            won = (np.nan_to_num(ex["kv_fit_other"][lost, o], nan=-np.inf)
                   > ex["kv_fit_joint"][lost, o])
            taken[op] += int(won.sum())
        run.release(layer)
        print(f"layer {layer}: {per_op}", flush=True)
    out = {"model": lm.info.name, "step": lm.info.step if hasattr(lm.info, "step") else None,
           "config": dataclasses.asdict(config), "per_operator": per_op,
           "best_rival_of_labelled_maps": rivals,
           "explained_maps_a_rival_predicts_better": taken,
           "seconds": round(time.perf_counter() - t0, 1)}
    name = args.model.replace("/", "_")
    save(f"label_agreement_{name}", out)
    print(json.dumps({k: out[k] for k in ("per_operator", "best_rival_of_labelled_maps",
                                          "explained_maps_a_rival_predicts_better")}, indent=1))
    if args.record:
        (ROOT / "bench" / "recorded" / f"cpu_label_agreement_{name}.json").write_text(
            (RESULTS / f"label_agreement_{name}.json").read_text())


if __name__ == "__main__":
    main()
