"""Full measurement of one checkpoint: every neuron, 4 operators, the full grid, 100 pairs
per operator, exact and attribution patching, all heuristic families, summary; timed per
phase, which is where the README's cost-per-checkpoint guidance comes from.

Run: .venv/bin/python bench/measure_checkpoint.py [operand_hi] [builtin|pythia]
(target for the built-in model on [0, 100): < 60 s on 2 cores). "pythia" is the offline
random model with Pythia-14m's shape (6 layers x 512 neurons); its timings are those of
the real model, whose weights only change the numbers measured.
"""

import sys
import time

from _common import offline_pythia, save  # first: it points the hub cache at a temp folder


def main(hi: int = 100, model: str = "builtin"):
    import torch

    from catalog import builtin
    from catalog.config import MeasureConfig
    from catalog.run import CheckpointRun
    from catalog.sources import load_model

    if model == "builtin":
        builtin.train(builtin.TrainConfig())
        lm = load_model("builtin")
    else:
        lm = load_model(offline_pythia(), 1000)
    config = MeasureConfig(operand_hi=hi, pairs_per_op=100)
    phases = {}
    t0 = time.perf_counter()
    prep = CheckpointRun(lm.model, lm.tokenizer, config).prepare()
    phases["prepare (prompts, grid pass, pairs)"] = time.perf_counter() - t0
    layers = {}
    for layer in range(lm.model.cfg.n_layers):
        t = time.perf_counter()
        layers[layer] = prep.run_layer(layer)
        phases[f"layer {layer}"] = time.perf_counter() - t
    t = time.perf_counter()
    prep.summarize({k: v.effect(prep.config.rank_sign) for k, v in layers.items()},
                   {k: v.matches for k, v in layers.items()})
    phases["summary (faithfulness, knockouts)"] = time.perf_counter() - t
    total = time.perf_counter() - t0
    save(f"measure_checkpoint_{model}_hi{hi}", {
        "model": lm.info.name, "operand_range": [0, hi], "prompts": len(prep.table),
        "neurons": lm.model.cfg.n_layers * lm.model.cfg.d_mlp,
        "score_rows": int(sum(len(v.matches) for v in layers.values())),
        "phases_s": {k: round(v, 2) for k, v in phases.items()},
        "total_s": round(total, 1), "threads": torch.get_num_threads()})


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100,
         sys.argv[2] if len(sys.argv) > 2 else "builtin")
