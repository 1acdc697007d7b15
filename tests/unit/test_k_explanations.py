"""The K maps' held-out explanations are computed only when asked (issue 79): they decide
no label, and cost about 8% of a demo checkpoint. Off (the default, the worker's and the
demo's way), the labels, scores, effects and the KV maps' explanations are those of a run
that computes them, to the bit; the K columns are NaN (NULL when stored) exactly where the
run that asks has numbers."""

import numpy as np

from catalog import ExecutionConfig, ScienceConfig, measure
from catalog.config.vocab import FIT_COLS, FIT_OP_COLS
from catalog.sources import load_model

from tiny_model import TINY

K_COLS = [c for c in (*FIT_COLS, *FIT_OP_COLS) if not c.startswith("kv_")]


def _rows(lr) -> list:
    m = lr.matches
    return sorted((int(m.neuron[i]), int(m.op[i]), m.row_heuristic(i).key,
                   bool(m.implements[i]), float(m.score[i])) for i in range(len(m)))


def test_k_explanations_only_when_asked_and_nothing_else_changes(tiny_builtin):
    _, root = tiny_builtin
    lm = load_model("builtin", None, builtin_config=TINY, cache_root=root)
    config = ScienceConfig(operand_hi=20, operators=("+", "*"))
    runs = {k: measure(lm.model, lm.tokenizer, config, layers=None,
                       execution=ExecutionConfig(k_explanations=k),
                       progress=False) for k in (False, True)}
    off, on = runs[False], runs[True]
    explained = 0
    for layer, a in off.layers.items():
        b = on.layers[layer]
        assert _rows(a) == _rows(b), layer
        np.testing.assert_array_equal(a.rank_value, b.rank_value)
        assert a.explanations is not None and b.explanations is not None
        for c in (*FIT_COLS, *FIT_OP_COLS):
            if c in K_COLS:
                continue
            np.testing.assert_array_equal(a.explanations[c], b.explanations[c], err_msg=c)
        asked = np.isfinite(b.explanations["kv_fit_joint"])
        explained += int(asked.sum())
        # asked: a K explanation wherever the KV map has one; not asked: none at all
        assert np.isfinite(b.explanations["fit_joint"][asked]).all()
        assert np.isfinite(b.explanations["fit_operands"][asked]).all()
        for c in K_COLS:
            got = a.explanations[c]
            assert (np.isnan(got) if got.dtype.kind == "f" else got == "").all(), c
    assert explained > 0  # the comparison covered explained maps
    assert off.summary.faithfulness == on.summary.faithfulness
