"""Enrichment of the top set (catalog.labels.enrichment): known answers for the intervals and the
exact test, and planted layers whose top set is (or is not) labelled more often."""

import numpy as np

from catalog.labels import enrichment
from catalog.labels.heuristics import Heuristic
from catalog.labels.matches import Matches


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
