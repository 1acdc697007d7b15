"""The multi-result family: the result in a few values the neuron chose (``/`` only)."""

from __future__ import annotations

import numpy as np

from catalog.labels.families import Family, register


def multi_result_scores(kv_map, result: np.ndarray, config, op: int = 0):
    """Its rows of one operator's KV maps (``catalog.labels.matching.multi_result_matches``)."""
    from catalog.labels.matching import multi_result_matches

    return multi_result_matches(kv_map, result, top=config.multi_result_top,
                                floor=config.score_floor, op=op, family="multi_result")


MULTI_RESULT = register(Family(
    name="multi_result",
    doc="the result in a small set of values, chosen per neuron as the results it pushes "
        "most (`/` only; its p-value carries the correction for the choice)",
    color="#8c564b",
    describe=lambda who, p: f"result in {{{', '.join(map(str, p))}}}",
    test=lambda x, p: np.isin(x, np.array(p)),
    null="own",
    simplicity=5,
    chosen=True,
    operators=("/",),
    score=multi_result_scores,
))
