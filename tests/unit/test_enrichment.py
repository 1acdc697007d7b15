"""Enrichment of the top set (catalog.enrichment): known answers for the intervals and the
exact test, and planted layers whose top set is (or is not) labelled more often."""

import math

import numpy as np
import pytest

from catalog import enrichment
from catalog.heuristics import Heuristic
from catalog.matches import Matches


def test_wilson_interval_known_values():
    # Newcombe (1998), table I: 81/263 -> 0.2553-0.3662; 15/148 -> 0.0624-0.1605
    assert enrichment.wilson(81, 263) == pytest.approx((0.2553, 0.3662), abs=5e-5)
    assert enrichment.wilson(15, 148) == pytest.approx((0.0624, 0.1605), abs=5e-5)
    assert enrichment.wilson(0, 10)[0] == 0.0
    assert enrichment.wilson(10, 10)[1] == pytest.approx(1.0)


def test_newcombe_difference_known_values():
    # Newcombe (1998), method 10, example (56/70 - 48/80): 0.0524 to 0.3339
    assert enrichment.newcombe(56, 70, 48, 80) == pytest.approx((0.0524, 0.3339), abs=5e-4)


def test_fisher_one_sided_equals_the_hypergeometric_sum():
    for k1, n1, k2, n2 in [(8, 10, 3, 10), (45, 50, 160, 200), (0, 5, 5, 5), (3, 3, 0, 30)]:
        total, lab = n1 + n2, k1 + k2
        want = sum(math.comb(lab, j) * math.comb(total - lab, n1 - j)
                   for j in range(k1, min(lab, n1) + 1)) / math.comb(total, n1)
        assert enrichment.fisher_greater(k1, n1, k2, n2) == pytest.approx(want, rel=1e-9)


def _matches(labelled: dict[int, list[int]], width: int) -> Matches:
    """Rows: neuron -> the operator indices it is labelled on, as range labels."""
    h = Heuristic("range", "op1", (0, 10))
    rows = [(n, o, h, 0.9, False, 0.1, 1e-9, True) for n, ops in labelled.items()
            for o in ops]
    return Matches.from_records(rows)


def test_a_layer_whose_top_set_is_labelled_is_enriched_and_a_random_one_is_not():
    width, ops = 400, ("+", "*")
    rank = np.stack([np.arange(width), np.arange(width)[::-1]], axis=1)  # + and * ranks
    # on +, every one of the top 20 (rank < 20) and 10% of the others are labelled;
    # on *, the same neurons, which under *'s ranks sit at the bottom
    rng = np.random.default_rng(0)
    others = rng.choice(np.arange(20, width - 20), 38, replace=False)
    lab = {int(n): [0, 1] for n in list(range(20)) + list(others)}
    masks = enrichment.label_masks(_matches(lab, width), width, len(ops))
    assert masks["any"][:, 0].sum() == 58 and set(masks) == {"any", "range"}
    rows = enrichment.enrichment({3: rank}, {3: masks}, ops, 0.05, seed=1)
    plus = next(r for r in rows if r["layer"] == 3 and r["op"] == "+" and r["family"] == "any")
    times = next(r for r in rows if r["layer"] == 3 and r["op"] == "*" and r["family"] == "any")
    assert (plus["labelled_top"], plus["n_top"], plus["n_layer"]) == (20, 20, width)
    assert plus["n_random"] == 20 and plus["fisher_p"] < 1e-6
    assert plus["ci_difference"][0] > 0.3
    assert times["labelled_top"] == 0 and times["fisher_p"] == 1.0
    pooled = [r for r in rows if r["layer"] == "all"]
    assert {(r["op"], r["family"]) for r in pooled} == {("+", "any"), ("+", "range"),
                                                        ("*", "any"), ("*", "range")}
    # the random set: 20 of the 380 others, never a top neuron, the same for every family
    assert plus["labelled_random"] <= 20
