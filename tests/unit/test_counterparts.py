"""Counterparts across runs (catalog.counterparts.match, issue 83): a model and a copy of it
whose MLP neurons are permuted within each layer and lightly perturbed are matched back
to the permutation; an unrelated model (another initialisation) has counterparts at the
null's rate; similarities equal a slow per-pair Pearson reference."""

import copy

import numpy as np
import pytest
import torch
from transformer_lens import HookedTransformer

from catalog import ScienceConfig
from catalog.counterparts.match import (
    Profiles,
    counterparts,
    match,
    profiles,
    similarity,
)
from catalog.sources import load_model

CONFIG = ScienceConfig(operators=("+", "-", "*"), operand_hi=20)


def permuted_copy(model: HookedTransformer, seed: int, noise: float):
    """The model with each layer's MLP neurons permuted (and its weights perturbed by
    ``noise`` times their own scale); returns (copy, per-layer permutations): the copy's
    neuron j of layer l is the original's neuron perm[l][j]."""
    out = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    perms = []
    with torch.no_grad():
        for block in out.blocks:
            mlp = block.mlp
            perm = torch.randperm(mlp.W_in.shape[1], generator=gen)
            perms.append(perm.numpy())
            for name, dim in (("W_in", 1), ("b_in", 0), ("W_out", 0)):
                p = getattr(mlp, name)
                p.copy_(p.index_select(dim, perm))
                p.add_(noise * p.std() * torch.randn(p.shape, generator=gen))
    return out, perms


def fresh(model: HookedTransformer, seed: int) -> HookedTransformer:
    """A model of the same shape, initialised again (nothing learned)."""
    cfg = copy.deepcopy(model.cfg)
    cfg.seed = seed
    torch.manual_seed(seed)
    return HookedTransformer(cfg, tokenizer=model.tokenizer)


@pytest.fixture(scope="module")
def trained(tiny_builtin):
    config, root = tiny_builtin
    return load_model("builtin", None, builtin_config=config, cache_root=root)


def test_similarity_is_the_mean_pearson_over_operators():
    rng = np.random.default_rng(0)
    cells = np.array([(o, a, b) for o in range(2) for a in range(5) for b in range(4)])
    a = Profiles(rng.normal(size=(6, len(cells))).astype(np.float32),
                 np.array([(0, i) for i in range(6)]), cells, ("+", "-"))
    # B covers the cells in another order and one cell fewer; one neuron is constant
    order = rng.permutation(len(cells))[:-1]
    vals = rng.normal(size=(4, len(order))).astype(np.float32)
    vals[3] = 2.0
    b = Profiles(vals, np.array([(0, i) for i in range(4)]), cells[order], ("+", "-"))
    got = similarity(a, b)
    shared = cells[np.sort(order)]
    for i in range(6):
        for j in range(4):
            want = []
            for o in range(2):
                cs = [tuple(c) for c in shared if c[0] == o]
                x = [a.values[i, [tuple(c) for c in cells.tolist()].index(c)] for c in cs]
                y = [b.values[j, [tuple(c) for c in b.cells.tolist()].index(c)] for c in cs]
                want.append(0.0 if np.std(y) == 0 else np.corrcoef(x, y)[0, 1])
            assert got[i, j] == pytest.approx(np.mean(want), abs=1e-6)
    with pytest.raises(ValueError, match="different operators"):
        similarity(a, Profiles(vals, b.neurons, b.cells, ("+", "*")))


def test_a_permuted_copy_is_matched_back_and_an_unrelated_model_at_the_nulls_rate(trained):
    model, tok = trained.model, trained.tokenizer
    a = profiles(model, tok, CONFIG)
    copy_model, perms = permuted_copy(model, seed=1, noise=0.02)
    b = profiles(copy_model, tok, CONFIG)
    live = a.values.std(1) > 1e-6  # a dead neuron has nothing to match by
    assert live.mean() > 0.8
    m = match(similarity(a, b))
    # A's neuron n of layer la is the copy's neuron j where perm[la][j] == n
    d_mlp = model.cfg.d_mlp
    want = np.concatenate([la * d_mlp + np.argsort(p) for la, p in enumerate(perms)])
    assert np.mean(m.one_to_one[live] == want[live]) >= 0.95
    assert np.mean(m.best[live] == want[live]) >= 0.95
    # against the null of three other initialisations: the copy has counterparts for
    # nearly every live neuron; three more initialisations, pooled, at about the level
    nulls = [profiles(fresh(model, seed), tok, CONFIG) for seed in (11, 12, 13)]
    got = counterparts(a, b, nulls, level=0.01, which=live)
    assert got["share"] >= 0.9, got["share"]
    count = n = 0
    for seed in (21, 22, 23):
        other = counterparts(a, profiles(fresh(model, seed), tok, CONFIG), nulls,
                             level=0.01, which=live)
        assert other["threshold"] == got["threshold"]
        count, n = count + other["count"], n + other["n"]
    assert count / n <= 0.03, (count, n)  # the level is 0.01
    assert got["ci"][0] > 20 * max(count / n, 0.01)
    with pytest.raises(ValueError, match="at least one"):
        counterparts(a, b, [], level=0.01)
