"""A neuron's shown heuristic (neuron_op.best_heuristic_id): its most specific label."""

from types import SimpleNamespace

import pytest

from catalog.labels.heuristics import Heuristic
from catalog.labels.matches import Matches
from schema.store import _best_per_neuron_op


def test_the_most_specific_label_is_shown_not_the_highest_score():
    """A clean "result = 8" detector also clears "result in [0, 10)" with a higher score;
    the smaller set is the better description. Unlabelled rows never win over a label,
    and without labels the highest score is shown."""
    value = Heuristic("value", "result", (8,))
    wide = Heuristic("range", "result", (0, 10))
    loose = Heuristic("modulo", "result", (2, 0))
    rows = Matches.from_records([
        (0, 0, wide, 0.95, False, 0.06, 1e-12, True),
        (0, 0, value, 0.80, False, 0.01, 1e-9, True),
        (0, 0, loose, 0.99, False, 0.50, 0.3, False),
        (1, 0, loose, 0.70, False, 0.50, 0.2, False),
        (1, 0, wide, 0.65, False, 0.06, 0.1, False),
    ])
    ids = {h.key: i for i, h in enumerate((value, wide, loose))}
    best = _best_per_neuron_op(SimpleNamespace(matches=rows), ids)
    assert best[(0, 0)] == (ids[value.key], pytest.approx(0.80), False, True)
    assert best[(1, 0)][0] == ids[loose.key] and best[(1, 0)][3] is False
