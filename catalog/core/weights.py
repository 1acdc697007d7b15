"""A content hash of model weights, the same for every model source.

The catalog records it with each checkpoint so that a re-run can prove it measured the
same weights, and so that published checkpoints serving identical weights are flagged.
"""

from __future__ import annotations

import hashlib

import torch


def hash_tensor(h, name: str, tensor: torch.Tensor) -> None:
    """Feed one named tensor to the SHA-256 ``h`` as ``weights_hash`` does: name, dtype,
    shape, raw bytes. A loader that streams its tensors in sorted name order gets the
    hash of the whole state dict (``catalog.sources.streaming``)."""
    t = tensor.detach().to("cpu").contiguous()
    h.update(name.encode())
    h.update(str(t.dtype).encode())
    h.update(str(tuple(t.shape)).encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().data)  # a buffer: no copy of the bytes


def weights_hash(state_dict: dict[str, torch.Tensor]) -> str:
    """SHA-256 over parameter names, dtypes, shapes and raw bytes, in sorted name order."""
    h = hashlib.sha256()
    for name in sorted(state_dict):
        hash_tensor(h, name, state_dict[name])
    return h.hexdigest()
