"""The KV map, defined once (numpy only, so the store may use it to rebuild stored maps).

A neuron's K map is its activation over the grid's cells; its KV map multiplies each
cell by the neuron's logit-lens value of that cell's answer token: the neuron's direct
push on the right answer (docs/method.md section 4). Result heuristics are scored on it.
"""

from __future__ import annotations

import numpy as np


def kv_map(k: np.ndarray, answer_lens: np.ndarray) -> np.ndarray:
    """K times the lens value of each cell's answer. Both arrays share their shape:
    (d_mlp, cells) for a layer, or (cells,) for one neuron."""
    return k * answer_lens
