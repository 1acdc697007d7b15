"""Counterparts across training seeds of the built-in model (issue 83's figures).

The default built-in model trained from seeds 0, 1 and 2 (the seeds share everything but
the seed), each final checkpoint's neurons profiled on the demo's grid (`+ - * /` on
[0, 100)) and matched to every other seed's (catalog.counterparts.match). The null: the
three seeds' untrained checkpoints (step 0), pooled; a neuron has a counterpart in another
seed where its best similarity there exceeds the null's 99th percentile. Controls: two
fresh initialisations matched the same way (how often an unrelated model passes: the
level, 1%), and the same seed's step 2048 (one run: whether a neuron's counterpart is its
own index). Labels: each seed's final checkpoint measured under the demo's config without
the summary (its label rule); a neuron's families are those it carries on any operator.

Reported per seed and family: the share of labelled neurons with a counterpart in every
other seed (Wilson interval) beside unlabelled neurons' share; for matched neurons, how
often the counterpart carries a label of the same family, beside that family's share of
the other seed's neurons (the base rate).

    .venv/bin/python bench/counterparts_seeds.py [--record]

(bench/results/counterparts_seeds.json; --record: bench/recorded/cpu_counterparts_seeds.json)
"""

from __future__ import annotations

import argparse
import copy
import time

import numpy as np

from _common import save

SEEDS = (0, 1, 2)
LEVEL = 0.01


def families_of(result, d_mlp: int) -> list[set[str]]:
    """Per neuron (layer-major), the families it is labelled with on any operator."""
    out: list[set[str]] = []
    for layer in sorted(result.layers):
        m = result.layers[layer].matches
        fams: list[set[str]] = [set() for _ in range(d_mlp)]
        for i in np.nonzero(m.implements)[0]:
            fams[int(m.neuron[i])].add(m.row_heuristic(int(i)).family)
        out.extend(fams)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    import torch
    from transformer_lens import HookedTransformer

    from catalog import builtin, load_model, measure
    from catalog.core.stats import wilson
    from catalog.counterparts.match import counterparts, profiles
    from jobs.demo import DEMO_CONFIG

    t0 = time.perf_counter()
    for s in SEEDS:
        builtin.train(builtin.TrainConfig(seed=s))
    t_train = time.perf_counter() - t0
    config = DEMO_CONFIG
    name = {s: builtin.model_name(builtin.TrainConfig(seed=s)) for s in SEEDS}
    final, untrained, fams = {}, [], {}
    t0 = time.perf_counter()
    for s in SEEDS:
        lm = load_model(name[s])
        final[s] = profiles(lm.model, lm.tokenizer, config)
        z = load_model(name[s], 0)
        untrained.append(profiles(z.model, z.tokenizer, config))
    t_prof = time.perf_counter() - t0
    t0 = time.perf_counter()
    for s in SEEDS:
        lm = load_model(name[s])
        res = measure(lm.model, lm.tokenizer, config, progress=False, summary=False)
        fams[s] = families_of(res, lm.model.cfg.d_mlp)
    t_labels = time.perf_counter() - t0
    lm0 = load_model(name[0])

    def fresh(seed: int):
        cfg = copy.deepcopy(lm0.model.cfg)
        cfg.seed = seed
        torch.manual_seed(seed)
        return profiles(HookedTransformer(cfg, tokenizer=lm0.model.tokenizer), lm0.tokenizer,
                        config)

    t0 = time.perf_counter()
    got = {(s, t): counterparts(final[s], final[t], untrained, LEVEL)
           for s in SEEDS for t in SEEDS if s != t}
    t_match = time.perf_counter() - t0
    controls = {f"fresh init {k}": counterparts(final[0], fresh(k), untrained, LEVEL)
                for k in (101, 102)}
    same_run = load_model(name[0], 2048)
    run = counterparts(final[0], profiles(same_run.model, same_run.tokenizer, config),
                       untrained, LEVEL)
    own_index = run["match"].best == np.arange(len(run["has"]))

    def ci(k: int, n: int) -> dict:
        return {"count": k, "n": n, "share": k / n if n else None,
                "ci": [round(x, 4) for x in wilson(k, n)] if n else None}

    out: dict = {"level": LEVEL, "seeds": list(SEEDS),
                 "seconds": {"training (cached: 0)": round(t_train, 1),
                             "profiles, 6 checkpoints": round(t_prof, 1),
                             "labels, 3 checkpoints": round(t_labels, 1),
                             "6 ordered matches": round(t_match, 1)},
                 "pairs": {f"{s}->{t}": {**ci(g["count"], g["n"]),
                                         "threshold": round(g["threshold"], 4),
                                         "one_to_one_is_best": round(g["one_to_one_is_best"], 4)}
                           for (s, t), g in got.items()},
                 "controls (fresh initialisations, seed 0's neurons)": {
                     k: ci(g["count"], g["n"]) for k, g in controls.items()},
                 "same run: seed 0 final -> step 2048": {
                     **ci(run["count"], run["n"]),
                     "counterpart is its own index": ci(int((own_index & run["has"]).sum()),
                                                        int(run["has"].sum()))}}
    by_family: dict = {}
    for s in SEEDS:
        others = [t for t in SEEDS if t != s]
        every = np.logical_and.reduce([got[(s, t)]["has"] for t in others])
        labelled = np.array([bool(f) for f in fams[s]])
        rows = {"unlabelled": ci(int(every[~labelled].sum()), int((~labelled).sum())),
                "any label": ci(int(every[labelled].sum()), int(labelled.sum()))}
        for fam in sorted({f for fs in fams[s] for f in fs}):
            carry = np.array([fam in f for f in fams[s]])
            same, n_same, base = 0, 0, []
            for t in others:
                g = got[(s, t)]
                sel = carry & g["has"]
                best = g["match"].best[sel]
                same += sum(fam in fams[t][j] for j in best)
                n_same += int(sel.sum())
                base.append(np.mean([fam in f for f in fams[t]]))
            rows[fam] = {**ci(int(every[carry].sum()), int(carry.sum())),
                         "counterpart carries the family": ci(same, n_same),
                         "base rate of the family in the other seeds": round(
                             float(np.mean(base)), 4)}
        by_family[f"seed {s}"] = rows
    out["counterpart in every other seed, by family"] = by_family
    save("counterparts_seeds", out, "cpu_counterparts_seeds" if args.record else None)


if __name__ == "__main__":
    main()
