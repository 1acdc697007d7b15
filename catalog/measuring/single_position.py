"""One position through a model's later blocks, attending to cached keys and values that
are shared by groups of rows: exact patching's inner loop (catalog.measuring.patching).

Exact patching runs the last position of a pair once per neuron (a chunk of neurons at a
time), each row attending to the same cached keys and values of that pair's earlier
positions. TransformerLens's own cached forward wants one cache row per batch row, so
the keys and values were copied once per neuron of the chunk, the whole cache was copied
again to append the new position, every cached key was rotated again on every forward,
and each block normalised its input three times (for queries, keys and values). Here:

- the attention of a chunk's rows is one batched product per pair against that pair's
  keys (``(chunk x heads) @ keys``), with the new position's own key and value added as
  one more column; nothing is repeated or concatenated along the cache;
- cached keys are rotated once per pair batch (``prepare``), as TransformerLens rotates
  them (positions from 0), and the new position at its offset;
- the block's input norm runs once.

The numbers are TransformerLens's computation in another order of summation (the tests
hold the two to float rounding on every architecture of the README's table, and exact
patching to the naive loop). Models with a feature this does not reproduce (ALiBi,
relative position biases, attention sinks, split or per-head inputs, 4-bit weights,
dynamic NTK rotary scaling, shortformer positions) take TransformerLens's path
(``supports`` says which).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformer_lens import HookedTransformer
from transformer_lens.components import LayerNorm, LayerNormPre
from transformer_lens.utilities.activation_functions import apply_softcap
from transformer_lens.utilities.architectures import POST_NORM_ARCHITECTURES

from catalog.measuring.grids import _WHOLE_VECTOR_QK_NORM


def supports(model: HookedTransformer) -> bool:
    """Whether ``forward`` reproduces this model's blocks (else TransformerLens's path)."""
    cfg = model.cfg
    return (cfg.positional_embedding_type in ("standard", "rotary")
            and not cfg.use_attention_sinks and not cfg.use_attn_result
            and not cfg.use_split_qkv_input and not cfg.use_attn_in
            and not cfg.load_in_4bit and not cfg.use_dynamic_ntk_rope
            and not getattr(cfg, "use_logn_attn", False)
            and cfg.attention_dir == "causal"
            and all(b.attn._attention_dir_override in (None, "causal") for b in model.blocks))


@dataclass
class _Past:
    """One block's cached keys and values of a pair batch, laid out for the products:
    keys (pairs, kv_heads, d_head, positions), rotated; values (pairs, kv_heads,
    positions, d_head); the output projection as F.linear takes it."""

    keys_t: torch.Tensor
    values: torch.Tensor
    w_qkv: torch.Tensor  # queries', keys' and values' projections as one (F.linear's layout)
    b_qkv: torch.Tensor
    rotated: bool  # the new position's rotation is folded into w_qkv and b_qkv
    w_o: torch.Tensor
    window_mask: torch.Tensor | None  # (positions,) True where a local layer cannot see


def prepare(model: HookedTransformer, first_block: int,
            past_kv: list[tuple[torch.Tensor, torch.Tensor]]) -> list[_Past]:
    """``past_kv[i]`` (keys and values as a key/value cache entry holds them, (pairs,
    positions, kv_heads, d_head)) of block ``first_block + i``, laid out once for every
    chunk of rows that attends to them."""
    out = []
    for i, (k, v) in enumerate(past_kv):
        attn = model.blocks[first_block + i].attn
        n_pos = k.shape[1]
        if model.cfg.positional_embedding_type == "rotary":
            k = attn.apply_rotary(k, 0, None)
        mask = None
        if attn.attn_type == "local":  # the new position (n_pos) sees keys past n_pos - window
            window = int(model.cfg.window_size or 0)
            mask = torch.arange(n_pos, device=k.device) <= n_pos - window
        w_o = attn.W_O.permute(2, 0, 1).reshape(attn.W_O.shape[2], -1).contiguous()
        w_qkv, b_qkv = _projections(attn)
        rotated = False
        # folded only in float32 and float64: rounded to bfloat16, rotated weights would be
        # a second rounding of the model itself, not of one product
        if (model.cfg.positional_embedding_type == "rotary" and _linear_before_rotary(attn)
                and w_qkv.dtype in (torch.float32, torch.float64)):
            w_qkv, b_qkv = _rotated_projections(attn, w_qkv, b_qkv, n_pos)
            rotated = True
        out.append(_Past(k.permute(0, 2, 3, 1).contiguous(), v.permute(0, 2, 1, 3).contiguous(),
                         w_qkv, b_qkv, rotated, w_o, mask))
    return out


def _linear_before_rotary(attn) -> bool:
    """Whether queries and keys reach the rotation straight from their projections (no
    query/key norm or clipping between), so that the rotation folds into them."""
    cfg = attn.cfg
    return (not cfg.use_qk_norm and cfg.clip_qkv is None
            and cfg.original_architecture not in _WHOLE_VECTOR_QK_NORM)


def _rotated_projections(attn, w: torch.Tensor, b: torch.Tensor,
                         n_pos: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The stacked projections with the queries' and keys' rotation at position ``n_pos``
    folded in: the rotation is linear, so rotating the projected vector equals projecting
    with rotated weights and bias (values are not rotated)."""
    d_head = attn.cfg.d_head
    n_qk = w.shape[0] - (w.shape[0] - attn.cfg.n_heads * d_head) // 2  # less the values

    def rotate(m: torch.Tensor) -> torch.Tensor:  # (n, outputs): each output row a head's
        heads = m[:, :n_qk].unflatten(-1, (-1, d_head))[:, None]  # (n, 1, heads, d_head)
        return torch.cat([attn.apply_rotary(heads, n_pos, None).flatten(-2)[:, 0],
                          m[:, n_qk:]], dim=-1)

    return rotate(w.T).T.contiguous(), rotate(b[None])[0]


def _projections(attn) -> tuple[torch.Tensor, torch.Tensor]:
    """The query, key and value weights (heads, d_model, d_head) and biases (heads,
    d_head) stacked as one (outputs, d_model) matrix: the grouped ones unrepeated, as
    TransformerLens's grouped-query attention projects them."""
    grouped = hasattr(attn, "_W_K") and not attn.cfg.ungroup_grouped_query_attention
    ws = (attn.W_Q, attn._W_K, attn._W_V) if grouped else (attn.W_Q, attn.W_K, attn.W_V)
    bs = (attn.b_Q, attn._b_K, attn._b_V) if grouped else (attn.b_Q, attn.b_K, attn.b_V)
    w = torch.cat([x.permute(0, 2, 1).reshape(-1, x.shape[1]) for x in ws]).contiguous()
    return w, torch.cat([b.reshape(-1) for b in bs])


def _norm(ln, x: torch.Tensor) -> torch.Tensor:
    """A TransformerLens norm module on ``x``: its LayerNorm (with or without folded
    weights) as one fused ``layer_norm`` in float32 and float64 (TransformerLens spells it
    out in five passes over the rows), any other norm as the module computes it."""
    if x.dtype in (torch.float32, torch.float64):
        if type(ln) is LayerNormPre:
            return F.layer_norm(x, (x.shape[-1],), eps=ln.eps)
        if type(ln) is LayerNorm:
            return F.layer_norm(x, (x.shape[-1],), ln.w, ln.b, eps=ln.eps)
    return ln(x)


def _attention(attn, x: torch.Tensor, past: _Past, n_pos: int) -> torch.Tensor:
    """TransformerLens's attention at position ``n_pos`` for rows ``x`` (rows, 1, d_model),
    row r attending to pair ``r // (rows / pairs)``'s cached keys and to its own."""
    cfg = attn.cfg
    d_head = attn.cfg.d_head
    kv_heads = past.keys_t.shape[1]
    qkv = F.linear(x, past.w_qkv, past.b_qkv)
    n_q = qkv.shape[-1] - 2 * kv_heads * d_head
    q = qkv[..., :n_q].unflatten(-1, (-1, d_head))  # (rows, 1, heads, d_head)
    k = qkv[..., n_q:n_q + kv_heads * d_head].unflatten(-1, (kv_heads, d_head))
    v = qkv[..., n_q + kv_heads * d_head:].unflatten(-1, (kv_heads, d_head))
    if cfg.use_qk_norm:
        q = attn._apply_qk_norm(q, attn.q_norm)
        k = attn._apply_qk_norm(k, attn.k_norm)
    if cfg.original_architecture in _WHOLE_VECTOR_QK_NORM:
        q = attn.q_norm(q.flatten(-2)).view(q.shape)
        k = attn.k_norm(k.flatten(-2)).view(k.shape)
    if cfg.clip_qkv is not None:
        q, k, v = (t.clamp(-cfg.clip_qkv, cfg.clip_qkv) for t in (q, k, v))
    if cfg.positional_embedding_type == "rotary" and not past.rotated:
        q = attn.apply_rotary(q, n_pos, None)
        k = attn.apply_rotary(k, n_pos, None)
    pairs = past.keys_t.shape[0]
    rows, heads = q.shape[0], q.shape[2]
    chunk, group = rows // pairs, heads // kv_heads
    # query head h reads key/value head h // group (TransformerLens repeats them so)
    qg = q.view(pairs, chunk, kv_heads, group, d_head)
    scores_past = qg.permute(0, 2, 1, 3, 4).reshape(pairs, kv_heads, chunk * group, d_head) \
        @ past.keys_t  # (pairs, kv_heads, chunk * group, positions)
    kg = k.view(pairs, chunk, kv_heads, 1, d_head)
    scores_self = (qg * kg).sum(-1).permute(0, 2, 1, 3).reshape(pairs, kv_heads, chunk * group, 1)
    scores = torch.cat([scores_past, scores_self], dim=-1) / attn.attn_scale
    scores = apply_softcap(scores, cfg.attn_scores_soft_cap)
    if past.window_mask is not None:
        scores[..., :n_pos].masked_fill_(past.window_mask, float("-inf"))
    pattern = F.softmax(scores, dim=-1).to(v.dtype)
    z = (pattern[..., :n_pos] @ past.values).view(pairs, kv_heads, chunk, group, d_head)
    own = pattern[..., n_pos:].view(pairs, kv_heads, chunk, group, 1) \
        * v.view(pairs, chunk, kv_heads, 1, d_head).permute(0, 2, 1, 3, 4)
    z = (z + own).permute(0, 2, 1, 3, 4).reshape(rows, 1, heads * d_head)
    return F.linear(z.to(past.w_o.dtype), past.w_o, attn.b_O)


def _block(block, h: torch.Tensor, past: _Past, n_pos: int) -> torch.Tensor:
    """TransformerLens's ``TransformerBlock.forward`` without hooks, its attention
    ``_attention`` and its input norm computed once."""
    cfg = block.cfg
    post = cfg.original_architecture in POST_NORM_ARCHITECTURES
    attn_out = _attention(block.attn, h if post else _norm(block.ln1, h), past, n_pos)
    if cfg.use_normalization_before_and_after:
        attn_out = block.ln1_post(attn_out)
    if post:
        attn_out = block.ln1(attn_out)
    if cfg.parallel_attn_mlp:
        return h + attn_out + block.apply_mlp(_norm(block.ln2, h))
    if cfg.attn_only:
        return h + attn_out
    mid = h + attn_out
    return mid + block.apply_mlp(mid if post else _norm(block.ln2, mid))


def forward(model: HookedTransformer, x: torch.Tensor, first_block: int,
            past: list[_Past]) -> torch.Tensor:
    """The residual stream after the last block for rows ``x`` (rows, d_model) at the
    position after the cached ones, from block ``first_block`` on; the rows are pair-major
    (each pair's rows together, as many per pair)."""
    h = x[:, None, :]
    for i, block in enumerate(model.blocks[first_block:]):
        h = _block(block, h, past[i], past[i].values.shape[2])
    return h
