"""Activation grids (docs/method.md section 3): every neuron's activation on every prompt.

For neuron n of layer L and operator op, ``K[a, b]`` is the neuron's activation
after the non-linearity (``blocks.L.mlp.hook_post``) at the last prompt position
of ``"{a}{op}{b}="``. One batched pass over the whole prompt table records these
for the requested layers and, from the same pass, whether the model answers each
prompt correctly (greedy continuation equals the result's tokens, judged by
teacher forcing so multi-token answers cost no extra passes).
"""

from __future__ import annotations

import numpy as np
import torch
from jaxtyping import Float
from transformer_lens import HookedTransformer
from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache
from transformer_lens.utilities import get_act_name
from transformer_lens.utilities.activation_functions import apply_softcap

from catalog.core.progress import progress_bar
from catalog.measuring.kv_cache import (
    expand_cache,
    head_cache,
    heads_fit,
    open_cache,
    prefix_cache,
    rows_of,
    shared_heads,
)
from catalog.measuring.prompts import PromptTable


def mlp_width(model: HookedTransformer) -> int:
    """The model's d_mlp (TransformerLens configs type it as optional; an MLP model has it)."""
    d_mlp = model.cfg.d_mlp
    if d_mlp is None:
        raise ValueError(f"{model.cfg.model_name} has no MLP width (d_mlp); it has no MLP "
                         "neurons to catalog")
    return int(d_mlp)


def w_out(model: HookedTransformer, layer: int) -> torch.Tensor:
    """Layer ``layer``'s MLP output weights (d_mlp, d_model), the block's own tensor.
    ``model.W_out[layer]`` stacks every layer's first (a copy of all the MLP output
    weights, 418 MB for a 0.5B model, 2.9 GB for a 7B one in bfloat16) on each call."""
    return model.blocks[layer].mlp.W_out


def b_out(model: HookedTransformer, layer: int) -> torch.Tensor:
    """Layer ``layer``'s MLP output bias (d_model,), without stacking every layer's."""
    b = model.blocks[layer].mlp.b_out
    assert isinstance(b, torch.Tensor)
    return b


def post_hook_name(layer: int) -> str:
    """TransformerLens name of layer ``layer``'s MLP activation hook."""
    return get_act_name("post", layer)


def final_logits(
    model: HookedTransformer, resid: Float[torch.Tensor, "batch pos d_model"]
) -> Float[torch.Tensor, "batch pos d_vocab"]:
    """Unembed a final residual stream (final LayerNorm where the model has one, then W_U).

    A bfloat16 or float16 model's final LayerNorm and unembedding run in float32 (on a
    float32 copy of W_U kept with the model): rounded to bfloat16, a logit near 10 moves
    in steps of 0.06, which would quantize every patching effect of a small neuron to 0
    or to one step. Probabilities, effects and their logarithms are then float32 too;
    float32 and float64 models are unembedded as they are. A soft cap on the logits
    (Gemma 2) is applied as the model's forward applies it."""
    ln = getattr(model, "ln_final", None)
    if resid.dtype in (torch.float32, torch.float64):
        logits = model.unembed(ln(resid) if ln is not None else resid)
    else:
        x = resid.float()
        if ln is not None:
            x = _norm_float(ln, x)
        w_u, b_u = _float_unembed(model)
        logits = x @ w_u + b_u
    return apply_softcap(logits, model.cfg.output_logits_soft_cap)


def _norm_float(ln: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """TransformerLens's LayerNorm / RMSNorm (with or without folded weights) in float32,
    without its cast back to the model's dtype."""
    if "RMS" not in type(ln).__name__:
        x = x - x.mean(-1, keepdim=True)
    eps = float(getattr(ln, "eps"))  # noqa: B009 (a plain float on every TL norm)
    x = x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()
    w, b = getattr(ln, "w", None), getattr(ln, "b", None)
    if w is not None:
        x = x * w.float()
    if b is not None:
        x = x + b.float()
    return x


def _float_unembed(model: HookedTransformer) -> tuple[torch.Tensor, torch.Tensor]:
    """(W_U, b_U) in float32, computed once per model and weights."""
    w, b = model.unembed.W_U, model.unembed.b_U
    key = (w.data_ptr(), w.dtype, w.device, b.data_ptr())
    cached = getattr(model, "_ncat_float_unembed", None)
    if cached is None or cached[0] != key:
        cached = (key, w.detach().float(), b.detach().float())
        model._ncat_float_unembed = cached  # type: ignore[assignment]
    return cached[1], cached[2]


def _groups(table: PromptTable) -> dict[tuple[int, int, int], np.ndarray]:
    """(operator index, prompt length, result token count) -> prompt indices."""
    keys = np.array([(o, len(t), len(r)) for o, t, r in zip(table.op, table.tokens,
                                                            table.result_tokens, strict=True)])
    out = {}
    for key in np.unique(keys, axis=0):
        out[(int(key[0]), int(key[1]), int(key[2]))] = np.nonzero((keys == key).all(axis=1))[0]
    return out


# architectures whose query/key norm acts on all heads' vectors at once (TransformerLens's
# attention applies it before splitting heads for these, per head for the others)
_WHOLE_VECTOR_QK_NORM = ("OlmoeForCausalLM", "Olmo2ForCausalLM", "Olmo3ForCausalLM")


def cache_keys(model: HookedTransformer, layer: int, k: torch.Tensor,
               v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values as a key/value cache entry holds them, from what ``hook_k`` and
    ``hook_v`` see: TransformerLens appends keys to the cache after the query/key norm
    (Qwen 3, Gemma 3, OLMo 2) and the clipping (OLMo), which come after those hooks.
    Without this, a single-position forward attending to hooked keys computed a
    different model on those architectures (tests/unit/test_architectures.py)."""
    cfg, attn = model.cfg, model.blocks[layer].attn
    if cfg.original_architecture in _WHOLE_VECTOR_QK_NORM and attn.k_norm is not None:
        k = attn.k_norm(k.flatten(-2)).view(k.shape)
    elif cfg.use_qk_norm and attn.k_norm is not None:
        k = attn._apply_qk_norm(k, attn.k_norm)
    if cfg.clip_qkv is not None:
        k = k.clamp(-cfg.clip_qkv, cfg.clip_qkv)
        v = v.clamp(-cfg.clip_qkv, cfg.clip_qkv)
    return k, v


class PrefixRunner:
    """Forward passes over groups of prompts that share their operator's prefix.

    ``groups()`` yields (skip, prompt indices) with every prompt of a group of one
    operator and one length; ``skip`` is how many leading tokens the shared prefix covers
    (0 when there is no prefix worth caching). ``run`` feeds only the tokens after it,
    attending to the prefix's keys and values computed once per operator. Hooks then see
    the prompt's own positions only: with a shared prefix, ablations and knockouts edit
    the prompt and leave the context (few-shot text and solved examples) as it is.
    """

    def __init__(self, model: HookedTransformer, table: PromptTable,
                 reuse_prefix: bool = True) -> None:
        self.model, self.table, self.reuse = model, table, reuse_prefix
        self._caches: dict[int, TransformerLensKeyValueCache] = {}
        self._contexts: dict[tuple[int, bytes], TransformerLensKeyValueCache] = {}

    def skip(self, op: int, length: int) -> int:
        p = len(self.table.prefix_tokens[op]) if self.reuse else 0
        return p if 2 <= p < length else 0

    def groups(self, prompts: np.ndarray | None = None):
        """(skip, indices) per (operator, length) group, restricted to ``prompts``."""
        t = self.table
        idx_all = np.arange(len(t)) if prompts is None else np.asarray(prompts)
        lengths = np.array([len(t.tokens[i]) for i in idx_all], dtype=np.int64)
        keys = np.stack([t.op[idx_all].astype(np.int64), lengths], axis=1) if len(idx_all) \
            else np.zeros((0, 2), dtype=np.int64)
        for key in np.unique(keys, axis=0):
            sel = idx_all[(keys == key).all(axis=1)]
            yield self.skip(int(key[0]), int(key[1])), sel

    def prefix_kv(self, op: int, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values (1, prefix, heads, d_head) of ``op``'s prefix at ``layer``."""
        entry = self._prefix(op).entries[layer]
        return entry.past_keys, entry.past_values

    def last_logits(self, idx: np.ndarray, skip: int, **kwargs) -> torch.Tensor:
        """Logits at the prompts' last position only, (len(idx), d_vocab): ``run`` up to
        the final residual stream, then the unembedding of that one position (with a large
        vocabulary, unembedding every position costs a fifth of a forward pass)."""
        resid = self.run(idx, skip, stop_at_layer=self.model.cfg.n_layers, **kwargs)
        return final_logits(self.model, resid[:, -1:])[:, 0]

    def context(self, idx: np.ndarray, skip: int) -> TransformerLensKeyValueCache:
        """Keys and values of every position of the prompts ``idx`` (one group) but the
        last, frozen: the shared prefix's from the operator's cache, the rest from one clean
        forward. Kept for the runner's lifetime, so that edits at the last position
        (``last_position_logits``) cost one position's forward each."""
        key = (skip, np.asarray(idx, dtype=np.int64).tobytes())
        if key in self._contexts:
            return self._contexts[key]
        model = self.model
        device = model.cfg.device
        cache = open_cache(model, self._prefix(int(self.table.op[idx[0]])) if skip else None,
                           len(idx))
        toks = torch.from_numpy(self.table.token_matrix(idx)[:, skip:-1]).to(device)
        if toks.shape[1]:
            model(toks, past_kv_cache=cache, stop_at_layer=model.cfg.n_layers,
                  attention_mask=torch.ones(toks.shape, dtype=torch.long, device=device))
        cache.freeze()
        self._contexts[key] = cache
        return cache

    def last_position_logits(self, idx: np.ndarray, skip: int, rows: np.ndarray | None = None,
                             **kwargs) -> torch.Tensor:
        """Logits (len(idx), d_vocab) of the prompts' last position, run alone against
        ``context(idx, skip)``: hooks see that one position, so an edit made there gives
        the same logits as a full forward with the same edit at the last position. With
        ``rows`` (indices into ``idx``, any order, repeats allowed: one row per edit to
        run), those rows of the group instead, against the same context: many edits of
        the same prompts in one forward."""
        model = self.model
        device = model.cfg.device
        cache = self.context(idx, skip)
        toks = self.table.token_matrix(idx)[:, -1:]
        if rows is not None:
            cache = rows_of(cache, rows)
            toks = toks[rows]
        resid = model.run_with_hooks(
            torch.from_numpy(np.ascontiguousarray(toks)).to(device), past_kv_cache=cache,
            stop_at_layer=model.cfg.n_layers,
            attention_mask=torch.ones(toks.shape, dtype=torch.long, device=device), **kwargs)
        return final_logits(model, resid)[:, 0]

    def context_bytes(self, idx: np.ndarray, skip: int) -> int:
        """Bytes of one row of ``context(idx, skip)`` (its keys and values)."""
        context = self.context(idx, skip)
        return sum(e.past_keys[:1].nbytes + e.past_values[:1].nbytes for e in context.entries)

    def shared_skip(self, idx: np.ndarray, length: int) -> int:
        """The prefix tokens that prompts ``idx`` (all ``length`` tokens long) share and can
        read from the cache: their operator's, when they are all of one operator; else 0."""
        ops = self.table.op[idx]
        return self.skip(int(ops[0]), length) if (ops == ops[0]).all() else 0

    def prefix(self, op: int) -> TransformerLensKeyValueCache:
        """The clean keys and values of operator ``op``'s prefix (computed once)."""
        return self._prefix(op)

    def _prefix(self, op: int) -> TransformerLensKeyValueCache:
        if op not in self._caches:
            self._caches[op] = prefix_cache(self.model, self.table.prefix_tokens[op])
        return self._caches[op]

    def run(self, idx: np.ndarray, skip: int, **kwargs):
        """``model.run_with_hooks`` on the prompts ``idx`` (one group) after ``skip`` tokens."""
        device = self.model.cfg.device
        toks = torch.from_numpy(self.table.token_matrix(idx)[:, skip:]).to(device)
        if not skip:
            return self.model.run_with_hooks(toks, **kwargs)
        cache = expand_cache(self._prefix(int(self.table.op[idx[0]])), len(idx))
        return self.model.run_with_hooks(
            toks, past_kv_cache=cache,
            attention_mask=torch.ones(toks.shape, dtype=torch.long, device=device), **kwargs)


def _contexts(model: HookedTransformer, table: PromptTable, o: int, toks: np.ndarray,
              fed: int, caches: dict, reuse: bool, batch_size: int):
    """(h, context_of) for one group of ``run_grid`` (operator ``o``, prompts ``toks``):
    the first h tokens of each prompt come from a cache (the operator's prefix, kept in
    ``caches``, or the prompt's head); ``context_of(start, stop)`` is the cache of the
    group's rows [start, stop) (None: no cache)."""
    length = toks.shape[1]
    p = len(table.prefix_tokens[o]) if reuse else 0
    if p < 2 or p >= length:  # BOS alone is not worth a cache; nothing after the prefix
        p = 0
    if p and o not in caches:
        caches[o] = prefix_cache(model, table.prefix_tokens[o])
    h, head_of = shared_heads(toks, p, fed) if reuse else (p, None)
    if not heads_fit(model, min(batch_size, len(toks)), h):
        h, head_of = p, None
    if head_of is not None:
        heads = head_cache(model, toks[np.unique(head_of, return_index=True)[1], :h], p,
                           caches.get(o), batch_size)
        return h, lambda start, stop: rows_of(heads, head_of[start:stop])
    return h, lambda start, stop: expand_cache(caches[o], stop - start) if p else None


@torch.no_grad()
def run_grid(
    model: HookedTransformer,
    table: PromptTable,
    layers: list[int],
    batch_size: int = 4096,
    progress: bool = False,
    reuse_prefix: bool = True,
    continuing: np.ndarray | None = None,
) -> dict[int, Float[np.ndarray, "prompt d_mlp"]]:
    """Last-position MLP activations of ``layers`` for every prompt; sets ``table.correct``.

    A prompt is correct when the greedy continuation is the result's tokens and, with
    ``continuing`` (the ids of tokens that would extend a number: those starting with a
    digit), the token after them is not one of those: ``0+2=22`` is not ``2``.

    With ``reuse_prefix`` an operator's shared prefix (few-shot text and solved examples,
    catalog.measuring.prompts) runs once, and so does each distinct prompt head where
    that saves positions (``shared_heads``: "BOS 37 +"); every batch attends to their
    cached keys and values instead of recomputing them; the activations are the same to
    float rounding (tested; bench/prefix.py). Returns layer -> float32 array (n_prompts,
    d_mlp) in table order."""
    n = len(table)
    d_mlp = mlp_width(model)
    device = model.cfg.device
    acts = {layer: np.empty((n, d_mlp), dtype=np.float32) for layer in layers}
    correct = np.zeros(n, dtype=bool)
    groups = _groups(table)
    total = sum(-(-len(idx) // batch_size) for idx in groups.values())
    bar = progress_bar(total, "activation grids", "batch", enabled=progress)
    caches: dict[int, TransformerLensKeyValueCache] = {}
    for (o, length, m), idx_all in groups.items():
        answer = m if continuing is not None else m - 1  # the result tokens fed
        toks = table.token_matrix(idx_all)
        h, context_of = _contexts(model, table, o, toks, answer, caches, reuse_prefix,
                                  batch_size)
        for start in range(0, len(idx_all), batch_size):
            idx = idx_all[start:start + batch_size]
            seq = np.concatenate([toks[start:start + batch_size, h:], np.stack(
                [table.result_tokens[i][:answer] for i in idx]).reshape(len(idx), -1)], 1)
            captured: dict[int, torch.Tensor] = {}
            last = length - 1 - h  # the prompt's last position in seq
            context = context_of(start, start + len(idx))

            def grab(act, hook, _pos=last, _store=captured):
                _store[hook.layer()] = act[:, _pos, :].float().cpu()

            resid = model.run_with_hooks(
                torch.from_numpy(seq).to(device),
                stop_at_layer=model.cfg.n_layers,
                fwd_hooks=[(post_hook_name(layer), grab) for layer in layers],
                past_kv_cache=context,
                attention_mask=(torch.ones(seq.shape, dtype=torch.long, device=device)
                                if context is not None else None),
            )
            pred = final_logits(model, resid[:, last:last + answer + 1]).argmax(-1).cpu()
            target = torch.from_numpy(np.stack([table.result_tokens[i] for i in idx]))
            ok = (pred[:, :m] == target).all(dim=1)
            if continuing is not None:
                ok &= ~torch.isin(pred[:, m], torch.as_tensor(continuing))
            correct[idx] = ok.numpy()
            for layer in layers:
                acts[layer][idx] = captured[layer].numpy()
            bar.update(1)
    bar.close()
    table.correct = correct
    return acts


@torch.no_grad()
def last_activations(
    runner: PrefixRunner, prompts: np.ndarray, layers: list[int],
) -> dict[int, Float[np.ndarray, "prompt d_mlp"]]:
    """Last-position MLP activations of ``layers`` for ``prompts`` (repeats allowed), in
    the order given: the few prompts of a patching run, without a grid pass."""
    model = runner.model
    uniq, inverse = np.unique(np.asarray(prompts, dtype=np.int64), return_inverse=True)
    got = {layer: np.empty((len(uniq), mlp_width(model)), dtype=np.float32) for layer in layers}
    if not len(uniq) or not layers:
        return {layer: got[layer][inverse] for layer in layers}
    for skip, sel in runner.groups(uniq):
        captured: dict[int, torch.Tensor] = {}

        def grab(act, hook, _store=captured):
            _store[hook.layer()] = act[:, -1].float().cpu()

        runner.run(sel, skip, stop_at_layer=max(layers) + 1,
                   fwd_hooks=[(post_hook_name(layer), grab) for layer in layers])
        rows = np.searchsorted(uniq, sel)
        for layer in layers:
            got[layer][rows] = captured[layer].numpy()
    return {layer: got[layer][inverse] for layer in layers}


def accuracy_by_operator(table: PromptTable) -> dict[str, float]:
    """Share of valid prompts answered correctly, per operator."""
    if table.correct is None:
        raise ValueError("prompt correctness is unknown; run run_grid first")
    return {op: float(table.correct[table.op_index(op)].mean()) for op in table.operators}
