"""A layer's rows do not depend on what the process measured before it.

Workers measure the layers of one checkpoint in whatever order their tasks arrive, each
in a process that may have measured other layers first; a single-process run measures
them in order. Both must store the same bits (the chaos test compares checksums). The
label gate keeps per-process state (``OperandFit.sets``, the cell sets of the heuristics
tested so far, in the order they were first asked for); a layer's p-values used to carry
the last bits of that order (a matrix product over the sets in cache order).
"""

import numpy as np

from catalog.config import ScienceConfig
from catalog.run.checkpoint import CheckpointRun
from catalog.sources import load_model


def _rows(matches) -> list[tuple]:
    m = matches
    keys = [m.heuristics[h].key for h in m.heuristic]
    return sorted(zip(m.neuron.tolist(), m.op.tolist(), keys, m.bottom.tolist(),
                      m.score.tolist(), m.p_value.tolist(), m.implements.tolist(),
                      strict=True))


def test_each_layer_is_bitwise_the_same_in_any_order_of_measurement(tiny_builtin):
    cfg, root = tiny_builtin
    # a config and checkpoint where the order showed in the last bits of a gated p-value
    config = ScienceConfig(operand_hi=12, pairs_per_op=10, faithfulness_prompts=30)

    def measured(order: list[int]) -> dict[int, list[tuple]]:
        lm = load_model("builtin", 128, builtin_config=cfg, cache_root=root)
        run = CheckpointRun(lm.model, lm.tokenizer, config).prepare()
        return {layer: _rows(run.run_layer(layer).matches) for layer in order}

    layers = list(range(cfg.n_layers))
    forward, backward = measured(layers), measured(layers[::-1])
    for layer in layers:
        gated = [r for r in forward[layer] if ":result" in r[2]]
        # the gate ran on this layer: result rows with a p-value of their own
        assert gated and np.isfinite([r[5] for r in gated]).all(), layer
        assert forward[layer] == backward[layer], layer
