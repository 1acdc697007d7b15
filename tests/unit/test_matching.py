"""Heuristic matching: planted neurons are found; vectorised scores equal Algorithm 1."""

import math

import numpy as np
import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from catalog.builtin import builtin_tokenizer, builtin_vocab
from catalog.config import ScienceConfig
from catalog.core.arith import OPERATORS, apply_op, is_valid
from catalog.labels import matching, value_null
from catalog.labels.heuristics import Cells, Heuristic, partitions_for
from catalog.labels.matching import (
    SortedMaps,
    multi_result_matches,
    partition_scores,
    score_partitions,
)
from catalog.run.checkpoint import CheckpointRun

from reference import reference_score


def grid_cells(op: str, hi: int, lo: int = 0, limit: int = 999) -> Cells:
    a, b = np.meshgrid(np.arange(lo, hi), np.arange(lo, hi), indexing="ij")
    a, b = a.ravel(), b.ravel()
    ok = is_valid(op, a, b, limit)
    return Cells(op, a[ok], b[ok], apply_op(op, a[ok], b[ok]), lo, hi)


# ------------------------------------------------------------ planted model

SIDE = 50  # operands 0..49, each with its own one-hot embedding dimension
F, RNG, POS, EQ, R1, EQ2, CONST = 50, 51, 52, 57, 58, 59, 60  # residual dims
OP1_COPY, OP2_COPY, LENS_DIM = 61, 111, 170
N_PLANTED, D_MLP = 3, 16


def planted_model() -> HookedTransformer:
    """A 2-layer model whose layer-1 neurons 0, 1, 2 implement known heuristics.

    neuron 0: fires iff op1 in [20, 30) (reads a flag copied from op1's embedding);
    neuron 1: fires iff op1 = op2 (layer 0 attention at op2's position attends to
              op1 only when the tokens are equal; layer 1 copies that to '=');
    neuron 2: always fires, and its value vector promotes exactly the numbers
              = 3 (mod 5): a result heuristic, visible in the KV map.
    Neurons 3..15 read random mixtures of the op1 and op2 one-hots: unrelated.
    """
    vocab = builtin_vocab()
    cfg = HookedTransformerConfig(
        n_layers=2, d_model=192, n_heads=2, d_head=64, d_mlp=D_MLP, d_vocab=len(vocab), n_ctx=8,
        act_fn="relu", normalization_type=None, positional_embedding_type="standard",
        default_prepend_bos=True)
    model = HookedTransformer(cfg)
    sd = {k: torch.zeros_like(v) for k, v in model.state_dict().items()}
    num = {n: vocab[str(n)] for n in range(1000)}
    for n, t in num.items():
        if n < SIDE:
            sd["embed.W_E"][t, n] = 1.0
        sd["embed.W_E"][t, F] = 1.0
        sd["embed.W_E"][t, RNG] = float(20 <= n < 30)
    sd["embed.W_E"][vocab["="], CONST] = 1.0
    for p in range(5):
        sd["pos_embed.W_pos"][p, POS + p] = 1.0

    # layer 0, head 0 at op2's position (3): query = op2's one-hot, key = each token's one-hot;
    # its own key is pushed down, BOS's key sits between "equal" and "unequal".
    s = 100.0
    att = "blocks.0.attn."
    for n in range(SIDE):
        sd[att + "W_Q"][0, n, n] = s
        sd[att + "W_K"][0, n, n] = 1.0
    sd[att + "W_Q"][0, POS + 3, SIDE] = 1.0
    sd[att + "W_K"][0, POS + 3, SIDE] = -2 * s
    sd[att + "W_K"][0, POS + 0, SIDE] = s / 2
    sd[att + "W_V"][0, F, 0] = 1.0
    sd[att + "W_O"][0, 0, EQ] = 1.0

    # layer 1: head 0 at '=' reads position 1 (op1), head 1 reads position 3 (op2)
    att = "blocks.1.attn."
    for head, src in ((0, 1), (1, 3)):
        sd[att + "W_Q"][head, POS + 4, 0] = 20.0
        sd[att + "W_K"][head, POS + src, 0] = 20.0
        for n in range(SIDE):
            sd[att + "W_V"][head, n, 1 + n] = 1.0
            sd[att + "W_O"][head, 1 + n, (OP1_COPY if head == 0 else OP2_COPY) + n] = 1.0
    sd[att + "W_V"][0, RNG, 60] = 1.0
    sd[att + "W_O"][0, 60, R1] = 1.0
    sd[att + "W_V"][1, EQ, 60] = 1.0
    sd[att + "W_O"][1, 60, EQ2] = 1.0

    mlp = "blocks.1.mlp."
    sd[mlp + "W_in"][R1, 0] = 1.0
    sd[mlp + "W_in"][EQ2, 1] = 1.0
    sd[mlp + "b_in"][1] = -0.5
    sd[mlp + "W_in"][CONST, 2] = 1.0
    sd[mlp + "W_out"][2, LENS_DIM] = 1.0
    for n in range(1000):
        sd["unembed.W_U"][LENS_DIM, num[n]] = float(n % 5 == 3)
    g = torch.Generator().manual_seed(1)
    sd[mlp + "W_in"][OP1_COPY:OP2_COPY + SIDE, N_PLANTED:] = torch.randn(
        2 * SIDE, D_MLP - N_PLANTED, generator=g)
    # unrelated value vectors write to their own direction, read by random number logits
    sd[mlp + "W_out"][N_PLANTED:, LENS_DIM + 1] = torch.randn(D_MLP - N_PLANTED, generator=g)
    sd["unembed.W_U"][LENS_DIM + 1, list(num.values())] = torch.randn(1000, generator=g)
    model.load_state_dict(sd)
    model.eval()
    return model


@pytest.fixture(scope="module")
def planted_run():
    model = planted_model()
    config = ScienceConfig(operators=("+",), operand_hi=SIDE, pairs_per_op=4, score_floor=0.0,
                           patching=("exact",))
    return CheckpointRun(model, builtin_tokenizer(), config, layers=[1]).prepare()


@pytest.fixture(scope="module")
def planted_layer(planted_run):
    return planted_run.run_layer(1)


@pytest.mark.parametrize("neuron, expected", [
    (0, Heuristic("range", "op1", (20, 10))),
    (1, Heuristic("identical", "both", ())),
])
def test_planted_neuron_is_found(planted_layer, neuron, expected):
    m = planted_layer.matches
    sel = np.nonzero(m.neuron == neuron)[0]
    best = m.score[sel].max()
    assert best >= 0.9
    winners = [m.row_heuristic(i) for i in sel if m.score[i] == best]
    assert expected in winners, [h.label for h in winners]
    # the label rule (significant, the default) labels it
    assert any(m.implements[i] and m.row_heuristic(i) == expected for i in sel)
    # Any other winner is the same prompt set under another name: on operands
    # 0..49, "op1 matches .2." is exactly "op1 in [20, 30)".
    cells = grid_cells("+", SIDE)
    want = expected.contains(cells.a, cells.b, cells.result)
    for h in winners:
        assert np.array_equal(h.contains(cells.a, cells.b, cells.result), want), h.label
    runner_up = m.score[sel][[m.row_heuristic(i) not in winners for i in sel]].max()
    assert runner_up < 0.8


def test_a_constant_neuron_is_flagged_and_never_labelled(planted_layer):
    """Neuron 2 is on for every prompt with the same activation; its value vector pushes
    results = 3 (mod 5), so its KV map scores that heuristic 1.0. But nothing about the
    prompt moves it: it is flagged constant and gets no heuristic row at all."""
    assert planted_layer.constant[2, 0]
    assert not planted_layer.constant[[0, 1], 0].any()
    assert not (planted_layer.matches.neuron == 2).any()


def test_the_layer_scores_only_live_neurons_and_keeps_their_numbers(planted_run, planted_layer):
    """Constant neurons are left out before scoring; every other neuron's rows are those of
    scoring the whole layer, under the neuron's own number."""
    idx = planted_run.table.op_index("+")
    k_map = planted_layer.acts[idx].T
    whole = score_partitions(torch.from_numpy(k_map),
                             torch.from_numpy(planted_layer.kv(idx)),
                             planted_run.partitions["+"], 0.0, planted_run.with_bottom,
                             planted_run.config.pattern_top_k, cells=planted_run.cells["+"])
    c = planted_run.config
    whole = value_null.label(whole.without_neurons(np.nonzero(planted_layer.constant[:, 0])[0]), c,
                        planted_run.n_tests["+"], planted_run.nulls.get("+"),
                        torch.from_numpy(k_map), torch.from_numpy(planted_layer.kv(idx)))
    got = planted_layer.matches

    def rows(m):
        return sorted((int(n), m.heuristics[h].key, round(float(s), 6), bool(b), bool(i))
                      for n, h, s, b, i in zip(m.neuron, m.heuristic, m.score, m.bottom,
                                               m.implements, strict=True))
    assert len(got) == len(whole) > 50
    assert rows(got) == rows(whole)


def test_planted_heuristics_are_not_found_in_unrelated_neurons(planted_layer):
    m = planted_layer.matches
    best = [m.score[m.neuron == n].max() for n in range(N_PLANTED, D_MLP)]
    # Chance level is the heuristic's share of cells; the largest result windows
    # cover 73% of this grid, so "low" means clearly below the 0.9 of a real match.
    assert max(best) < 0.8, best
    planted_keys = {"range:op1:20:10", "identical:both", "modulo:result:5:3"}
    for i in np.nonzero(m.neuron >= N_PLANTED)[0]:
        if m.row_heuristic(i).key in planted_keys:
            assert m.score[i] < 0.5


# ------------------------------------------------ vectorised vs reference


def tie_maps(kind: str, shape: tuple[int, int], rng) -> np.ndarray:
    """Maps of one kind: noise, a few levels, ReLU-sparse (mostly 0, values on both sides
    of 0 among the rest), constant, or one long run of a value in the middle of the order
    with ties above and below it."""
    n, c = shape
    if kind == "noise":
        return rng.standard_normal(shape)
    if kind == "levels":
        return rng.integers(0, 4, shape)
    if kind == "sparse":
        return np.where(rng.random(shape) < 0.9, 0.0, rng.standard_normal(shape))
    if kind == "constant":
        return np.stack([np.full(c, v) for v in np.linspace(-1, 1, n)])
    assert kind == "mode_in_middle"
    out = rng.integers(-3, 4, shape).astype(float)
    out[rng.random(shape) < 0.6] = 0.5
    return out


@pytest.mark.parametrize("op", OPERATORS)
@pytest.mark.parametrize("ties", ["noise", "levels", "sparse", "constant", "mode_in_middle"])
def test_vectorised_scores_equal_algorithm_1(op, ties, monkeypatch):
    """Every path of partition_scores (no ties, ties, counting around a long run of one
    value) against Algorithm 1 written plainly."""
    cells = grid_cells(op, 30)
    rng = np.random.default_rng(0)
    shape = (5, len(cells.a))
    maps = torch.from_numpy(tie_maps(ties, shape, rng).astype(np.float32))
    sm = SortedMaps.of(maps)
    checked = 0
    calls = []
    real = matching._around_mode
    monkeypatch.setattr(matching, "_around_mode", lambda sm, *a: calls.append(len(sm.values))
                        or real(sm, *a))
    for part in partitions_for(cells, ScienceConfig(operand_hi=30)):
        fast = partition_scores(sm, part).numpy()
        for j, h in enumerate(part.heuristics):
            member = h.contains(cells.a, cells.b, cells.result)
            assert member.sum() == part.sizes[j], h.key
            for n in range(len(maps)):
                ref = reference_score(maps[n].numpy(), member)
                assert abs(fast[n, j] - ref) < 1e-9, (h.key, n, fast[n, j], ref)
                checked += 1
    assert checked > 1000
    # maps with one value on a quarter of the cells or more were counted around it
    # (four levels: the most frequent one often reaches a quarter too)
    if ties in ("sparse", "constant", "mode_in_middle"):
        assert calls, ties
    if ties == "noise":
        assert not calls


@pytest.mark.parametrize("op", ["+", "*"])
@pytest.mark.parametrize("variant", ["paper", "code"])
def test_grouped_fast_path_equals_reference(op, variant):
    """score_partitions (one-number heuristics through value histograms) vs Algorithm 1,
    on maps with and without ties, top and bottom."""
    cells = grid_cells(op, 30)
    rng = np.random.default_rng(2)
    cont = rng.standard_normal((6, len(cells.a)))
    tied = rng.integers(-2, 3, (4, len(cells.a)))
    sparse = tie_maps("sparse", (3, len(cells.a)), rng)
    maps = torch.from_numpy(np.concatenate([cont, tied, sparse]).astype(np.float32))
    kv = torch.from_numpy(rng.standard_normal(maps.shape).astype(np.float32))
    config = ScienceConfig(operand_hi=30, heuristic_variant=variant)
    parts = partitions_for(cells, config)
    rows = score_partitions(maps, kv, parts, floor=0.0, with_bottom=True, pattern_top_k=40,
                            cells=cells)
    got = {(int(n), rows.heuristics[h].key): (float(s), bool(b)) for n, h, s, b in
           zip(rows.neuron, rows.heuristic, rows.score, rows.bottom, strict=True)}
    count_keys = {h.key for p in parts if p.scoring == "count" for h in p.heuristics}
    checked = 0
    for h in (h for p in parts for h in p.heuristics):
        member = h.contains(cells.a, cells.b, cells.result)
        k = 40 if h.key in count_keys else None
        for n in range(len(maps)):
            values = (kv if h.direct else maps)[n].numpy()
            top, bottom = reference_score(values, member, k), reference_score(-values, member, k)
            want = max(top, bottom)
            if h.key in count_keys and want < 0.1:
                want = 0.0
            score, is_bottom = got.get((n, h.key), (0.0, False))
            assert score == pytest.approx(want, abs=1e-6), (h.key, n)
            if want > 0 and top != bottom:
                assert is_bottom == (bottom > top), (h.key, n)
            checked += 1
    assert checked > 3000
    # every row carries its heuristic's base rate and the exact p-value of its score
    n_cells = len(cells.a)
    for i in range(0, len(rows), 37):
        h = rows.row_heuristic(i)
        member = h.contains(cells.a, cells.b, cells.result)
        size = int(member.sum())
        assert rows.base_rate[i] == pytest.approx(size / n_cells, rel=1e-6), h.key
        # the overlap in whole cells, counted in float64 by the reference (the stored
        # float32 score can lose a cell: 29% of Qwen rows did before 0.6.0)
        values = (kv if h.direct else maps)[int(rows.neuron[i])].numpy().astype(np.float64)
        values = -values if rows.bottom[i] else values
        big_k = min(40, n_cells) if h.key in count_keys else size  # pattern_top_k above
        x = int(np.floor(reference_score(values, member, big_k) * big_k + 1e-9))
        x = x if rows.score[i] > 0 else 0  # counts below K/10 are stored as 0
        if h.key in count_keys:
            # K top cells drawn, ``size`` of them in S_H: the hypergeometric tail, counted
            # exactly with integers
            want = sum(math.comb(size, j) * math.comb(n_cells - size, big_k - j)
                       for j in range(x, min(size, big_k) + 1)) / math.comb(n_cells, big_k)
            assert rows.p_value[i] == pytest.approx(want, rel=1e-6), h.key
        else:
            want = sum(math.comb(size, j) * math.comb(n_cells - size, size - j)
                       for j in range(x, size + 1)) / math.comb(n_cells, size)
            assert rows.p_value[i] == pytest.approx(want, rel=1e-6), h.key


@pytest.mark.parametrize("kind", ["noise", "sparse", "mode_in_middle"])
def test_count_variant_equals_reference_with_fixed_k(kind):
    cells = grid_cells("+", 30)
    maps = torch.from_numpy(tie_maps(kind, (4, len(cells.a)), np.random.default_rng(1))
                            .astype(np.float32))
    parts = [p for p in partitions_for(cells, ScienceConfig(operand_hi=30,
                                                            heuristic_variant="code"))
             if p.scoring == "count"]
    assert parts
    sm = SortedMaps.of(maps)
    for part in parts:
        fast = partition_scores(sm, part, top_k=100).numpy()
        for j, h in enumerate(part.heuristics):
            member = h.contains(cells.a, cells.b, cells.result)
            for n in range(4):
                assert abs(fast[n, j] - reference_score(maps[n].numpy(), member, k=100)) < 1e-9


def test_ties_share_fairly_instead_of_favouring_cell_order():
    cells = grid_cells("+", 30)
    flat = torch.zeros(1, len(cells.a))
    sm = SortedMaps.of(flat)
    for part in partitions_for(cells, ScienceConfig(operand_hi=30)):
        scores = partition_scores(sm, part).numpy()[0]
        # a flat map matches every heuristic only at the base rate |S_H| / |cells|
        np.testing.assert_allclose(scores, part.sizes / len(cells.a), rtol=1e-12)


@pytest.mark.parametrize("ties", ["noise", "levels", "sparse", "constant"])
def test_the_bottom_side_is_the_top_side_reversed(ties):
    """The bottom side's sorted maps come from the top side's without a sort: the same
    values as sorting -maps, in an order that sorts -maps (ties in any order)."""
    rng = np.random.default_rng(5)
    maps = torch.from_numpy(tie_maps(ties, (6, 400), rng).astype(np.float32))
    neg, ref = SortedMaps.of(maps).negated(), SortedMaps.of(-maps)
    assert torch.equal(neg.values, ref.values) and torch.equal(neg.ascending, ref.ascending)
    assert torch.equal((-maps).gather(1, neg.order), ref.values)
    assert torch.equal(neg.order.sort(dim=1).values, torch.arange(400).expand(6, 400))


def test_bottom_k_is_kept_when_larger():
    cells = grid_cells("+", 30)
    member = Heuristic("range", "op1", (10, 10)).contains(cells.a, cells.b, cells.result)
    k_map = torch.from_numpy(np.where(member, -1.0, 0.0)[None].astype(np.float32))
    parts = partitions_for(cells, ScienceConfig(operand_hi=30))
    rows = score_partitions(k_map, k_map, parts, floor=0.9, with_bottom=True)
    keys = {rows.heuristics[h].key: (s, b) for h, s, b in
            zip(rows.heuristic, rows.score, rows.bottom, strict=True)}
    assert keys["range:op1:10:10"] == (1.0, True)
    top_only = score_partitions(k_map, k_map, parts, floor=0.9, with_bottom=False)
    assert "range:op1:10:10" not in {top_only.heuristics[h].key for h in top_only.heuristic}


def test_multi_result_for_division():
    cells = grid_cells("/", 30)
    kv = np.where(np.isin(cells.result, [0, 1]), 1.0, 0.0) + 0.01 * (cells.result == 2)
    found = multi_result_matches(torch.from_numpy(kv[None]), cells.result, top=50)
    assert len(found) == 1
    neuron, h, share = found.neuron[0], found.row_heuristic(0), found.score[0]
    assert neuron == 0 and h.params == (0, 1) and h.label == "result in {0, 1}" and share == 1.0


def test_family_registry_refuses_duplicates():
    from catalog.labels.families import families, register

    with pytest.raises(ValueError, match="'range' is already registered"):
        register(families()["range"])


@pytest.mark.parametrize("per_family", [0, 1, 2, 5])
def test_compact_keeps_the_best_per_family_and_every_label(per_family):
    """Matches.compact against a plain loop over (neuron, operator, family) groups."""
    rng = np.random.default_rng(7)
    hs = ([Heuristic("range", "op1", (s, 10)) for s in range(0, 50, 10)]
          + [Heuristic("modulo", "op2", (3, r)) for r in range(3)]
          + [Heuristic("value", "result", (v,)) for v in range(4)])
    n = 600
    m = matching.Matches(rng.integers(0, 20, n).astype(np.int32),
                         rng.integers(0, 3, n).astype(np.int8),
                         rng.integers(0, len(hs), n).astype(np.int32),
                         rng.choice([0.3, 0.5, 0.7, 0.9], n).astype(np.float32),  # many ties
                         rng.random(n) < 0.2, hs)
    # one row per (neuron, op, heuristic), as the matcher writes them
    _, first = np.unique(np.stack([m.neuron, m.op, m.heuristic]), axis=1, return_index=True)
    m = matching.Matches(m.neuron[first], m.op[first], m.heuristic[first], m.score[first],
                         m.bottom[first], hs)
    m.implements = rng.random(len(m)) < 0.1
    kept = m.compact(per_family)
    got = set(zip(kept.neuron.tolist(), kept.op.tolist(), kept.heuristic.tolist(), strict=True))
    want = set()
    groups: dict = {}
    for i in range(len(m)):
        groups.setdefault((int(m.neuron[i]), int(m.op[i]), hs[m.heuristic[i]].family),
                          []).append(i)
    for rows in groups.values():
        rows.sort(key=lambda i: (-m.score[i], m.heuristic[i]))
        for j, i in enumerate(rows):
            if per_family == 0 or j < per_family or m.implements[i]:
                want.add((int(m.neuron[i]), int(m.op[i]), int(m.heuristic[i])))
    assert got == want
    # no family has more than 5 heuristics: 0 and 5 keep everything, 1 and 2 drop rows
    assert (per_family in (0, 5)) == (len(kept) == len(m)), (len(kept), len(m))
    # the best score of every (neuron, op) survives, with its row's other columns
    for (nn, o, _), rows in groups.items():
        best = max(m.score[i] for i in rows)
        sel = (kept.neuron == nn) & (kept.op == o)
        assert kept.score[sel].max() >= best
    i = np.nonzero(kept.implements)[0]
    assert len(i) == m.implements.sum()


def test_the_packed_row_order_is_a_stable_argsort():
    """catalog.core.sorting.row_order (the matching and value-rule sorts) equals numpy's
    stable argsort, both ways, with ties, zeros of both signs, infinities, subnormals and
    the largest floats; NaN and float64 maps take argsort itself."""
    from catalog.core.sorting import row_order

    rng = np.random.default_rng(3)
    x = rng.standard_normal((40, 700)).astype(np.float32)
    x[:, :200] = 0.0
    x[:, 200:260] = -0.0
    x[:, 260:400] = np.round(x[:, 260:400] * 2)  # many ties
    x[0, 5], x[1, 7], x[2, 9] = np.inf, -np.inf, np.float32(1e-45)
    x[3, 11], x[3, 12] = np.finfo(np.float32).max, np.finfo(np.float32).min
    rng.shuffle(x, axis=1)
    for descending in (True, False):
        want = np.argsort(-x if descending else x, axis=1, kind="stable")
        np.testing.assert_array_equal(row_order(x, descending), want)
        y = x.astype(np.float64)
        y[4, 3] = np.nan
        np.testing.assert_array_equal(row_order(y, descending),
                                      np.argsort(-y if descending else y, axis=1,
                                                 kind="stable"))
    with pytest.raises(ValueError, match="2-d"):
        row_order(x[0])
