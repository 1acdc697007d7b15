"""Full measurement of one built-in checkpoint: every neuron, 4 operators, the full grid,
100 pairs per operator, exact and attribution patching, all heuristic families, summary.

Run: .venv/bin/python bench/measure_checkpoint.py [operand_hi]   (target: < 60 s, 2 cores)
"""

import sys
import time

import torch

from catalog import builtin
from catalog.config import MeasureConfig
from catalog.measurement import measure_layer, prepare, summarize
from catalog.sources import load_model

from _common import save


def main(hi: int = 100):
    builtin.train(builtin.TrainConfig())
    lm = load_model("builtin")
    config = MeasureConfig(operand_hi=hi, pairs_per_op=100)
    phases = {}
    t0 = time.perf_counter()
    prep = prepare(lm.model, lm.tokenizer, config)
    phases["prepare (prompts, grid pass, pairs)"] = time.perf_counter() - t0
    layers = {}
    for layer in range(lm.model.cfg.n_layers):
        t = time.perf_counter()
        layers[layer] = measure_layer(lm.model, prep, layer)
        phases[f"layer {layer}"] = time.perf_counter() - t
    t = time.perf_counter()
    summarize(lm.model, prep, {k: v.effect for k, v in layers.items()},
              {k: v.matches for k, v in layers.items()})
    phases["summary (faithfulness, knockouts)"] = time.perf_counter() - t
    total = time.perf_counter() - t0
    save(f"measure_checkpoint_hi{hi}", {
        "operand_range": [0, hi], "prompts": len(prep.table),
        "neurons": lm.model.cfg.n_layers * lm.model.cfg.d_mlp,
        "score_rows": int(sum(len(v.matches) for v in layers.values())),
        "phases_s": {k: round(v, 2) for k, v in phases.items()},
        "total_s": round(total, 1), "threads": torch.get_num_threads()})


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100)
