"""Patching effects of neurons (docs/method.md section 5): exact and attribution patching.

Activation patching asks how much one neuron, by itself, carries the answer: run
a clean prompt p (answer r) with neuron n's last-position activation replaced by
its value on a counterfactual prompt p' (answer r'), and compare next-token
probabilities P (clean) and P* (patched):

    effect(p, p') = 1/2 * [ (P*(r') - P(r')) / P(r')  +  (P(r) - P*(r)) / P*(r) ]

A neuron's effect is the mean over pairs.

Exact patching, done efficiently. Patching layer L's neuron at the last position
cannot change any earlier position (attention is causal), and it changes the
residual stream there by exactly ``delta * v_n`` (v_n = row n of W_out). So the
patched run only needs the LAST position recomputed from layer L+1 on, attending
to the clean run's cached keys and values of the earlier positions. Every
(pair, neuron) becomes one row of a batch of single-position forwards; for the
last layer the patched logits are just ``unembed(ln_final(resid + delta * v_n))``.
The rows of one pair share its cached keys (``catalog.measuring.single_position``: one product
per pair, no copy of them per neuron).
The naive way, one full forward with a hook per neuron, is kept in the tests as
the reference this must equal.

Attribution patching is the first-order estimate of the same effect for every
neuron at once: at delta = 0 the effect's derivative is
``1/2 * d(log P(r') - log P(r)) / dk_n``, so one forward and one backward pass
give ``grad * (k_n(p') - k_n(p))`` per pair. The heuristics paper's released code
ranks neurons by this (mean + std over prompts); both are kept.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float
from transformer_lens import HookedTransformer
from transformer_lens.cache.key_value_cache_entry import TransformerLensKeyValueCacheEntry
from transformer_lens.utilities import get_act_name

from catalog.measuring import single_position
from catalog.measuring.grids import (
    PrefixRunner,
    b_out,
    cache_keys,
    final_logits,
    last_activations,
    mlp_width,
    post_hook_name,
)
from catalog.measuring.grids import w_out as layer_w_out
from catalog.measuring.prompts import PromptTable


def patching_effect(p_r, p_rp, ps_r, ps_rp):
    """The effect of docs/method.md from probabilities (arrays or floats).

    p_r, p_rp: clean probabilities of the clean answer r and the counterfactual
    answer r'; ps_r, ps_rp: the same under patching.
    """
    return 0.5 * ((ps_rp - p_rp) / p_rp + (p_r - ps_r) / ps_r)


def log_effect(lp_r, lp_rp, lps_r, lps_rp):
    """The log-space effect: the same two terms on log-probabilities (catalog.measuring.effects)."""
    return 0.5 * ((lps_rp - lp_rp) + (lp_r - lps_r))


def effect_from_logprobs(lp_r, lp_rp, lps_r, lps_rp):
    """Same effect from log-probabilities, stable when probabilities are tiny.

    (P*(r') - P(r')) / P(r') = exp(log P*(r') - log P(r')) - 1, and likewise for r.
    """
    return 0.5 * (torch.expm1(lps_rp - lp_rp) + torch.expm1(lp_r - lps_r))


@dataclass
class PairBatch:
    """Clean-run facts about a set of (clean, counterfactual) pairs of one prompt length."""

    tokens: torch.Tensor  # (P, T) clean prompt tokens
    answer: torch.Tensor  # (P,) clean answer token r
    cf_answer: torch.Tensor  # (P,) counterfactual answer token r'
    positions: np.ndarray  # (P,) index of each pair in the caller's pair list


def pair_batches(table: PromptTable, clean: np.ndarray, cf: np.ndarray, device) -> list[PairBatch]:
    """Group pairs by clean prompt length so every batch runs without padding."""
    lengths = np.array([len(table.tokens[i]) for i in clean])
    out = []
    for n in np.unique(lengths):
        pos = np.nonzero(lengths == n)[0]
        out.append(PairBatch(
            tokens=torch.from_numpy(table.token_matrix(clean[pos])).to(device),
            answer=torch.from_numpy(table.answer[clean[pos]]).to(device),
            cf_answer=torch.from_numpy(table.answer[cf[pos]]).to(device),
            positions=pos,
        ))
    return out


def _last_position_forward(
    model: HookedTransformer,
    x: Float[torch.Tensor, "rows d_model"],
    first_block: int,
    past_kv: list[tuple[torch.Tensor, torch.Tensor]],
    repeat: int,
) -> Float[torch.Tensor, "rows d_vocab"]:
    """Run one position from ``first_block`` to the logits, attending to cached keys/values.

    ``past_kv[i]`` holds the clean run's keys and values of all earlier positions for
    block ``first_block + i``, one row per pair; each row of ``x`` is pair
    ``row // repeat``.
    """
    h = x[:, None, :]
    for i, block in enumerate(model.blocks[first_block:]):
        k, v = past_kv[i]
        entry = TransformerLensKeyValueCacheEntry(
            past_keys=k.repeat_interleave(repeat, dim=0),
            past_values=v.repeat_interleave(repeat, dim=0),
            frozen=True,
        )
        h = block(h, past_kv_cache_entry=entry)
    return final_logits(model, h)[:, 0]


def _later_logits(model: HookedTransformer, x: torch.Tensor, layer: int,
                  past: list[tuple[torch.Tensor, torch.Tensor]],
                  laid_out: list | None, repeat: int) -> torch.Tensor:
    """Logits of rows ``x`` (residual after ``layer``'s block at the last position), run
    through the later blocks: by ``single_position`` where ``laid_out`` holds its keys,
    else by TransformerLens's cached forward."""
    if layer + 1 == model.cfg.n_layers:
        return final_logits(model, x[:, None, :])[:, 0]
    if laid_out is not None:
        return final_logits(model, single_position.forward(model, x, layer + 1, laid_out))[:, 0]
    return _last_position_forward(model, x, layer + 1, past, repeat)


def _answer_logprobs(logits: torch.Tensor, answer: torch.Tensor,
                     cf_answer: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities of each row's two answers (rows, vocabulary -> two (rows,)): a
    logit less the row's log-sum-exp (log_softmax would write a second full-vocabulary
    tensor per forward)."""
    norm = torch.logsumexp(logits, -1)
    rows = torch.arange(len(logits), device=logits.device)
    return logits[rows, answer] - norm, logits[rows, cf_answer] - norm


def mlp_output_norm(model: HookedTransformer, layer: int) -> torch.nn.Module | None:
    """The norm a block applies to its MLP's output before adding it to the residual, where
    it has one: Gemma 2 and 3 (a norm before and after each sublayer), OLMo 2 (after only).
    None for the others, where a neuron adds its activation times its W_out row."""
    from transformer_lens.utilities.architectures import POST_NORM_ARCHITECTURES

    block = model.blocks[layer]
    if model.cfg.use_normalization_before_and_after:
        return block.ln2_post
    if model.cfg.original_architecture in POST_NORM_ARCHITECTURES:
        return block.ln2
    return None


@torch.no_grad()
def exact_patching(
    model: HookedTransformer,
    table: PromptTable,
    layer: int,
    clean: np.ndarray,
    cf: np.ndarray,
    cf_acts: Float[np.ndarray, "pair d_mlp"],
    chunk: int = 64,
    neurons: np.ndarray | None = None,
    with_log: bool = False,
    reuse_prefix: bool = True,
    grouped: bool = True,
):
    """Exact patching effect of the neurons of ``layer`` (all, or ``neurons``) on every pair.

    ``cf_acts[j]`` is the layer's last-position activation vector on counterfactual
    prompt ``cf[j]``. Returns a float32 (n_neurons, n_pairs) array of the paper's
    effect, and with ``with_log`` also the log-space effect of the same shape. With
    ``reuse_prefix`` the clean run starts after the operator's shared prefix, whose keys
    and values come from its cache (catalog.measuring.grids.PrefixRunner). With ``grouped`` (and a
    model ``catalog.measuring.single_position`` supports) the rows of a pair attend to its cached
    keys without copies of them (``single_position``); otherwise through TransformerLens's
    cached forward, a copy of the keys per row.
    """
    n_layers = model.cfg.n_layers
    device = model.cfg.device
    sel_all = (np.arange(mlp_width(model)) if neurons is None
               else np.asarray(neurons, dtype=np.int64))
    d_sel = len(sel_all)
    sel_t = torch.as_tensor(sel_all, device=device)
    out = np.empty((d_sel, len(clean)), dtype=np.float32)
    out_log = np.empty((d_sel, len(clean)), dtype=np.float32)
    w_out = layer_w_out(model, layer)[sel_t]  # (n_neurons, d_model)
    later = list(range(layer + 1, n_layers))
    names = {get_act_name("resid_post", layer), post_hook_name(layer)}
    post_norm = mlp_output_norm(model, layer)
    if post_norm is not None:
        names.add(get_act_name("resid_mid", layer))
    for lay in later:
        names |= {get_act_name("k", lay), get_act_name("v", lay)}
    runner = PrefixRunner(model, table, reuse_prefix)
    for pb in pair_batches(table, clean, cf, device):
        group = clean[pb.positions]
        op = int(table.op[group[0]])
        skip = runner.shared_skip(group, pb.tokens.shape[1])
        cache: dict[str, torch.Tensor] = {}

        def grab(act, hook, _cache=cache):
            _cache[hook.name] = act

        # the clean forward fills the cache (its logits are not the baseline: see below)
        runner.last_logits(group, skip, fwd_hooks=[(n, grab) for n in names])
        resid = cache[get_act_name("resid_post", layer)][:, -1]  # (P, d_model)
        act_clean = cache[post_hook_name(layer)][:, -1][:, sel_t]  # (P, n_neurons)
        if post_norm is not None:
            # the MLP's output is normalised before the residual adds it: a neuron moves
            # the residual by norm(out + delta w_out) - norm(out), not by delta w_out; the
            # clean residual is rebuilt the same way, so that equal inputs round equally
            resid_mid = cache[get_act_name("resid_mid", layer)][:, -1]
            mlp_raw = (cache[post_hook_name(layer)][:, -1] @ layer_w_out(model, layer)
                       + b_out(model, layer))  # (P, d_model), before the norm
            resid = resid_mid + post_norm(mlp_raw)
        delta_all = torch.as_tensor(cf_acts[pb.positions][:, sel_all], device=device,
                                    dtype=act_clean.dtype) - act_clean
        past = [cache_keys(model, lay, cache[get_act_name("k", lay)][:, :-1],
                           cache[get_act_name("v", lay)][:, :-1]) for lay in later]
        if skip:  # the prefix's keys and values, then the prompt's own
            n_g = len(group)
            past = [(torch.cat([pk.expand(n_g, -1, -1, -1), k], dim=1),
                     torch.cat([pv.expand(n_g, -1, -1, -1), v], dim=1))
                    for (k, v), (pk, pv) in zip(past, (runner.prefix_kv(op, lay)
                                                       for lay in later), strict=True)]
        # the clean baseline goes through the same single-position path as the patched
        # rows: in bfloat16 on a GPU, two kernel paths round differently, and that
        # difference (not the neuron) would be every small neuron's "effect"
        laid_out = (single_position.prepare(model, layer + 1, past)
                    if later and grouped and single_position.supports(model) else None)
        base = _later_logits(model, resid, layer, past, laid_out, repeat=1)
        lp_r, lp_rp = _answer_logprobs(base, pb.answer, pb.cf_answer)
        n_pairs = len(pb.answer)
        for start in range(0, d_sel, chunk):
            sl = slice(start, min(start + chunk, d_sel))
            c = sl.stop - sl.start
            delta = delta_all[:, sl]  # (P, c)
            if post_norm is None:
                x = resid[:, None, :] + delta[..., None] * w_out[sl][None]  # (P, c, d_model)
            else:
                x = resid_mid[:, None, :] + post_norm(
                    mlp_raw[:, None, :] + delta[..., None] * w_out[sl][None])
            patched = _later_logits(model, x.reshape(n_pairs * c, -1), layer, past, laid_out,
                                    repeat=c)
            lps_r, lps_rp = (lp.view(n_pairs, c) for lp in _answer_logprobs(
                patched, pb.answer.repeat_interleave(c), pb.cf_answer.repeat_interleave(c)))
            eff = effect_from_logprobs(lp_r[:, None], lp_rp[:, None], lps_r, lps_rp)  # (P, c)
            out[sl][:, pb.positions] = eff.T.float().cpu().numpy()
            if with_log:
                le = log_effect(lp_r[:, None], lp_rp[:, None], lps_r, lps_rp)
                out_log[sl][:, pb.positions] = le.T.float().cpu().numpy()
    return (out, out_log) if with_log else out


def gradient_tap(act: torch.Tensor) -> torch.Tensor:
    """``act`` in the autograd graph with its gradient kept, for a forward hook to return.
    Loaded models' weights require no gradient (``catalog.sources.load_model``: a gradient
    for every weight would double the memory of a run), so nothing before the first tapped
    activation is in the graph: that one becomes a leaf that requires grad, and every later
    activation depends on it, so each tapped gradient is the full derivative. On a model
    whose weights do require grad it only keeps the gradient."""
    if not act.requires_grad:
        return act.detach().requires_grad_(True)
    act.retain_grad()
    return act


def attribution_patching(
    model: HookedTransformer,
    table: PromptTable,
    layers: list[int],
    clean: np.ndarray,
    cf_acts: dict[int, Float[np.ndarray, "pair d_mlp"]] | None,
    cf: np.ndarray,
    reuse_prefix: bool = True,
) -> dict[int, Float[np.ndarray, "d_mlp pair"]]:
    """First-order estimate of the patching effect for all neurons of ``layers``.

    One forward and one backward pass per prompt-length group, for all ``layers`` at
    once (a layer's gradient does not depend on which other layers are read, so asking
    for every layer costs what one costs). ``cf_acts`` (layer -> the counterfactual
    prompts' last-position activations) is computed here when None. Returns layer ->
    float32 (d_mlp, n_pairs).
    """
    device = model.cfg.device
    d_mlp = mlp_width(model)
    out = {layer: np.empty((d_mlp, len(clean)), dtype=np.float32) for layer in layers}
    runner = PrefixRunner(model, table, reuse_prefix)
    if cf_acts is None:
        cf_acts = last_activations(runner, cf, layers)
    for pb in pair_batches(table, clean, cf, device):
        saved: dict[int, torch.Tensor] = {}
        # the clean prompts of one batch share an operator and a length, so a shared
        # prefix's keys and values are computed once (no gradient flows into them: the
        # derivative is taken at the last position, which they do not depend on)
        group = clean[pb.positions]
        skip = runner.shared_skip(group, pb.tokens.shape[1])
        if skip:
            with torch.no_grad():
                runner.run(group[:1], skip)  # builds the operator's prefix cache once

        def keep(act, hook, _saved=saved):
            act = gradient_tap(act)
            _saved[hook.layer()] = act
            return act

        with torch.enable_grad():
            model.zero_grad(set_to_none=True)
            lp = runner.last_logits(group, skip, fwd_hooks=[(post_hook_name(layer), keep)
                                                           for layer in layers]).log_softmax(-1)
            rows = torch.arange(len(pb.answer), device=device)
            metric = 0.5 * (lp[rows, pb.cf_answer] - lp[rows, pb.answer]).sum()
            metric.backward()
        for layer in layers:
            act = saved[layer][:, -1].detach()
            grad_all = saved[layer].grad
            assert grad_all is not None  # retained by the hook above
            grad = grad_all[:, -1]
            delta = torch.as_tensor(cf_acts[layer][pb.positions], device=device,
                                    dtype=act.dtype) - act
            out[layer][:, pb.positions] = (grad * delta).T.float().cpu().numpy()
        model.zero_grad(set_to_none=True)
    return out
