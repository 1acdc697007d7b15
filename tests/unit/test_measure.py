"""The measure entry point: every stored number checked against a direct computation."""

import numpy as np
import pytest
import torch

from catalog.config import ScienceConfig
from catalog.core.tokens import number_token_ids
from catalog.run.measurement import measure
from catalog.sources import load_model

from offline_models import write_llama_gguf
from reference import reference_score

CONFIG = ScienceConfig(operand_hi=20, pairs_per_op=10, faithfulness_prompts=50)


@pytest.fixture(scope="module")
def tiny(tiny_builtin):
    cfg, root = tiny_builtin
    lm = load_model("builtin", builtin_config=cfg, cache_root=root)
    return lm, measure(lm.model, lm.tokenizer, CONFIG, progress=False)


def test_grids_and_correctness_equal_a_plain_forward(tiny):
    lm, res = tiny
    table = res.table
    idx = np.arange(0, len(table), 37)
    logits, cache = lm.model.run_with_cache(torch.from_numpy(table.token_matrix(idx)))
    for layer in (0, 1):
        direct = cache[f"blocks.{layer}.mlp.hook_post"][:, -1].numpy()
        np.testing.assert_allclose(res.layers[layer].acts[idx], direct, rtol=1e-5, atol=1e-6)
    assert np.array_equal(table.correct[idx], logits[:, -1].argmax(-1).numpy() == table.answer[idx])
    for o, op in enumerate(CONFIG.operators):
        assert res.summary.accuracy[op] == pytest.approx(table.correct[table.op_index(op)].mean())
        k = res.layers[1].acts[table.op_index(op)]
        np.testing.assert_allclose(res.layers[1].max_act[:, o], k.max(0))


def test_lens_equals_value_vectors_times_unembedding(tiny):
    lm, res = tiny
    lens = res.layers[1].lens
    full = (lm.model.W_out[1] @ lm.model.W_U).detach().numpy()
    ids = number_token_ids(lm.tokenizer, 999)
    np.testing.assert_allclose(lens.numbers, full[:, ids], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lens.top_values, -np.sort(-full, axis=1)[:, :10], rtol=1e-5,
                               atol=1e-6)
    assert (full[np.arange(full.shape[0])[:, None], lens.bottom_ids] == lens.bottom_values).all()


def test_ranks_and_stored_scores_are_consistent(tiny):
    _, res = tiny
    table = res.table
    layer = res.layers[1]
    for o in range(4):
        best = np.argmin(layer.rank[:, o])
        assert layer.rank[best, o] == 0
        # default rule: by |10%-trimmed mean of the log-space effect|, exact everywhere here
        assert layer.is_exact[:, o].all()
        np.testing.assert_array_equal(layer.rank_value[:, o], layer.effect_trimmed[:, o])
        assert abs(layer.rank_value[best, o]) == np.nanmax(np.abs(layer.rank_value[:, o]))
        order = np.argsort(layer.rank[:, o])
        assert (np.diff(np.abs(layer.rank_value[order, o])) <= 0).all()
    m = layer.matches
    assert len(m) > 0 and (m.score >= CONFIG.score_floor).all()
    rng = np.random.default_rng(0)
    for i in rng.choice(len(m), 25, replace=False):
        op = CONFIG.operators[m.op[i]]
        idx = table.op_index(op)
        h = m.row_heuristic(i)
        values = layer.kv(idx)[m.neuron[i]] if h.direct else layer.acts[idx, m.neuron[i]]
        member = h.contains(table.a[idx], table.b[idx], table.result[idx])
        if h.family != "multi_result":
            assert reference_score(values, member) == pytest.approx(float(m.score[i]), abs=1e-6)


def test_same_inputs_give_the_same_rows(tiny):
    lm, res = tiny
    again = measure(lm.model, lm.tokenizer, CONFIG, layers=[1], progress=False)
    a, b = res.layers[1], again.layers[1]
    # a summary over the measured layer only, saying so
    assert again.summary is not None and again.summary.layers == [1]
    usable = again.table.usable()
    assert again.summary.n_pairs == {
        op: min(CONFIG.pairs_per_op, int(usable[again.table.op_index(op)].sum()))
        for op in CONFIG.operators}
    np.testing.assert_array_equal(a.acts, b.acts)
    np.testing.assert_array_equal(a.effect_exact, b.effect_exact)
    np.testing.assert_array_equal(a.effect_attr, b.effect_attr)
    np.testing.assert_array_equal(a.matches.score, b.matches.score)
    assert [h.key for h in a.matches.heuristics] == [h.key for h in b.matches.heuristics]
    assert res.provenance["config_hash"] == again.provenance["config_hash"]


def test_batch_sizes_change_no_number_and_not_the_config_hash(tiny, monkeypatch):
    """batch_size and patch_chunk trade memory for speed only: a small GPU's worker may
    lower them and still fill the same catalog rows."""
    import dataclasses

    from catalog.config import ExecutionConfig
    from catalog.config.settings import SettingsError
    from jobs.runner import execution_for
    from schema.jobs import JobRow

    lm, res = tiny
    small = ExecutionConfig(batch_size=37, patch_chunk=5)
    again = measure(lm.model, lm.tokenizer, CONFIG, layers=[0, 1], progress=False,
                    execution=small)
    for layer in (0, 1):
        a, b = res.layers[layer], again.layers[layer]
        np.testing.assert_allclose(a.acts, b.acts, atol=1e-5)
        # a chunk's rows attend to their pair's keys in one product whose shape the chunk
        # sets (catalog.measuring.single_position): float32 rounding, relative (effects reach 129
        # here, expm1 of log-probability differences; 1.3e-6 relative measured)
        np.testing.assert_allclose(a.effect_exact, b.effect_exact, atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(a.effect_attr, b.effect_attr, atol=1e-5)
        assert [h.key for h in a.matches.heuristics] == [h.key for h in b.matches.heuristics]
        np.testing.assert_array_equal(a.matches.heuristic, b.matches.heuristic)
        np.testing.assert_allclose(a.matches.score, b.matches.score, atol=1e-6)
    assert dataclasses.replace(CONFIG, pairs_per_op=11).config_hash() != CONFIG.config_hash()
    assert "batch_size" not in CONFIG.as_dict()  # execution is never part of the hash

    job = JobRow(1, "m", None, 1, [0], "cpu", False, "queued", None)
    monkeypatch.setenv("NCAT_BATCH_SIZE", "256")
    monkeypatch.setenv("NCAT_PATCH_CHUNK", "8")
    mine = execution_for(job)
    assert (mine.batch_size, mine.patch_chunk, mine.device) == (256, 8, "cpu")
    monkeypatch.setenv("NCAT_PATCH_CHUNK", "0")
    with pytest.raises(SettingsError, match="NCAT_PATCH_CHUNK='0': input should be greater"):
        execution_for(job)


def test_summary_numbers(tiny):
    lm, res = tiny
    s = res.summary
    # the MIB levels (0.1% ... 100%) of 64 neurons; below 1/64 they share k = 1
    assert s.circuit_sizes == [1, 2, 4, 7, 13, 32, 64]
    assert set(s.faithfulness) == set(CONFIG.operators)
    assert all(len(curve) == 7 for curve in s.faithfulness.values())
    # one paper curve per operator, with both controls at every distinct level, 3 metrics
    assert [(c.protocol, c.op) for c in s.curves] == [("paper", op) for op in CONFIG.operators]
    for c in s.curves:
        assert len(c.points) == 3 * 3 * 7 and c.seeds == 3
        assert c.plan.whole == [0] and c.plan.pruned == [1]  # MLP 0 is never pruned
        assert set(c.areas) == {"ranked", "random", "reversed"}
    assert set(s.components) == set(CONFIG.operators)
    assert all(len(v["median_rank"]) == 2 for v in s.residual_lens.values())
    assert s.n_pairs["+"] == min(10, s.n_correct["+"])


def test_bad_layers_are_refused(tiny):
    lm, _ = tiny
    with pytest.raises(ValueError, match=r"layers \[2\] do not exist; this model has layers 0..1"):
        measure(lm.model, lm.tokenizer, CONFIG, layers=[0, 2], progress=False)
    with pytest.raises(ValueError, match="layers is empty"):
        measure(lm.model, lm.tokenizer, CONFIG, layers=[], progress=False)


def test_digit_level_model_answers_are_judged_on_the_greedy_continuation(tmp_path):
    lm = load_model(str(write_llama_gguf(tmp_path / "tiny.gguf")))
    config = ScienceConfig(operators=("+", "*"), operand_hi=12, pairs_per_op=5,
                           faithfulness_prompts=20)
    res = measure(lm.model, lm.tokenizer, config, progress=False)
    table = res.table
    assert res.numbers.digit_level
    i = int(np.nonzero((table.a == 7) & (table.b == 5) & (table.op == 0))[0][0])
    assert table.result[i] == 12 and len(table.result_tokens[i]) == 2
    assert table.answer[i] == lm.tokenizer.convert_tokens_to_ids("1")
    for j in range(0, len(table), 17):  # greedy generation, one token at a time
        seq = torch.from_numpy(table.tokens[j][None])
        ok = True
        for want in table.result_tokens[j]:
            nxt = lm.model(seq)[0, -1].argmax()
            ok &= int(nxt) == int(want)
            seq = torch.cat([seq, nxt.view(1, 1)], dim=1)
        assert bool(table.correct[j]) == ok
    # a gated MLP can go negative, so its bottom-k is scored: some kept rows are bottom
    # scores, each equal to Algorithm 1 on the negated map and above the top-k score
    from reference import reference_score

    lr = res.layers[1]
    m = lr.matches
    bottom = [i for i in np.nonzero(m.bottom)[0] if m.row_heuristic(i).family != "pattern"]
    assert bottom, "no bottom-k score was kept for the gated model"
    for i in bottom[:20]:
        h, op = m.row_heuristic(i), config.operators[m.op[i]]
        idx = table.op_index(op)
        values = (lr.kv(idx) if h.direct else lr.acts[idx].T)[m.neuron[i]].astype(np.float64)
        member = h.contains(table.a[idx], table.b[idx], table.result[idx])
        assert reference_score(-values, member) == pytest.approx(m.score[i], abs=1e-5), h.key
        assert reference_score(values, member) < m.score[i] + 1e-6, h.key


def test_bfloat16_forward_passes_keep_the_ranking_of_effects(tiny_builtin, tiny):
    """--dtype bfloat16: same weights hash, float32 effects, and neurons ranked much as in
    float32. Measured on this model (40 pairs per operator): about 1.6% of prompts change
    correctness, so the pairs differ too; Spearman over every neuron 0.55-0.86 (median
    0.8) per (layer, operator), 6-9 of the float32 top 10 in the bfloat16 top 10."""
    from dataclasses import replace

    from catalog.core.stats import spearman
    from catalog.run.checkpoint import CheckpointRun

    lm32 = tiny[0]
    cfg, root = tiny_builtin
    lm16 = load_model("builtin", builtin_config=cfg, cache_root=root, dtype=torch.bfloat16)
    assert next(lm16.model.parameters()).dtype == torch.bfloat16
    assert lm16.info.weights_hash == lm32.info.weights_hash
    with pytest.raises(ValueError, match="dtype float32"):
        CheckpointRun(lm16.model, lm16.tokenizer, CONFIG)  # the config says float32
    config32 = replace(CONFIG, pairs_per_op=40)
    config16 = replace(config32, dtype="bfloat16")
    assert config16.config_hash() != config32.config_hash()
    res32 = measure(lm32.model, lm32.tokenizer, config32, progress=False, summary=False)
    res16 = measure(lm16.model, lm16.tokenizer, config16, progress=False, summary=False)
    assert (res32.table.correct == res16.table.correct).mean() > 0.95
    rhos, overlaps = [], []
    for layer in res32.layers:
        a, b = res32.layers[layer], res16.layers[layer]
        assert b.effect_exact.dtype == np.float32 and b.acts.dtype == np.float32
        np.testing.assert_allclose(b.acts, a.acts, atol=0.03 * np.abs(a.acts).max())
        for o in range(len(CONFIG.operators)):
            x, y = a.rank_value[:, o], b.rank_value[:, o]
            assert np.isfinite(x).all() and np.isfinite(y).all()
            rhos.append(spearman(x, y))
            top = lambda v: set(np.argsort(-np.abs(v))[:10].tolist())  # noqa: E731
            overlaps.append(len(top(x) & top(y)))
    assert np.median(rhos) >= 0.7 and min(rhos) >= 0.4, rhos
    assert min(overlaps) >= 5, overlaps


def test_a_summary_of_some_layers_says_what_it_pruned_and_kept_whole(tiny):
    lm, _ = tiny
    config = ScienceConfig(operators=("+",), operand_hi=12, pairs_per_op=6,
                           faithfulness_prompts=10, faithfulness_seeds=1,
                           faithfulness_protocols=("paper", "all-layers"), late_from="0")
    res = measure(lm.model, lm.tokenizer, config, layers=[1], progress=False)
    by = {c.protocol: c.as_dict() for c in res.summary.curves}
    assert res.summary.layers == [1]
    # only measured layers are ever pruned; the rest stay whole under both protocols
    assert by["paper"]["pruned"] == [1] and by["paper"]["whole"] == [0]
    assert by["paper"]["late_from"] == 0 and by["paper"]["late_source"] == "config"
    assert by["all-layers"]["pruned"] == [1] and by["all-layers"]["whole"] == [0]
    assert by["all-layers"]["n_heads_kept"] == by["all-layers"]["n_heads"]


def test_a_measure_with_progress_shows_its_layers_and_says_when_its_summary_runs(tiny, capsys):
    """Issue 32.10: the summary (minutes on a real model) ran with no output at all."""
    lm, _ = tiny
    config = ScienceConfig(operators=("+",), operand_hi=12, pairs_per_op=6,
                           faithfulness_prompts=10, faithfulness_seeds=1)
    measure(lm.model, lm.tokenizer, config, progress=True)
    err = capsys.readouterr().err
    n = lm.model.cfg.n_layers
    done = f"layers: {n}/{n} layers (100%)"  # captured: not a terminal, so plain lines
    assert done in err, err
    assert f"summary of {n} layer(s): accuracy, circuits and faithfulness curves" in err
    assert err.index(done) < err.index("summary of") < err.index("summary done in")
