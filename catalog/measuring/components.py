"""Component effects: the patching effect of every attention head and every whole MLP layer.

Before looking at neurons, the heuristics paper (and the mediation paper before it)
asks which COMPONENTS carry the answer: it patches each attention head's output and each
MLP layer's output, one at a time and one prompt position at a time, from a
counterfactual prompt into the clean run, and reads the same effect as for neurons
(docs/method.md §5). Late MLPs at the last position and a few heads that move the
operands there carry most of it. The catalog uses the result twice: the circuit keeps
the heads of largest effect, and the first MLP layer with a large effect at the last
position is where neurons start being pruned (``catalog.circuits.paper``).

A component is a head's output ``hook_z`` (before ``W_O``) or a layer's ``hook_mlp_out``,
patched at one of the prompt's ``ROLES`` (the last token of each operand and of the
operator, and the last position; the counterfactual prompt supplies its value at the
same role). Every role gets attribution patching (one forward and backward pass per
pair batch for all components and positions); exact patching runs the positions in
``exact_roles``. An exact patch at position p of layer L changes nothing before p and
nothing below L, so each (pair, component) row runs only positions p.. from block L
on, attending to the clean run's cached keys and values of everything earlier (the same
idea as neurons' exact patching, over a suffix instead of one position). Like neurons,
each component's statistics come from exact patching where it ran and from attribution
elsewhere; the tests hold the exact path equal to full forwards with one hook.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float
from transformer_lens import HookedTransformer
from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache
from transformer_lens.cache.key_value_cache_entry import TransformerLensKeyValueCacheEntry
from transformer_lens.utilities import get_act_name

from catalog.config.vocab import ROLES
from catalog.core.stats import nan_mean
from catalog.measuring import effects
from catalog.measuring.ablation import z_hook_name
from catalog.measuring.grids import PrefixRunner, cache_keys, final_logits
from catalog.measuring.patching import effect_from_logprobs, gradient_tap, log_effect, pair_batches
from catalog.measuring.prompts import PromptTable


def mlp_out_name(layer: int) -> str:
    return get_act_name("mlp_out", layer)


@dataclass
class ComponentEffects:
    """Effects of one operator's components: axis 1 is the head index, ``n_heads`` being
    the whole MLP layer; axis 2 follows ``ROLES``. Exact statistics are NaN where a role
    was not exactly patched."""

    n_pairs: int
    exact_roles: tuple[str, ...]
    effect_exact: Float[np.ndarray, "n_layers comp role"]  # the paper's mean
    effect_exact_std: Float[np.ndarray, "n_layers comp role"]
    effect_attr: Float[np.ndarray, "n_layers comp role"]  # attribution, log-space mean
    effect_attr_std: Float[np.ndarray, "n_layers comp role"]
    effect_log: Float[np.ndarray, "n_layers comp role"]  # exact where measured, else attribution
    effect_median: Float[np.ndarray, "n_layers comp role"]
    effect_trimmed: Float[np.ndarray, "n_layers comp role"]
    moved_share: Float[np.ndarray, "n_layers comp role"]
    is_exact: np.ndarray  # (n_layers, comp, role) bool
    rank_value: Float[np.ndarray, "n_layers comp role"]  # the config's ranking statistic

    @property
    def n_heads(self) -> int:
        return self.rank_value.shape[1] - 1

    def head_scores(self, sign: str) -> np.ndarray:
        """(n_layers, n_heads): each head's rank key averaged over the roles (the paper
        averages its effect maps over positions 1-4), largest first."""
        return effects.rank_key(nan_mean(self.rank_value[:, :-1], axis=2), sign)

    def mlp_last(self, sign: str) -> np.ndarray:
        """(n_layers,): each whole MLP layer's rank key at the last position."""
        return effects.rank_key(self.rank_value[:, -1, ROLES.index("last")], sign)


def _roles_in_run(table: PromptTable, idx: np.ndarray, skip: int) -> np.ndarray:
    """(len(idx), n_roles) role positions counted in the run part (after ``skip``)."""
    assert table.role_pos is not None
    return table.role_pos[idx] - skip


@torch.no_grad()
def _capture_at_roles(runner: PrefixRunner, prompts: np.ndarray, n_layers: int,
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """hook_z (n, n_layers, n_roles, n_heads, d_head) and hook_mlp_out (n, n_layers,
    n_roles, d_model) of ``prompts`` at their own role positions (repeats allowed)."""
    model, table = runner.model, runner.table
    cfg = model.cfg
    uniq, inverse = np.unique(np.asarray(prompts, dtype=np.int64), return_inverse=True)
    z = torch.zeros(len(uniq), n_layers, len(ROLES), cfg.n_heads, cfg.d_head,
                    dtype=cfg.dtype, device=cfg.device)
    mlp = torch.zeros(len(uniq), n_layers, len(ROLES), cfg.d_model, dtype=cfg.dtype,
                      device=cfg.device)
    for skip, sel in runner.groups(uniq):
        rows = torch.as_tensor(np.searchsorted(uniq, sel), device=cfg.device)
        pos = torch.as_tensor(_roles_in_run(table, sel, skip), device=cfg.device)
        got: dict[str, torch.Tensor] = {}

        def grab(act, hook, _got=got):
            _got[hook.name] = act

        names = [z_hook_name(x) for x in range(n_layers)] + [mlp_out_name(x)
                                                              for x in range(n_layers)]
        runner.run(sel, skip, stop_at_layer=n_layers, fwd_hooks=[(n, grab) for n in names])
        b = torch.arange(len(sel), device=cfg.device)[:, None]
        for layer in range(n_layers):
            z[rows, layer] = got[z_hook_name(layer)][b, pos]
            mlp[rows, layer] = got[mlp_out_name(layer)][b, pos]
    inv = torch.as_tensor(inverse, device=cfg.device)
    return z[inv], mlp[inv]


def attribution(runner: PrefixRunner, clean: np.ndarray, cf: np.ndarray,
                cf_z: torch.Tensor, cf_mlp: torch.Tensor) -> np.ndarray:
    """First-order log-space effect of every head and MLP layer at every role, per pair:
    (n_layers, n_heads + 1, n_roles, n_pairs) float32. ``cf_z`` and ``cf_mlp`` are the
    counterfactual prompts' values at their roles (``_capture_at_roles``)."""
    model, table = runner.model, runner.table
    cfg = model.cfg
    n_layers, device = cfg.n_layers, cfg.device
    out = np.zeros((n_layers, cfg.n_heads + 1, len(ROLES), len(clean)), dtype=np.float32)
    for pb in pair_batches(table, clean, cf, device):
        group = clean[pb.positions]
        skip = runner.shared_skip(group, pb.tokens.shape[1])
        if skip:
            with torch.no_grad():
                runner.run(group[:1], skip)  # the prefix cache, outside the graph
        saved: dict[str, torch.Tensor] = {}

        def keep(act, hook, _saved=saved):
            act = gradient_tap(act)
            _saved[hook.name] = act
            return act

        names = [z_hook_name(x) for x in range(n_layers)] + [mlp_out_name(x)
                                                              for x in range(n_layers)]
        with torch.enable_grad():
            model.zero_grad(set_to_none=True)
            lp = runner.last_logits(group, skip, fwd_hooks=[(n, keep) for n in names]
                                    ).log_softmax(-1)
            rows = torch.arange(len(group), device=device)
            (0.5 * (lp[rows, pb.cf_answer] - lp[rows, pb.answer]).sum()).backward()
        pos = torch.as_tensor(_roles_in_run(table, group, skip), device=device)
        b = rows[:, None]
        sel = torch.as_tensor(pb.positions, device=device)
        for layer in range(n_layers):
            zs, ms = saved[z_hook_name(layer)], saved[mlp_out_name(layer)]
            assert zs.grad is not None and ms.grad is not None  # retained by ``keep``
            z_act, z_grad = zs.detach()[b, pos], zs.grad[b, pos]
            m_act, m_grad = ms.detach()[b, pos], ms.grad[b, pos]
            head = (z_grad * (cf_z[sel, layer] - z_act)).sum(-1)  # (P, roles, heads)
            mlp = (m_grad * (cf_mlp[sel, layer] - m_act)).sum(-1)  # (P, roles)
            out[layer, :-1, :, pb.positions] = head.permute(0, 2, 1).float().cpu().numpy()
            out[layer, -1, :, pb.positions] = mlp.float().cpu().numpy()
        model.zero_grad(set_to_none=True)
    return out


def _suffix_cache(cfg, keys: list[torch.Tensor | None], values: list[torch.Tensor | None],
                  rows: int) -> TransformerLensKeyValueCache:
    """A frozen cache whose layers hold the given past keys and values (empty where None)."""
    entries = []
    for k, v in zip(keys, values, strict=True):
        if k is None or v is None:
            entry = TransformerLensKeyValueCacheEntry.init_cache_entry(cfg, cfg.device, rows)
        else:
            entry = TransformerLensKeyValueCacheEntry(past_keys=k, past_values=v)
        entry.frozen = True
        entries.append(entry)
    past_len = next((k.shape[1] for k in keys if k is not None), 0)
    mask = torch.ones((rows, past_len), dtype=torch.long, device=cfg.device)
    return TransformerLensKeyValueCache(entries=entries, previous_attention_mask=mask,
                                        frozen=True)


@torch.no_grad()
def exact(runner: PrefixRunner, clean: np.ndarray, cf: np.ndarray, cf_z: torch.Tensor,
          cf_mlp: torch.Tensor, roles: tuple[str, ...], heads: np.ndarray | None = None,
          ) -> tuple[np.ndarray, np.ndarray]:
    """Exact patching of every MLP layer, and of the heads in ``heads`` ((n_layers, n_heads)
    bool; None: every head), at each of ``roles``: the paper's effect and the log-space
    effect, each (n_layers, n_heads + 1, n_roles, n_pairs) float32 (NaN where not run)."""
    model, table = runner.model, runner.table
    cfg = model.cfg
    n_layers, n_heads, device = cfg.n_layers, cfg.n_heads, cfg.device
    if heads is None:
        heads = np.ones((n_layers, n_heads), dtype=bool)
    shape = (n_layers, n_heads + 1, len(ROLES), len(clean))
    paper = np.full(shape, np.nan, dtype=np.float32)
    log = np.full(shape, np.nan, dtype=np.float32)
    for pb in pair_batches(table, clean, cf, device):
        group = clean[pb.positions]
        op = int(table.op[group[0]])
        skip = runner.shared_skip(group, pb.tokens.shape[1])
        got: dict[str, torch.Tensor] = {}

        def grab(act, hook, _got=got):
            _got[hook.name] = act

        names = []
        for layer in range(n_layers):
            names += [get_act_name("resid_pre", layer), get_act_name("k", layer),
                      get_act_name("v", layer)]
        final = runner.run(group, skip, stop_at_layer=n_layers,
                           fwd_hooks=[(n, grab) for n in names])
        clean_lp = final_logits(model, final[:, -1:])[:, 0].log_softmax(-1)  # unpatched
        role_pos = _roles_in_run(table, group, skip)
        for r in (ROLES.index(name) for name in roles):
            for p in np.unique(role_pos[:, r]):
                sub = np.nonzero(role_pos[:, r] == p)[0]
                pairs = pb.positions[sub]
                at = torch.as_tensor(pairs, device=device)
                eff, le = _exact_at(runner, got, op, skip, int(p), sub, pb.answer[sub],
                                    pb.cf_answer[sub], cf_z[at, :, r], cf_mlp[at, :, r],
                                    heads, clean_lp[torch.as_tensor(sub, device=device)])
                paper[:, :, r, pairs] = eff
                log[:, :, r, pairs] = le
    return paper, log


def _exact_at(runner: PrefixRunner, got: dict[str, torch.Tensor], op: int, skip: int, p: int,
              sub: np.ndarray, answer: torch.Tensor, cf_answer: torch.Tensor,
              cf_z: torch.Tensor, cf_mlp: torch.Tensor, heads: np.ndarray,
              clean_lp: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Effects (n_layers, n_heads + 1, n_pairs; NaN for heads not in ``heads``) of patching
    each MLP layer and each chosen head at run position ``p`` of the pairs in rows ``sub``
    of the clean capture ``got``; ``clean_lp`` holds those pairs' unpatched log-probs."""
    model = runner.model
    cfg = model.cfg
    n_layers, n_heads, device = cfg.n_layers, cfg.n_heads, cfg.device
    n = len(sub)
    rows = torch.as_tensor(sub, device=device)
    prefix = runner.prefix(op) if skip else None
    paper = np.full((n_layers, n_heads + 1, n), np.nan, dtype=np.float32)
    log = np.full_like(paper, np.nan)
    at = torch.arange(n, device=device)
    lp_r, lp_rp = clean_lp[at, answer], clean_lp[at, cf_answer]
    for layer in range(n_layers):
        comp = np.concatenate([np.nonzero(heads[layer])[0], [n_heads]])  # n_heads: the MLP
        comps = len(comp)
        head_of_row = torch.as_tensor(comp, device=device).repeat(n)  # row = pair * comps + c
        pair_of_row = torch.arange(n, device=device).repeat_interleave(comps)
        keys: list[torch.Tensor | None] = [None] * n_layers
        values: list[torch.Tensor | None] = [None] * n_layers
        for lay in range(layer, n_layers):
            k, v = cache_keys(model, lay, got[get_act_name("k", lay)][rows, :p],
                              got[get_act_name("v", lay)][rows, :p])
            if prefix is not None:
                pk, pv = prefix.entries[lay].past_keys, prefix.entries[lay].past_values
                k = torch.cat([pk.expand(n, -1, -1, -1), k], dim=1)
                v = torch.cat([pv.expand(n, -1, -1, -1), v], dim=1)
            keys[lay] = k.repeat_interleave(comps, dim=0)
            values[lay] = v.repeat_interleave(comps, dim=0)
        cache = _suffix_cache(cfg, keys, values, n * comps)
        x = got[get_act_name("resid_pre", layer)][rows, p:].repeat_interleave(comps, dim=0)
        z_rows = torch.nonzero(head_of_row < n_heads)[:, 0]
        m_rows = torch.nonzero(head_of_row == n_heads)[:, 0]

        def patch_z(act, hook, _layer=layer, _zr=z_rows, _h=head_of_row, _p=pair_of_row):
            out = act.clone()
            out[_zr, 0, _h[_zr]] = cf_z[_p[_zr], _layer, _h[_zr]]
            return out

        def patch_mlp(act, hook, _layer=layer, _mr=m_rows, _p=pair_of_row):
            out = act.clone()
            out[_mr, 0] = cf_mlp[_p[_mr], _layer]
            return out

        final = model.run_with_hooks(
            x, start_at_layer=layer, stop_at_layer=n_layers, past_kv_cache=cache,
            fwd_hooks=[(z_hook_name(layer), patch_z), (mlp_out_name(layer), patch_mlp)])
        lps = final_logits(model, final[:, -1:])[:, 0].log_softmax(-1).view(n, comps, -1)
        lps_r = lps.gather(-1, answer[:, None, None].expand(n, comps, 1))[..., 0]
        lps_rp = lps.gather(-1, cf_answer[:, None, None].expand(n, comps, 1))[..., 0]
        paper[layer, comp] = effect_from_logprobs(lp_r[:, None], lp_rp[:, None], lps_r,
                                                  lps_rp).T.float().cpu().numpy()
        log[layer, comp] = log_effect(lp_r[:, None], lp_rp[:, None], lps_r,
                                      lps_rp).T.float().cpu().numpy()
    return paper, log


def component_effects(model: HookedTransformer, table: PromptTable, clean: np.ndarray,
                      cf: np.ndarray, exact_roles: tuple[str, ...], rank_statistic: str,
                      runner: PrefixRunner | None = None,
                      exact_heads: int | None = None) -> ComponentEffects:
    """Every head's and MLP layer's effect on the pairs (clean, cf) of one operator:
    attribution at every role, exact patching at ``exact_roles``; statistics over pairs as
    for neurons (``catalog.measuring.effects``), ranked by ``rank_statistic``.

    Exact patching covers every MLP layer and, with ``exact_heads`` set, only that many
    heads: those of largest |attribution| at the exact roles (a head's exact run costs as
    much as an MLP layer's, and a model has ~15 times more heads than layers). The others
    keep their attribution estimate, marked ``is_exact`` False, as neurons outside
    ``--exact top:N`` do."""
    bad = [r for r in exact_roles if r not in ROLES]
    if bad:
        raise ValueError(f"unknown positions {bad}; choose from {ROLES}")
    runner = runner or PrefixRunner(model, table)
    cfg = model.cfg
    shape = (cfg.n_layers, cfg.n_heads + 1, len(ROLES))
    nan = np.full(shape, np.nan, dtype=np.float32)
    if not len(clean):
        return ComponentEffects(0, exact_roles, nan, nan, nan, nan, nan, nan, nan, nan,
                                np.zeros(shape, dtype=bool), nan)
    cf_z, cf_mlp = _capture_at_roles(runner, cf, cfg.n_layers)
    flat = (-1, len(clean))
    attr = effects.PairStats.of(attribution(runner, clean, cf, cf_z, cf_mlp).reshape(flat))
    out = {name: getattr(attr, stat).reshape(shape).copy() for name, stat in
           (("effect_log", "log_mean"), ("effect_median", "median"),
            ("effect_trimmed", "trimmed"), ("moved_share", "moved"))}
    rank_value = (attr.log_mean if rank_statistic == "mean"
                  else attr.statistic(rank_statistic)).reshape(shape).copy()
    is_exact = np.zeros(shape, dtype=bool)
    ex_mean, ex_std = nan.copy(), nan.copy()
    if exact_roles:
        ran = [ROLES.index(r) for r in exact_roles]
        heads = None
        if exact_heads is not None and exact_heads < cfg.n_layers * cfg.n_heads:
            size = np.abs(attr.log_mean.reshape(shape)[:, :-1, ran]).mean(-1)
            heads = np.zeros(size.size, dtype=bool)
            heads[np.argsort(-size.ravel(), kind="stable")[:exact_heads]] = True
            heads = heads.reshape(size.shape)
        paper, log = exact(runner, clean, cf, cf_z, cf_mlp, exact_roles, heads)
        ex = effects.PairStats.of(log[:, :, ran].reshape(flat), paper[:, :, ran].reshape(flat))
        part = (cfg.n_layers, cfg.n_heads + 1, len(ran))
        ran_mask = np.zeros(shape, dtype=bool)  # (layer, component, role) exactly patched
        ran_mask[:, :, ran] = np.isfinite(log[:, :, ran, 0]) if len(clean) else False
        sel = ran_mask[:, :, ran]

        def put(target: np.ndarray, values: np.ndarray) -> None:
            view = target[:, :, ran]
            view[sel] = values.reshape(part)[sel]
            target[:, :, ran] = view

        put(ex_mean, ex.mean)
        put(ex_std, ex.std)
        for name, stat in (("effect_log", "log_mean"), ("effect_median", "median"),
                           ("effect_trimmed", "trimmed"), ("moved_share", "moved")):
            put(out[name], getattr(ex, stat))
        put(rank_value, ex.statistic(rank_statistic))
        is_exact = ran_mask
    return ComponentEffects(
        n_pairs=len(clean), exact_roles=tuple(exact_roles), effect_exact=ex_mean,
        effect_exact_std=ex_std, effect_attr=attr.mean.reshape(shape),
        effect_attr_std=attr.std.reshape(shape), effect_log=out["effect_log"],
        effect_median=out["effect_median"], effect_trimmed=out["effect_trimmed"],
        moved_share=out["moved_share"], is_exact=is_exact, rank_value=rank_value)


@torch.no_grad()
def residual_lens(model: HookedTransformer, table: PromptTable, prompts: np.ndarray,
                  runner: PrefixRunner | None = None) -> dict[str, list[float]]:
    """Where the answer appears: the residual stream at the last position after each layer,
    read through the final norm and the unembedding (a logit lens of the stream), on
    ``prompts``. Per layer: the median rank of the answer token (0 = the top token), the
    share of prompts where it is the top token, and its mean log-probability."""
    out: dict[str, list[float]] = {"median_rank": [], "top1": [], "mean_logprob": []}
    if not len(prompts):
        return out
    runner = runner or PrefixRunner(model, table)
    n_layers = model.cfg.n_layers
    ranks = np.zeros((n_layers, len(prompts)))
    lps = np.zeros((n_layers, len(prompts)))
    order = {int(p): i for i, p in enumerate(prompts)}
    for skip, sel in runner.groups(np.asarray(prompts)):
        got: dict[int, torch.Tensor] = {}

        def grab(act, hook, _got=got):
            _got[hook.layer()] = act[:, -1:]

        runner.run(sel, skip, stop_at_layer=n_layers, fwd_hooks=[
            (get_act_name("resid_post", x), grab) for x in range(n_layers)])
        answer = torch.as_tensor(table.answer[sel], device=model.cfg.device)
        rows = [order[int(p)] for p in sel]
        at = torch.arange(len(sel), device=model.cfg.device)
        for layer in range(n_layers):
            logits = final_logits(model, got[layer])[:, 0].float()
            mine = logits[at, answer]
            ranks[layer, rows] = (logits > mine[:, None]).sum(1).cpu().numpy()
            lps[layer, rows] = (mine - torch.logsumexp(logits, 1)).cpu().numpy()
    out["median_rank"] = [float(x) for x in np.median(ranks, axis=1)]
    out["top1"] = [float(x) for x in (ranks == 0).mean(axis=1)]
    out["mean_logprob"] = [float(x) for x in lps.mean(axis=1)]
    return out
