"""Wrong answers across the default built-in model's training seeds (issue 83;
catalog.explain.wrong_answers): at each seed's final checkpoint, on the demo's grid
(`+ - * /` on [0, 100)), which labelled neurons push what the model writes where it is
wrong (against the labels placed at random), and whether the other seeds fail on the
same prompts (against each seed's error rate per decile of the result's size).

    .venv/bin/python bench/wrong_answers.py [--seeds 0,1,2] [--placements 20] [--record]

The seeds must be trained (`ncat train-builtin --seeds 0,1,2`). Labels come from
measuring each final checkpoint with the demo's config (``catalog.measure``), as the
demo's catalog holds them. Writes bench/results/wrong_answers.json (--record:
bench/recorded/cpu_wrong_answers_seeds.json).
"""

from __future__ import annotations

import argparse
import itertools
import time

from _common import save


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--placements", type=int, default=20)
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()

    from catalog import load_model, measure
    from catalog.builtin import TrainConfig, model_name
    from catalog.explain.holds import labels_from_result, typical_of
    from catalog.explain.wrong_answers import (
        result_strata,
        shared_failures,
        written,
        wrong_split,
    )
    from jobs.demo import DEMO_CONFIG

    seeds = [int(s) for s in args.seeds.split(",")]
    config = DEMO_CONFIG
    got: dict[int, dict] = {}
    out: dict = {"config": config.config_hash(), "operand_hi": config.operand_hi,
                 "placements": args.placements, "seeds": {}}
    for seed in seeds:
        t0 = time.perf_counter()
        name = model_name(TrainConfig(seed=seed))
        lm = load_model(name)
        res = measure(lm.model, lm.tokenizer, config, progress=False)
        per_op = {}
        got[seed] = {}
        for o, op in enumerate(config.operators):
            answers = written(lm.model, lm.tokenizer, config, op)
            got[seed][op] = answers
            typical, typical_kv = typical_of(res.layers, o)
            per_op[op] = wrong_split(lm.model, answers, labels_from_result(res, op), typical,
                                     typical_kv, placements=args.placements, seed=seed)
        out["seeds"][seed] = {"model": name, "step": lm.info.checkpoint, "ops": per_op,
                              "seconds": time.perf_counter() - t0}
        print(f"seed {seed}: {time.perf_counter() - t0:.0f} s", flush=True)
    out["shared"] = {}
    for op in config.operators:
        for i, j in itertools.permutations(seeds, 2):
            wi, wj = got[i][op], got[j][op]
            out["shared"][f"{op} {i}->{j}"] = shared_failures(
                wi.wrong, wj.wrong, result_strata(wi.result), wi.top, wj.top)
    save("wrong_answers", out, "cpu_wrong_answers_seeds" if args.record else None)


if __name__ == "__main__":
    main()
