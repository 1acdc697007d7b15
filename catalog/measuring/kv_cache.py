"""Keys and values kept for forwards that share the start of their prompts: an operator's
few-shot prefix (``prefix_cache``), each distinct prompt head (``shared_heads``,
``head_cache``: "BOS 37 +" of a hundred grid prompts), as one frozen cache per row
(``expand_cache``, ``rows_of``) or one that a forward extends (``open_cache``)."""

from __future__ import annotations

import numpy as np
import torch
from transformer_lens import HookedTransformer
from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache
from transformer_lens.cache.key_value_cache_entry import TransformerLensKeyValueCacheEntry


def prefix_cache(model: HookedTransformer, prefix: np.ndarray) -> TransformerLensKeyValueCache:
    """Keys and values of a shared prefix (one sequence), computed once."""
    cache = TransformerLensKeyValueCache.init_cache(model.cfg, model.cfg.device, 1)
    tokens = torch.from_numpy(prefix[None]).to(model.cfg.device)
    model(tokens, past_kv_cache=cache, attention_mask=torch.ones_like(tokens))
    return cache


def expand_cache(cache: TransformerLensKeyValueCache, batch: int) -> TransformerLensKeyValueCache:
    """The same prefix for ``batch`` sequences, frozen so that forwards do not extend it."""
    entries = [TransformerLensKeyValueCacheEntry(
        past_keys=e.past_keys.expand(batch, -1, -1, -1),
        past_values=e.past_values.expand(batch, -1, -1, -1), frozen=True)
        for e in cache.entries]
    return TransformerLensKeyValueCache(
        entries=entries, previous_attention_mask=cache.previous_attention_mask.expand(batch, -1),
        frozen=True)


HEAD_SHARE = 0.8  # heads are shared where that runs at most this share of the positions
# and where a batch's own copy of its rows' cached keys and values (prefix and head) holds
# at most this many bytes: with a long few-shot prefix on a large model those copies
# would outgrow the forward itself (a prefix alone is shared by every row, not copied)
HEAD_BYTES = 256 * 2**20


def token_kv_bytes(model: HookedTransformer) -> int:
    """Bytes of one position's keys and values over every layer."""
    cfg = model.cfg
    heads = int(getattr(cfg, "n_key_value_heads", None) or cfg.n_heads)
    size = torch.empty(0, dtype=cfg.dtype).element_size()
    return int(cfg.n_layers) * 2 * heads * int(cfg.d_head) * size


def heads_fit(model: HookedTransformer, rows: int, h: int) -> bool:
    """Whether ``rows`` copies of ``h`` cached positions stay within ``HEAD_BYTES``."""
    return rows * h * token_kv_bytes(model) <= HEAD_BYTES


def shared_heads(toks: np.ndarray, p: int, fed: int) -> tuple[int, np.ndarray | None]:
    """Where to split prompts ``toks`` ((n, length), one group; ``p`` tokens a cached
    prefix, ``fed`` answer tokens fed after them) into a head run once per distinct head
    and a tail run per prompt: (h, each prompt's head number; None where no split saves
    enough). The grid's prompts share their first operand and operator ("BOS 37 +" for a
    hundred prompts on [0, 100)), which leaves two positions of five per prompt. The split
    minimizes the positions run: distinct heads x (h - p) + n x (length - h + fed)."""
    n, length = toks.shape
    best, best_h, best_of = n * (length - p + fed), p, None
    for h in range(p + 1, length):
        _, first, of = np.unique(toks[:, p:h], axis=0, return_index=True, return_inverse=True)
        cost = len(first) * (h - p) + n * (length - h + fed)
        if cost < best:
            best, best_h, best_of = cost, h, of.reshape(-1)
    if best_of is None or best > HEAD_SHARE * n * (length - p + fed):
        return p, None
    return best_h, best_of


def open_cache(model: HookedTransformer, prefix: TransformerLensKeyValueCache | None,
               n: int) -> TransformerLensKeyValueCache:
    """A cache of ``n`` rows that a forward extends, each ``prefix``'s (None: empty)."""
    if prefix is None:
        return TransformerLensKeyValueCache.init_cache(model.cfg, model.cfg.device, n)
    base = expand_cache(prefix, n)
    return TransformerLensKeyValueCache(
        entries=[TransformerLensKeyValueCacheEntry(
            past_keys=e.past_keys, past_values=e.past_values, frozen=False)
            for e in base.entries],
        previous_attention_mask=base.previous_attention_mask, frozen=False)


def head_cache(model: HookedTransformer, heads: np.ndarray, p: int,
               prefix: TransformerLensKeyValueCache | None,
               batch_size: int) -> TransformerLensKeyValueCache:
    """Keys and values of prompt heads ((u, h) tokens, the first ``p`` of them the cached
    ``prefix``'s), one row per head, frozen."""
    parts = []
    for s in range(0, len(heads), batch_size):
        rows = heads[s:s + batch_size]
        cache = open_cache(model, prefix, len(rows))
        t = torch.from_numpy(np.ascontiguousarray(rows[:, p:])).to(model.cfg.device)
        model(t, past_kv_cache=cache, stop_at_layer=model.cfg.n_layers,
              attention_mask=torch.ones(t.shape, dtype=torch.long, device=model.cfg.device))
        parts.append(cache)
    return TransformerLensKeyValueCache(
        entries=[TransformerLensKeyValueCacheEntry(
            past_keys=torch.cat([c.entries[i].past_keys for c in parts]),
            past_values=torch.cat([c.entries[i].past_values for c in parts]), frozen=True)
            for i in range(len(parts[0].entries))],
        previous_attention_mask=torch.cat([c.previous_attention_mask for c in parts]),
        frozen=True)


def rows_of(cache: TransformerLensKeyValueCache, rows: np.ndarray
            ) -> TransformerLensKeyValueCache:
    """A frozen cache of ``cache``'s ``rows`` (indices, repeats allowed)."""
    at = torch.as_tensor(np.asarray(rows, dtype=np.int64),
                         device=cache.previous_attention_mask.device)
    return TransformerLensKeyValueCache(
        entries=[TransformerLensKeyValueCacheEntry(
            past_keys=e.past_keys.index_select(0, at),
            past_values=e.past_values.index_select(0, at), frozen=True)
            for e in cache.entries],
        previous_attention_mask=cache.previous_attention_mask.index_select(0, at),
        frozen=True)
