"""Scoring and labelling maps the way CheckpointRun does, for the label-rule tests."""

import numpy as np
import torch

from catalog.config import ScienceConfig
from catalog.core.arith import apply_op, is_valid
from catalog.core.token_format import number_format
from catalog.labels import value_null
from catalog.labels.families import chosen_on
from catalog.labels.heuristics import Cells, Heuristic, n_tests, partitions_for, rescue_pairs
from catalog.labels.matches import Matches
from catalog.labels.matching import score_partitions
from catalog.labels.operator_labels import OperatorLabels, label_operator, operand_fit
from catalog.labels.rivals import axis_values
from catalog.measuring.prompts import UNLIMITED
from catalog.run.checkpoint import constant_maps


def cells_of(op: str, hi: int) -> Cells:
    """Every cell of the [0, hi) grid that is valid for a digit tokenizer."""
    a, b = np.meshgrid(np.arange(hi), np.arange(hi), indexing="ij")
    a, b = a.ravel(), b.ravel()
    ok = is_valid(op, a, b, UNLIMITED)
    return Cells(op, a[ok], b[ok], apply_op(op, a[ok], b[ok]), 0, hi)


def labelled(op: str, cells: Cells, k_map: np.ndarray, kv: np.ndarray, config: ScienceConfig,
             with_bottom: bool = True) -> Matches:
    """Score the maps, leave out constant ones, apply the config's label rule
    (catalog.labels.value_null.label) and keep the rows to store."""
    return labelled_with_fit(op, cells, k_map, kv, config, with_bottom).matches


def labelled_with_fit(op: str, cells: Cells, k_map: np.ndarray, kv: np.ndarray,
                      config: ScienceConfig, with_bottom: bool = True,
                      timed=None) -> OperatorLabels:
    """``labelled`` with the explanations of every labelled map (the same steps as
    CheckpointRun.run_layer: catalog.labels.operator_labels.label_operator; ``timed``: its
    clock, as the run's)."""
    parts = partitions_for(cells, config)
    chosen = chosen_on(config.families, op)
    multi = len(chosen)
    k_t, kv_t = torch.from_numpy(k_map), torch.from_numpy(kv)
    dead = np.nonzero(constant_maps(k_map))[0]

    def score(k: torch.Tensor, kv_scored: torch.Tensor, orders: dict, rescue) -> Matches:
        scored, floor = parts, config.score_floor
        if rescue:
            scored, floor = value_null.second_pass_scoring(parts, rescue, null, config,
                                                           m_tests)
        found = [score_partitions(k, kv_scored, scored, floor, with_bottom,
                                  config.pattern_top_k, cells=cells, orders=orders,
                                  pairs=rescue_pairs(rescue))]
        if not rescue:
            found += [fam.score(kv_t, cells.result, config, 0) for fam in chosen]
        # constant maps are not scored (the run leaves them out before scoring; the second
        # pass leaves out maps with nothing beyond the operands)
        return Matches.concat(found).without_neurons([] if rescue else dead)

    m_tests = n_tests(parts, with_bottom, multi)
    null = None
    if config.label_rule == "values":
        null = value_null.ValueNull.of(cells, parts, config.null_strata, config.seed,
                                  config.pattern_top_k, m_tests, config.significance_level)
        m_tests = value_null.n_value_tests(null, parts, with_bottom, config.significance_level)
    fit = operand_fit(config, cells)
    return label_operator(config, k_t, kv_t, score, m_tests, null, fit, timed)


# ------------------------------------------------------------------ planted maps

NOISE = 0.3
ADDITIVE = ("two-digit", "digits", "format", "monotone", "thresholds", "both two-digit")


def noise_maps(cells: Cells, n: int, rng) -> np.ndarray:
    return NOISE * rng.standard_normal((n, len(cells.a)))


def _by_value(x: np.ndarray, f: np.ndarray) -> np.ndarray:
    """f (maps, values) read at each cell's value index x."""
    _, inv = np.unique(x, axis=0, return_inverse=True)
    return f[:, inv.reshape(-1)]


def additive_maps(kind: str, cells: Cells, n: int, rng) -> np.ndarray:
    """Maps with no result structure: a feature of op1 plus a feature of op2 (or of how
    both are written together), plus noise."""
    fa, fb = number_format(cells.a), number_format(cells.b)
    if kind == "both two-digit":  # the prompt's layout: an AND of the operands' formats
        x = ((cells.a >= 10) & (cells.b >= 10)).astype(float)
        return x + noise_maps(cells, n, rng)
    if kind == "two-digit":  # a token-count feature of a digit-level tokenizer
        x = (cells.a >= 10).astype(float) + (cells.b >= 10)
        return x + noise_maps(cells, n, rng)
    if kind == "digits":
        return fa[:, 0] + fb[:, 0] + noise_maps(cells, n, rng)
    if kind == "format":  # random functions of (digits, first digit) of each operand
        f = rng.standard_normal((n, 200))
        g = rng.standard_normal((n, 200))
        return (_by_value(fa[:, :2], f) + _by_value(fb[:, :2], g) + noise_maps(cells, n, rng))
    if kind == "monotone":  # random increasing f(op1) + g(op2)
        f = np.cumsum(rng.exponential(size=(n, cells.hi)), 1)
        g = np.cumsum(rng.exponential(size=(n, cells.hi)), 1)
        f /= f.std(1, keepdims=True)
        g /= g.std(1, keepdims=True)
        return f[:, cells.a] + g[:, cells.b] + noise_maps(cells, n, rng)
    if kind == "thresholds":  # a random step on each operand, of random heights
        ta = rng.integers(1, cells.hi, n)[:, None]
        tb = rng.integers(1, cells.hi, n)[:, None]
        return ((cells.a[None] >= ta) * rng.uniform(0.5, 2, (n, 1))
                + (cells.b[None] >= tb) * rng.uniform(0.5, 2, (n, 1)) + noise_maps(cells, n, rng))
    raise ValueError(kind)


def sum_window_maps(cells: Cells, n: int, rng) -> np.ndarray:
    """A window of op1 + op2 (another operator's result on ``*`` prompts), at a random place
    and width."""
    s = (cells.a + cells.b).astype(float)
    q = np.quantile(s, rng.uniform(0.2, 0.8, n))[:, None]
    w = rng.uniform(0.1, 0.3, n)[:, None] * s.max()
    return ((s[None] >= q) & (s[None] < q + w)) + noise_maps(cells, n, rng)


def product_window_maps(cells: Cells, n: int, rng) -> np.ndarray:
    """A window of op1 * op2 (another operator's result), at a random place and width."""
    p = cells.a * cells.b
    q = np.quantile(p, rng.uniform(0.55, 0.9, n))
    w = rng.uniform(0.1, 0.3, n) * p.max()
    x = (p[None] >= q[:, None]) & (p[None] < (q + w)[:, None])
    return x + noise_maps(cells, n, rng)


# true result sets the rule must keep with operand effects mixed in (the tests and
# bench/label_mixtures.py)
TRUE_RESULT = [("+", Heuristic("range", "result", (20, 10))),
               ("+", Heuristic("range", "result", (40, 30))),
               ("+", Heuristic("modulo", "result", (5, 2))),
               ("+", Heuristic("pattern", "result", ("..7",))),
               ("*", Heuristic("range", "result", (99, 100))),
               ("*", Heuristic("modulo", "result", (3, 0))),
               ("*", Heuristic("pattern", "result", ("..4",)))]


def _z(x: np.ndarray) -> np.ndarray:
    return (x - x.mean()) / x.std()


def rival_maps(cells, n: int, rng) -> dict[str, np.ndarray]:
    """Maps that follow an interaction of the operands that is not this operator's result
    (each z-scored, noise of 0.3)."""
    a, b = cells.a.astype(float), cells.b.astype(float)
    hi, lo = np.maximum(cells.a, cells.b), np.minimum(cells.a, cells.b)
    p = a * b
    out = {"max": _z(hi.astype(float)), "min": _z(lo.astype(float)),
           "|op1 - op2|": _z(np.abs(a - b))}
    if cells.op != "*":  # on * these ARE functions of the result
        out["sqrt(op1 * op2)"] = _z(np.sqrt(p))
        c = np.quantile(p, rng.uniform(0.3, 0.9, n))[:, None]
        w = rng.uniform(0.05, 0.2, n)[:, None] * p.max()
        out["smooth bump of op1 * op2"] = np.exp(-((p[None] - c) / w) ** 2) / 0.5
    else:
        out["parity XOR"] = ((cells.a % 2) ^ (cells.b % 2)).astype(float)
    out["random f(max)"] = rng.standard_normal((n, cells.hi))[:, hi]
    out["random f(min)"] = rng.standard_normal((n, cells.hi))[:, lo]
    d = np.abs(cells.a - cells.b)
    t = rng.integers(2, cells.hi // 2, n)[:, None]
    out["window of |op1 - op2|"] = ((d[None] >= t) & (d[None] < 2 * t)).astype(float)
    q = axis_values("max // min", cells.a, cells.b)
    out["step of max // min"] = (q[None] >= rng.integers(2, 4, n)[:, None]).astype(float)
    return {k: np.broadcast_to(v, (n, len(a))) + noise_maps(cells, n, rng)
            for k, v in out.items()}
