"""One digest of numpy arrays (dtype, shape and bytes of each), for the caches a process
keeps by what they are computed from (``catalog.labels.fit_models.fold_model``, the
token-format control in ``catalog.labels.controls``, the label fits of
``catalog.labels.operator_labels.operand_fit``)."""

from __future__ import annotations

import hashlib

import numpy as np


def array_digest(*arrays: np.ndarray, text: str = "", size: int = 16) -> str:
    """Hex digest of ``text`` and each array's dtype, shape and bytes, in order: equal for
    arrays equal element by element with the same dtype and shape, whatever their
    memory layout."""
    h = hashlib.blake2b(text.encode(), digest_size=size)
    for x in arrays:
        x = np.ascontiguousarray(x)
        h.update(f"|{x.dtype.str}{x.shape}".encode())
        h.update(x.tobytes())
    return h.hexdigest()
