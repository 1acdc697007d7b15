"""Logit lens of neurons (docs/method.md section 4): what each value vector writes.

An MLP layer adds ``sum_n k_n(x) * v_n`` to the residual stream, where ``v_n`` is
row n of ``W_out``. Projecting ``v_n`` through the unembedding, ``lens_n = v_n @ W_U``,
says which tokens the neuron promotes when it fires. Models are loaded with
TransformerLens weight processing (fold_ln, center_unembed, center_writing_weights)
so the final LayerNorm's weights are folded into ``W_U`` and no per-prompt scale
applies. The whole layer is one matrix product; the full-vocabulary top/bottom-k
is taken in chunks of neurons so that large vocabularies fit in memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float, Int
from transformer_lens import HookedTransformer

from catalog.measuring.grids import w_out as layer_w_out


@dataclass
class LensResult:
    """Logit lens of one layer's neurons.

    numbers: (d_mlp, limit + 1) lens value of each single-token number 0..limit.
    top_ids / top_values, bottom_ids / bottom_values: (d_mlp, k) the k most promoted
    and most suppressed tokens over the whole vocabulary, strongest first.
    """

    numbers: Float[np.ndarray, "d_mlp n_numbers"]
    top_ids: Int[np.ndarray, "d_mlp k"]
    top_values: Float[np.ndarray, "d_mlp k"]
    bottom_ids: Int[np.ndarray, "d_mlp k"]
    bottom_values: Float[np.ndarray, "d_mlp k"]


@torch.no_grad()
def lens_at(
    model: HookedTransformer, layer: int, token_ids: np.ndarray
) -> Float[np.ndarray, "d_mlp n_tokens"]:
    """``W_out[layer] @ W_U[:, token_ids]``: each neuron's direct effect on these tokens."""
    ids = torch.as_tensor(np.asarray(token_ids), device=model.W_U.device, dtype=torch.long)
    return (layer_w_out(model, layer) @ model.W_U[:, ids]).float().cpu().numpy()


@torch.no_grad()
def logit_lens(
    model: HookedTransformer,
    layer: int,
    number_ids: np.ndarray,
    k: int = 10,
    chunk: int = 1024,
) -> LensResult:
    """Number-token lens vector and full-vocabulary top/bottom-k for every neuron of ``layer``."""
    w_out = layer_w_out(model, layer)
    k = min(k, model.cfg.d_vocab)
    tops, topv, bots, botv = [], [], [], []
    for start in range(0, w_out.shape[0], chunk):
        logits = (w_out[start:start + chunk] @ model.W_U).float()  # (chunk, d_vocab)
        v, i = logits.topk(k, dim=-1)
        tops.append(i)
        topv.append(v)
        v, i = logits.topk(k, dim=-1, largest=False)
        bots.append(i)
        botv.append(v)

    def cat(xs):
        return torch.cat(xs).cpu().numpy()

    return LensResult(
        numbers=lens_at(model, layer, number_ids),
        top_ids=cat(tops).astype(np.int64),
        top_values=cat(topv).astype(np.float32),
        bottom_ids=cat(bots).astype(np.int64),
        bottom_values=cat(botv).astype(np.float32),
    )
