"""Matching neurons of two models by what they compute (issue 83).

A neuron's **profile** is its activation at the last position of every cell (op, a, b)
of a config's grid, for each operator (``profiles``). Two models are compared on the
cells both have (their tokenizers may differ: cells are matched by (op, a, b), not by
tokens). The **similarity** of two neurons is the Pearson correlation of their profiles,
operator by operator, averaged over the operators (``similarity``): a neuron that fires
on "op1 in [10, 20)" in both runs scores near 1 whatever its scale, and a constant
neuron (no variance on an operator) scores 0 there.

Each neuron of A gets its **best** match in B (many-to-one: several of A's neurons may
pick the same one) and a **one-to-one** match (the assignment that maximises the summed
similarity, ``scipy.optimize.linear_sum_assignment``).

Indices mean nothing across runs, and the largest of thousands of correlations is large
by chance: profiles over a grid are smooth, and most neurons of any model, trained or
not, follow the operands' sizes somewhat. So "has a counterpart" is judged against a
**null**: the same neurons of A matched to unrelated models of the same shape (other
initialisations, or untrained checkpoints), whose best similarities are what chance and
the grid's shared structure give. A neuron of A has a counterpart in B when
its best similarity in B exceeds the null's ``1 - level`` quantile of best similarities
(``counterparts``); by construction an unrelated B gives that about ``level`` of the
time (tested).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from transformer_lens import HookedTransformer

from catalog.config import ScienceConfig
from catalog.core.stats import wilson
from catalog.core.tokens import detect_number_tokens
from catalog.measuring.grids import run_grid
from catalog.measuring.prompts import build_prompts


@dataclass
class Profiles:
    """Each neuron's activation over the cells of a grid: ``values`` (neurons, cells)
    float32, ``neurons`` (neurons, 2) their (layer, index), ``cells`` (cells, 3) each
    cell's (operator index, a, b), sorted, and ``operators`` the operators' symbols."""

    values: np.ndarray
    neurons: np.ndarray
    cells: np.ndarray
    operators: tuple[str, ...]

    def on(self, cells: np.ndarray) -> np.ndarray:
        """``values`` on ``cells`` (rows of ``self.cells``, in that order)."""
        at = {tuple(c): i for i, c in enumerate(self.cells.tolist())}
        missing = [tuple(c) for c in cells.tolist() if tuple(c) not in at]
        if missing:
            raise ValueError(f"{len(missing)} cells are not in these profiles, "
                             f"e.g. {missing[0]}")
        return self.values[:, [at[tuple(c)] for c in cells.tolist()]]


@torch.no_grad()
def profiles(model: HookedTransformer, tokenizer, config: ScienceConfig,
             layers: list[int] | None = None, batch_size: int = 4096) -> Profiles:
    """The profiles of every MLP neuron of ``layers`` (default: all) on ``config``'s grid."""
    layers = list(range(model.cfg.n_layers)) if layers is None else list(layers)
    numbers = detect_number_tokens(tokenizer, prepend_bos=model.cfg.default_prepend_bos)
    table = build_prompts(tokenizer, numbers, config)
    acts = run_grid(model, table, layers, batch_size=batch_size)
    cells = np.stack([table.op, table.a, table.b], axis=1).astype(np.int64)
    order = np.lexsort(cells.T[::-1])
    values = np.concatenate([acts[layer].T for layer in layers])[:, order]
    neurons = np.array([(layer, n) for layer in layers for n in range(acts[layer].shape[1])],
                       dtype=np.int64)
    return Profiles(values=np.ascontiguousarray(values, dtype=np.float32), neurons=neurons,
                    cells=cells[order], operators=tuple(config.operators))


def _standardised(values: np.ndarray, op: np.ndarray) -> np.ndarray:
    """Each row centred and scaled per operator block so that the dot product of two rows
    is the mean over operators of their Pearson correlations (0 where a block is
    constant)."""
    x = values.astype(np.float64)
    ops = np.unique(op)
    out = np.zeros_like(x)
    for o in ops:
        cols = op == o
        block = x[:, cols] - x[:, cols].mean(1, keepdims=True)
        norm = np.sqrt((block * block).sum(1, keepdims=True))
        out[:, cols] = np.divide(block, norm * np.sqrt(len(ops)),
                                 out=np.zeros_like(block), where=norm > 1e-12)
    return out


def shared_cells(a: Profiles, b: Profiles) -> np.ndarray:
    """The cells both profiles cover, by (operator symbol, a, b), as rows of ``a.cells``."""
    if a.operators != b.operators:
        raise ValueError(f"the profiles measure different operators: {a.operators} and "
                         f"{b.operators}")
    keep = {tuple(c) for c in b.cells.tolist()}
    cells = np.array([c for c in a.cells.tolist() if tuple(c) in keep], dtype=np.int64)
    if not len(cells):
        raise ValueError("the two profiles share no cell")
    return cells.reshape(-1, 3)


def similarity(a: Profiles, b: Profiles) -> np.ndarray:
    """(neurons of a, neurons of b): the mean over operators of the Pearson correlation
    of the two neurons' activations on the cells both cover (module doc)."""
    cells = shared_cells(a, b)
    za = _standardised(a.on(cells), cells[:, 0])
    zb = _standardised(b.on(cells), cells[:, 0])
    return za @ zb.T


@dataclass
class Match:
    """For each neuron of A (in ``a.neurons`` order): its ``best`` neuron of B (an index
    into ``b.neurons``) and that similarity; its ``one_to_one`` partner (-1 where B has
    fewer neurons) and that similarity."""

    best: np.ndarray
    best_similarity: np.ndarray
    one_to_one: np.ndarray
    one_to_one_similarity: np.ndarray


def match(sim: np.ndarray) -> Match:
    """Best and one-to-one matches from a similarity matrix (rows: A's neurons)."""
    from scipy.optimize import linear_sum_assignment

    best = sim.argmax(1)
    rows, cols = linear_sum_assignment(sim, maximize=True)
    one = np.full(sim.shape[0], -1, dtype=np.int64)
    one[rows] = cols
    one_sim = np.where(one >= 0, sim[np.arange(sim.shape[0]), np.maximum(one, 0)], np.nan)
    return Match(best=best, best_similarity=sim[np.arange(sim.shape[0]), best],
                 one_to_one=one, one_to_one_similarity=one_sim)


def null_threshold(a: Profiles, nulls: Profiles | list[Profiles], level: float = 0.01,
                   which: np.ndarray | None = None) -> float:
    """The ``1 - level`` quantile of A's neurons' (all, or the mask ``which``) best
    similarities in unrelated models of the same shape, pooled over ``nulls`` (several
    make the quantile steadier: with one model of a few hundred neurons, the 99th
    percentile is its third largest value)."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    nulls = [nulls] if isinstance(nulls, Profiles) else list(nulls)
    if not nulls:
        raise ValueError("a null needs at least one unrelated model's profiles")
    sel = slice(None) if which is None else np.asarray(which, dtype=bool)
    best = np.concatenate([similarity(a, n).max(1)[sel] for n in nulls])
    return float(np.quantile(best, 1 - level))


def counterparts(a: Profiles, b: Profiles, nulls: Profiles | list[Profiles],
                 level: float = 0.01, which: np.ndarray | None = None) -> dict:
    """Which of A's neurons (all, or the boolean mask ``which``) have a counterpart in B
    beyond the null (module doc): the threshold, each neuron's best match and similarity,
    the share with a counterpart and its Wilson interval (the null's own rate is
    ``level`` by construction) and how often the one-to-one match is the best one."""
    sim = similarity(a, b)
    m = match(sim)
    sel = np.ones(sim.shape[0], dtype=bool) if which is None \
        else np.asarray(which, dtype=bool)
    threshold = null_threshold(a, nulls, level, sel)
    has = m.best_similarity > threshold
    k, n = int(has[sel].sum()), int(sel.sum())
    return {"threshold": threshold, "level": level, "match": m, "has": has,
            "count": k, "n": n, "share": k / n if n else float("nan"),
            "ci": list(wilson(k, n)) if n else [float("nan")] * 2,
            "one_to_one_is_best": float(np.mean(m.one_to_one[sel] == m.best[sel]))
            if n else float("nan")}
