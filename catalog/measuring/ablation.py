"""Ablated forward passes: the model run with parts of it replaced (docs/method.md §6).

A circuit says what is KEPT: MLP neurons (``hook_post``) and attention heads
(``hook_z``, the head's output before ``W_O``). Everything else is replaced at the
ablated positions, either by its mean over a population of prompts (mean ablation, the
heuristics paper) or by its value on a counterfactual prompt (the MIB benchmark).

Positions. Means are taken per position counted from the END of the token sequence
(0 = the last position), over the population's prompts: with single-token numbers every
prompt has the same length, and this is the paper's per-position mean; with digit-level
tokenizers prompts differ in length and the last position (where the answer is read)
still meets the last position. ``context`` says which positions are ablated: ``prompt``,
the prompt's own tokens (the shared few-shot prefix runs clean, from its cached keys and
values), or ``all``, every position, the prefix included.

Speed. The circuits of one faithfulness curve differ only in the neurons of the pruned
layers; everything below the first layer where any two of them differ (heads kept, whole
early MLPs) is the same for all. ``evaluate`` runs that early part once per prompt group,
keeps the residual stream entering the first differing layer, and runs each circuit from
there (``start_at_layer``). The tests hold it equal to plain forward passes with hooks at
every layer and position (tests/reference.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Bool, Float
from transformer_lens import HookedTransformer
from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache
from transformer_lens.utilities import get_act_name

from catalog.config import ScienceConfig
from catalog.config.vocab import CONTEXTS, POPULATIONS
from catalog.core.arith import OPERATORS, apply_op, is_valid
from catalog.measuring.grids import (
    PrefixRunner,
    expand_cache,
    final_logits,
    mlp_width,
    post_hook_name,
)
from catalog.measuring.prompts import UNLIMITED, PromptTable, operator_prefix, tokenize_prompts


def z_hook_name(layer: int) -> str:
    """TransformerLens name of layer ``layer``'s attention heads' outputs (before W_O)."""
    return get_act_name("z", layer)


@dataclass(frozen=True)
class Circuit:
    """What a forward pass keeps; everything else is replaced at the ablated positions."""

    neurons: Bool[np.ndarray, "n_layers d_mlp"]
    heads: Bool[np.ndarray, "n_layers n_heads"]

    @classmethod
    def everything(cls, model: HookedTransformer) -> Circuit:
        n, h = model.cfg.n_layers, model.cfg.n_heads
        return cls(np.ones((n, mlp_width(model)), dtype=bool), np.ones((n, h), dtype=bool))

    @classmethod
    def nothing(cls, model: HookedTransformer) -> Circuit:
        n, h = model.cfg.n_layers, model.cfg.n_heads
        return cls(np.zeros((n, mlp_width(model)), dtype=bool), np.zeros((n, h), dtype=bool))

    def same_below(self, other: Circuit) -> int:
        """The first layer at which this circuit and ``other`` keep different things."""
        diff = (self.neurons != other.neurons).any(1) | (self.heads != other.heads).any(1)
        return int(np.argmax(diff)) if diff.any() else len(diff)


# ------------------------------------------------------------------ what replaces


@dataclass
class Means:
    """Mean ``hook_post`` and ``hook_z`` per layer and position counted from the end."""

    post: Float[torch.Tensor, "n_layers pos d_mlp"]
    z: Float[torch.Tensor, "n_layers pos n_heads d_head"]
    count: np.ndarray  # (pos,) sequences that reach each position

    def window(self, length: int, edit_from: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """(post, z) for the positions 0..length-1 of a sequence of ``length`` tokens, in
        order: (n_layers, length, d_mlp) and (n_layers, length, n_heads, d_head). Positions
        before ``edit_from`` are never ablated and may lie beyond the population's reach
        (they hold zeros); a position from ``edit_from`` on that no population prompt
        reaches is an error."""
        need = length - edit_from  # distances 0 .. need-1 are ablated
        reach = int((self.count > 0).sum())
        if need > reach:
            raise ValueError(f"ablating {need} positions needs means that far from the end, "
                             f"but the population's prompts reach {reach}; use a larger "
                             "mean population")
        pad = length - self.post.shape[1]
        post, z = self.post[:, :length], self.z[:, :length]
        if pad > 0:
            post = torch.cat([post, post.new_zeros((post.shape[0], pad) + post.shape[2:])], 1)
            z = torch.cat([z, z.new_zeros((z.shape[0], pad) + z.shape[2:])], 1)
        return post.flip(1), z.flip(1)


def mean_population(tokenizer, table: PromptTable, config: ScienceConfig, kind: str,
                    cap: int, seed: int) -> PromptTable:
    """The prompts whose activations are averaged for mean ablation.

    ``grid``: the heuristics paper's population, every (a, b) of the operand grid for all
    four operators, invalid cells included (each operator after its own prefix; an
    operator the run does not measure gets the prefix it would have had). ``valid``: the
    run's own prompts. At most ``cap`` prompts (0: all), an equal seeded sample per
    operator; the mean of 500 prompts (the default) has a standard error of 4.5% of the
    activations' spread. Only tokens and prefixes are filled in: answers are not needed.
    """
    if kind not in POPULATIONS:
        raise ValueError(f"mean population must be one of {POPULATIONS}, got {kind!r}")
    ops = OPERATORS if kind == "grid" else table.operators
    rng = np.random.default_rng([seed, 13])
    per_op = -(-cap // len(ops)) if cap else 0
    side = np.arange(table.lo, table.hi)
    ga, gb = (g.ravel() for g in np.meshgrid(side, side, indexing="ij"))
    limit = UNLIMITED if table.numbers.digit_level else table.numbers.limit
    op_arr, aa, bb, prefixes = [], [], [], []
    for i, op in enumerate(ops):
        if kind == "valid":
            idx = table.op_index(op)
            a, b = table.a[idx], table.b[idx]
        else:
            a, b = ga, gb
        if per_op and len(a) > per_op:
            pick = np.sort(rng.choice(len(a), per_op, replace=False))
            a, b = a[pick], b[pick]
        if op in table.operators:
            prefix = table.prefix_tokens[table.operators.index(op)]
        else:
            ok = is_valid(op, ga, gb, limit)
            prefix, _ = operator_prefix(tokenizer, table.numbers, config, OPERATORS.index(op),
                                        op, ga[ok], gb[ok], apply_op(op, ga[ok], gb[ok]))
        op_arr.append(np.full(len(a), i, dtype=np.int8))
        aa.append(a)
        bb.append(b)
        prefixes.append(prefix)
    op_all, a_all, b_all = np.concatenate(op_arr), np.concatenate(aa), np.concatenate(bb)
    ids, roles = tokenize_prompts(tokenizer, config, [ops[o] for o in op_all], a_all, b_all)
    tokens = [np.concatenate([prefixes[o], np.array(t, dtype=np.int64)])
              for o, t in zip(op_all, ids, strict=True)]
    dummy = np.zeros(len(a_all), dtype=np.int64)
    return PromptTable(
        operators=tuple(ops), lo=table.lo, hi=table.hi, numbers=table.numbers, op=op_all,
        a=a_all, b=b_all, result=dummy - 1, answer=dummy, tokens=tokens,
        result_tokens=[np.zeros(1, dtype=np.int64)] * len(a_all), prefix_tokens=prefixes,
        role_pos=roles + np.array([len(prefixes[o]) for o in op_all])[:, None])


@torch.no_grad()
def position_means(model: HookedTransformer, population: PromptTable, context: str,
                   batch_size: int = 4096) -> Means:
    """Mean activations of ``population`` per layer and position from the end.

    With ``context = prompt`` only the prompts' own positions are averaged (a shared
    prefix is never ablated then); with ``all`` the prefix's positions are averaged too,
    each prefix run once per operator and weighted by its prompts.
    """
    if context not in CONTEXTS:
        raise ValueError(f"context must be one of {CONTEXTS}, got {context!r}")
    cfg = model.cfg
    n_layers = cfg.n_layers
    runner = PrefixRunner(model, population)
    longest = max(len(t) for t in population.tokens)
    post = torch.zeros(n_layers, longest, mlp_width(model), dtype=torch.float64)
    z = torch.zeros(n_layers, longest, cfg.n_heads, cfg.d_head, dtype=torch.float64)
    count = np.zeros(longest, dtype=np.int64)
    names = [post_hook_name(x) for x in range(n_layers)] + [z_hook_name(x)
                                                              for x in range(n_layers)]
    prefix_weight: dict[tuple[int, int], int] = {}  # (op, total length) -> prompts

    def accumulate(sums: dict[str, torch.Tensor], ends: int, keep_from: int) -> None:
        """Add activations summed over a batch, position t at distance ends - t."""
        for layer in range(n_layers):
            p, zz = sums[post_hook_name(layer)], sums[z_hook_name(layer)]
            for t in range(keep_from, p.shape[0]):
                post[layer, ends - t] += p[t]
                z[layer, ends - t] += zz[t]

    for skip, idx in runner.groups():
        length = len(population.tokens[idx[0]])
        start = len(population.prefix_tokens[int(population.op[idx[0]])])
        prefix_weight[(int(population.op[idx[0]]), length)] = len(idx)
        for lo in range(0, len(idx), batch_size):
            chunk = idx[lo:lo + batch_size]
            sums: dict[str, torch.Tensor] = {}

            def grab(act, hook, _sums=sums):
                _sums[hook.name] = act.double().sum(0).cpu()

            runner.run(chunk, skip, stop_at_layer=n_layers,
                       fwd_hooks=[(name, grab) for name in names])
            # positions of the run part: skip .. length-1; the prompt's own from ``start``
            keep_from = max(start - skip, 0) if context == "prompt" else 0
            accumulate(sums, length - 1 - skip, keep_from)
        first = max(start - skip, 0) if context == "prompt" else 0
        count[: length - skip - first] += len(idx)
    if context == "all":  # the cached prefixes' own positions, once per operator and length
        for (op, length), n in prefix_weight.items():
            prefix = population.prefix_tokens[op]
            skip = runner.skip(op, length)
            if not skip:
                continue  # run with the prompts above
            scaled: dict[str, torch.Tensor] = {}

            def grab_prefix(act, hook, _sums=scaled, _n=n):
                _sums[hook.name] = act[0].double().cpu() * _n

            model.run_with_hooks(torch.from_numpy(prefix[None]).to(cfg.device),
                                 stop_at_layer=n_layers,
                                 fwd_hooks=[(name, grab_prefix) for name in names])
            accumulate(scaled, length - 1, 0)
            count[length - skip: length] += n
    have = torch.from_numpy(np.maximum(count, 1)).double()
    return Means(post=(post / have[None, :, None]).to(cfg.dtype).to(cfg.device),
                 z=(z / have[None, :, None, None]).to(cfg.dtype).to(cfg.device), count=count)


# ------------------------------------------------------------------ forward passes


Replace = Callable[[np.ndarray, int, int], tuple[torch.Tensor, torch.Tensor]]
"""(prompt indices of one group, sequence length, first ablated position) -> (post, z) to
put in place of what is ablated: (n_layers, [batch,] length, d_mlp) and (n_layers,
[batch,] length, n_heads, d_head), aligned with the whole sequence (prefix included)."""


def mean_replacement(means: Means) -> Replace:
    """Mean ablation: the same per-position means for every prompt."""
    def at(idx: np.ndarray, length: int, edit_from: int):
        return means.window(length, edit_from)
    return at


def counterfactual_replacement(model: HookedTransformer, table: PromptTable,
                               cf_of: dict[int, int], batch_size: int = 4096) -> Replace:
    """Counterfactual patching: each prompt's activations are replaced by those of its
    counterfactual ``cf_of[prompt]`` at the same position counted from the end (the two
    prompts' own parts have the same length; a prefix is never ablated this way). Each
    counterfactual runs once and is kept (n_layers x its length x (d_mlp + d_model))."""
    runner = PrefixRunner(model, table)
    n_layers = model.cfg.n_layers
    kept: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @torch.no_grad()
    def capture(prompts: np.ndarray) -> None:
        for skip, sel in runner.groups(np.unique(prompts)):
            start = len(table.prefix_tokens[int(table.op[sel[0]])]) - skip
            for lo in range(0, len(sel), batch_size):
                chunk = sel[lo:lo + batch_size]
                got: dict[str, torch.Tensor] = {}

                def grab(act, hook, _got=got, _start=start):
                    _got[hook.name] = act[:, _start:]

                runner.run(chunk, skip, stop_at_layer=n_layers, fwd_hooks=[
                    (name, grab) for x in range(n_layers)
                    for name in (post_hook_name(x), z_hook_name(x))])
                for i, p in enumerate(chunk):
                    kept[int(p)] = (
                        torch.stack([got[post_hook_name(x)][i] for x in range(n_layers)]),
                        torch.stack([got[z_hook_name(x)][i] for x in range(n_layers)]))

    def at(idx: np.ndarray, length: int, edit_from: int):
        src = np.array([cf_of[int(p)] for p in idx])
        missing = np.array([p for p in src if int(p) not in kept])
        if len(missing):
            capture(missing)
        post, z = [], []
        for p, c in zip(idx, src, strict=True):
            cp, cz = kept[int(c)]
            own = length - len(table.prefix_tokens[int(table.op[p])])
            if cp.shape[1] != own:
                raise ValueError(f"prompt {int(p)} and its counterfactual {int(c)} differ in "
                                 "length; counterfactual patching needs equal lengths")
            pad = length - own
            post.append(torch.cat([cp.new_zeros((n_layers, pad) + cp.shape[2:]), cp], 1))
            z.append(torch.cat([cz.new_zeros((n_layers, pad) + cz.shape[2:]), cz], 1))
        return torch.stack(post, 1), torch.stack(z, 1)
    return at


@dataclass
class _Edit:
    """The hooks that apply a circuit to positions [edit_from, ...) of what is run."""

    circuit: Circuit
    post: torch.Tensor  # replacement for the run positions: (n_layers, [batch,] T, d_mlp)
    z: torch.Tensor
    edit_from: int
    batched: bool

    def hooks(self, layers: range) -> list[tuple[str | Callable, Callable]]:
        out: list[tuple[str | Callable, Callable]] = []
        device = self.post.device
        for layer in layers:
            keep_n = self.circuit.neurons[layer]
            keep_h = self.circuit.heads[layer]
            if not keep_n.all():
                keep = torch.as_tensor(keep_n, device=device)
                out.append((post_hook_name(layer), self._post_hook(layer, keep)))
            if not keep_h.all():
                drop = torch.as_tensor(~keep_h, device=device)
                out.append((z_hook_name(layer), self._z_hook(layer, drop)))
        return out

    def _post_hook(self, layer: int, keep: torch.Tensor):
        def hook(act, hook):
            repl = self.post[layer]
            if self.batched:
                repl = repl[:, self.edit_from:]
            else:
                repl = repl[self.edit_from:][None]
            out = act.clone()
            out[:, self.edit_from:] = torch.where(keep, act[:, self.edit_from:], repl)
            return out
        return hook

    def _z_hook(self, layer: int, drop: torch.Tensor):
        def hook(act, hook):
            repl = self.z[layer]
            repl = repl[:, self.edit_from:] if self.batched else repl[self.edit_from:][None]
            out = act.clone()
            part = out[:, self.edit_from:]
            part[:, :, drop] = repl[:, :, drop].expand(part.shape[0], -1, -1, -1)
            return out
        return hook


@torch.no_grad()
def evaluate(
    model: HookedTransformer,
    table: PromptTable,
    prompts: np.ndarray,
    circuits: list[Circuit],
    replace_with: Replace,
    context: str,
    score: Callable[[torch.Tensor, np.ndarray], np.ndarray],
    batch_size: int = 4096,
) -> list[np.ndarray]:
    """For each circuit, ``score(last-position logits, prompt indices)`` of ``prompts``
    with everything outside the circuit replaced; rows in the order of ``prompts``.

    ``replace_with`` gives the replacement per prompt group (``mean_replacement`` or a
    counterfactual's activations); ``context`` which positions are ablated. The part of
    the model below the first layer where the circuits differ runs once per group.
    """
    if context not in CONTEXTS:
        raise ValueError(f"context must be one of {CONTEXTS}, got {context!r}")
    if not circuits:
        return []
    n_layers = model.cfg.n_layers
    start = min((circuits[0].same_below(c) for c in circuits[1:]), default=n_layers)
    runner = PrefixRunner(model, table)
    order = {int(p): i for i, p in enumerate(prompts)}
    out: list[np.ndarray | None] = [None] * len(circuits)
    for skip, sel in runner.groups(np.asarray(prompts)):
        rows = np.array([order[int(p)] for p in sel])
        for lo in range(0, len(sel), batch_size):
            idx, at = sel[lo:lo + batch_size], rows[lo:lo + batch_size]
            logits = _evaluate_chunk(runner, idx, skip, circuits, start, replace_with, context)
            for c, lg in enumerate(logits):
                values = score(lg, idx)
                if out[c] is None:
                    out[c] = np.zeros((len(prompts),) + values.shape[1:], dtype=np.float64)
                out[c][at] = values  # type: ignore[index]
    return [o if o is not None else np.zeros((0,)) for o in out]


def _evaluate_chunk(runner: PrefixRunner, idx: np.ndarray, skip: int,
                    circuits: list[Circuit], start: int, replace_with: Replace,
                    context: str) -> list[torch.Tensor]:
    """Last-position logits of prompts ``idx`` (one group) under each circuit."""
    model, table = runner.model, runner.table
    n_layers, device = model.cfg.n_layers, model.cfg.device
    toks = torch.from_numpy(table.token_matrix(idx)).to(device)
    n, length = toks.shape
    prefix_len = len(table.prefix_tokens[int(table.op[idx[0]])])
    post, z = replace_with(idx, length, 0 if context == "all" else prefix_len)
    batched = post.dim() == 4
    own_prefix = context == "all" and skip > 0  # the cached prefix is ablated too
    past: TransformerLensKeyValueCache | None
    if own_prefix and batched:
        raise ValueError("a counterfactual replacement cannot ablate a shared prefix; use "
                         "context 'prompt'")

    def edit(circuit: Circuit, lo: int, hi: int, edit_from: int) -> _Edit:
        sl = (slice(None), slice(None), slice(lo, hi)) if batched else \
            (slice(None), slice(lo, hi))
        return _Edit(circuit, post[sl], z[sl], edit_from, batched)

    early = range(start)
    if own_prefix and start > 0:
        # The prefix and its edits are the same in every row (one operator and one length
        # per group; means are by distance from the end): its early layers run once, and
        # the prompts' own tokens run from its keys and values. Its residual entering
        # ``start`` feeds each circuit's late layers below.
        pre = TransformerLensKeyValueCache.init_cache(model.cfg, device, 1)
        ones = torch.ones((1, skip), dtype=torch.long, device=device)
        prefix_resid = model.run_with_hooks(
            toks[:1, :skip], past_kv_cache=pre, attention_mask=ones, stop_at_layer=start,
            fwd_hooks=edit(circuits[0], 0, skip, 0).hooks(early))
        pre.freeze()
        resid = model.run_with_hooks(
            toks[:, skip:], past_kv_cache=expand_cache(pre, n),
            attention_mask=torch.ones((n, length - skip), dtype=torch.long, device=device),
            stop_at_layer=start, fwd_hooks=edit(circuits[0], skip, length, 0).hooks(early))
        past = None
    elif own_prefix:  # nothing shared: embeddings of whole sequences (no layer runs)
        resid_all = model.run_with_hooks(toks, stop_at_layer=0)
        prefix_resid, resid = resid_all[:1, :skip], resid_all[:, skip:]
        past = None
    else:
        edit_from = 0 if context == "all" else max(prefix_len - skip, 0)
        past = expand_cache(runner.prefix(int(table.op[idx[0]])), n) if skip else None
        mask = torch.ones((n, length - skip), dtype=torch.long, device=device) if skip \
            else None
        resid = model.run_with_hooks(
            toks[:, skip:], past_kv_cache=past, attention_mask=mask, stop_at_layer=start,
            fwd_hooks=edit(circuits[0], skip, length, edit_from).hooks(early))
    late = range(start, n_layers)
    out = []
    for circuit in circuits:
        late_past: TransformerLensKeyValueCache | None
        if own_prefix:
            cache = TransformerLensKeyValueCache.init_cache(model.cfg, device, 1)
            model.run_with_hooks(prefix_resid, start_at_layer=start, past_kv_cache=cache,
                                 stop_at_layer=n_layers,
                                 fwd_hooks=edit(circuit, 0, skip, 0).hooks(late))
            cache.freeze()
            late_past = expand_cache(cache, n)
            run_edit = edit(circuit, skip, length, 0)
        else:
            late_past = past
            run_edit = edit(circuit, skip, length,
                            0 if context == "all" else max(prefix_len - skip, 0))
        final = model.run_with_hooks(resid, start_at_layer=start, past_kv_cache=late_past,
                                     stop_at_layer=n_layers, fwd_hooks=run_edit.hooks(late))
        out.append(final_logits(model, final[:, -1:])[:, 0])
    return out
