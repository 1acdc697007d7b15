"""The token-format control (catalog.labels.controls) depends on the config, the operator's
cells and the tokenizer, not on the checkpoint: a process that measures a second checkpoint
of the same model takes its counts from the first, and they are the counts the rule gives
when it runs again."""

import dataclasses

import pytest

from catalog import builtin
from catalog.config import ScienceConfig
from catalog.labels import controls
from catalog.run.checkpoint import CheckpointRun
from catalog.sources import load_model

CONFIG = ScienceConfig(operators=("+", "*"), operand_hi=20, patching=("attribution",),
                       exact="none", spectra=False)


@pytest.fixture
def counted(monkeypatch):
    """Each call of the rule on format maps (K and KV maps one tensor) and on the
    relabelled-values control's maps (two tensors)."""
    calls = {"format": 0, "relabelled": 0}
    real = controls.result_labelled_maps

    def spy(k_map, kv, *args, **kwargs):
        calls["format" if k_map is kv else "relabelled"] += 1
        return real(k_map, kv, *args, **kwargs)

    monkeypatch.setattr(controls, "result_labelled_maps", spy)
    monkeypatch.setattr(controls, "_FORMAT_COUNTS", type(controls._FORMAT_COUNTS)())
    return calls


def _controls(tiny_builtin, step: int, config: ScienceConfig = CONFIG) -> dict:
    cfg, root = tiny_builtin
    lm = load_model(builtin.model_name(cfg), step, cache_root=root, progress=False)
    run = CheckpointRun(lm.model, lm.tokenizer, config).prepare()
    return {layer: run.run_layer(layer).label_control for layer in run.layers}


def test_a_second_checkpoint_takes_the_format_counts_of_the_first(tiny_builtin, counted):
    steps = tiny_builtin[0].checkpoint_steps()
    first = _controls(tiny_builtin, steps[-1])
    n_layer_ops = len(first) * len(CONFIG.operators)
    assert counted == {"format": n_layer_ops, "relabelled": n_layer_ops}
    second = _controls(tiny_builtin, steps[0])
    # the relabelled-values control scores this checkpoint's maps; the format maps are
    # the first checkpoint's, counted once
    assert counted == {"format": n_layer_ops, "relabelled": 2 * n_layer_ops}
    fmt = ("format_labelled", "format_result", "format_n")
    for layer, per_op in second.items():
        for op, got in per_op.items():
            assert {k: got[k] for k in fmt} == {k: first[layer][op][k] for k in fmt}
            assert got["format_n"] > 0
    # the counts kept are the counts the rule gives on that checkpoint's run, run again
    controls._FORMAT_COUNTS.clear()
    again = _controls(tiny_builtin, steps[0])
    assert counted["format"] == 2 * n_layer_ops
    assert again == second
    # a config that changes the rule's inputs is counted anew, not taken from the others
    other = dataclasses.replace(CONFIG, seed=CONFIG.seed + 1)
    _controls(tiny_builtin, steps[0], other)
    assert counted["format"] == 3 * n_layer_ops
