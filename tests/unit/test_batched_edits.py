"""The summary's prompt explanations (knockouts against their controls, the null
placements, steering) run many edits per forward (``catalog.circuits.knockouts.
PromptEvaluator.many``). Each edit's answers must be those of the edit run alone: the
tiny built-in model's summary with every request in its own forward gives the same
figures, number for number."""

import math

import numpy as np

from catalog import ScienceConfig
from catalog.circuits import knockouts
from catalog.run.checkpoint import CheckpointRun
from catalog.sources import load_model


def _walk(x, y, path=()):
    """Every leaf of two nested results that differs (floats to 1e-9 relative)."""
    if isinstance(x, dict):
        assert isinstance(y, dict) and x.keys() == y.keys(), path
        for k in x:
            yield from _walk(x[k], y[k], (*path, k))
    elif isinstance(x, (list, tuple)):
        assert isinstance(y, (list, tuple)) and len(x) == len(y), path
        for i, (u, v) in enumerate(zip(x, y, strict=True)):
            yield from _walk(u, v, (*path, i))
    elif isinstance(x, float):
        if not (math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)
                or (math.isnan(x) and math.isnan(y))):
            yield path, x, y
    elif x != y:
        yield path, x, y


def test_edits_run_together_give_each_edits_own_answers(tiny_builtin, monkeypatch):
    config, root = tiny_builtin
    lm = load_model("builtin", None, builtin_config=config, cache_root=root)
    run = CheckpointRun(lm.model, lm.tokenizer,
                        ScienceConfig(operand_hi=20, operators=("+", "*"))).prepare()
    digests = {layer: run.run_layer(layer).digest(run.config.rank_sign)
               for layer in run.layers}
    calls: list[int] = []
    original = knockouts.PromptEvaluator.many

    def counted(self, requests):
        calls.append(len(requests))
        return original(self, requests)

    monkeypatch.setattr(knockouts.PromptEvaluator, "many", counted)
    together = run.summarize_digests(digests).prompt_explanations
    batched = list(calls)

    def alone(self, requests):
        return [knockouts.zeroed_answers_many(self.model, self.table, self.prompts, [r],
                                              self.runner)[0] for r in requests]

    monkeypatch.setattr(knockouts.PromptEvaluator, "many", alone)
    apart = run.summarize_digests(digests).prompt_explanations
    # the figures exist, and the batched run put many edits in one call
    assert together.keys() == {"+", "*"}
    assert all(by["knockouts"] and by["steering"] for by in together.values())
    assert max(batched) >= 10 and sum(batched) > 3 * len(batched)
    assert list(_walk(together, apart)) == []
    # and each request's answers are what the old one-call path gives (zeroed_answers)
    prompts = np.arange(0, len(run.table), 7)[:40]
    prompts = prompts[run.table.op[prompts] == run.table.op[prompts[0]]]
    shape = (lm.model.cfg.n_layers, run.d_mlp)
    rng = np.random.default_rng(0)
    mask = rng.random((len(prompts), *shape)) < 0.3
    want = knockouts.zeroed_answers(lm.model, run.table, prompts, mask)
    got = knockouts.PromptEvaluator(lm.model, run.table, prompts)(mask)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(got[2], want[2])
