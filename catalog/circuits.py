"""Circuits, faithfulness and knockouts (docs/method.md sections 6 and 8).

A circuit keeps the top-k neurons of every layer by patching effect. Its
faithfulness compares the model with everything outside the circuit mean-ablated
against the full model and the fully ablated one, using the normalised logit
NL(x) = logit of the correct answer / maximum logit:

    F(c) = (NL(c) - NL(empty)) / (NL(model) - NL(empty)),  per prompt, then averaged.

Means are taken per neuron and per position over all grid prompts of all
operators. The two knockout experiments test the heuristic story: zeroing the
neurons matched to a heuristic should hurt the prompts that heuristic is about
far more than the others, and zeroing a prompt's own heuristic neurons should
hurt it far more than zeroing as many random top neurons.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from jaxtyping import Bool, Float
from transformer_lens import HookedTransformer

from catalog.grids import PrefixRunner, mlp_width, post_hook_name
from catalog.heuristics import Heuristic
from catalog.prompts import PromptTable


def normalized_logit(logits: Float[torch.Tensor, "batch d_vocab"], answer: torch.Tensor):
    """NL = logit of the answer / maximum logit over the vocabulary, per prompt."""
    return logits.gather(1, answer[:, None])[:, 0] / logits.max(dim=1).values


def faithfulness(nl_circuit, nl_empty, nl_model) -> float:
    """Mean over prompts of (NL(c) - NL(empty)) / (NL(model) - NL(empty)).

    Prompts whose model and empty-circuit NL are equal carry no information and
    are left out (their ratio is undefined).
    """
    nl_circuit, nl_empty, nl_model = (np.asarray(x, dtype=np.float64)
                                      for x in (nl_circuit, nl_empty, nl_model))
    denom = nl_model - nl_empty
    ok = denom != 0
    if not ok.any():
        return float("nan")
    return float(np.mean((nl_circuit[ok] - nl_empty[ok]) / denom[ok]))


@torch.no_grad()
def position_means(
    model: HookedTransformer, table: PromptTable, batch_size: int = 4096,
    runner: PrefixRunner | None = None,
) -> dict[int, Float[torch.Tensor, "n_layers pos d_mlp"]]:
    """Mean MLP activation per layer, position and neuron over all prompts, per length of
    the part of the prompt that is run (the whole prompt, or what follows a shared prefix)."""
    runner = runner or PrefixRunner(model, table)
    n_layers = model.cfg.n_layers
    totals: dict[int, torch.Tensor] = {}
    counts: dict[int, int] = {}
    for skip, idx in runner.groups():
        length = len(table.tokens[idx[0]]) - skip
        total = totals.setdefault(length, torch.zeros(n_layers, length, mlp_width(model),
                                                      dtype=torch.float64))
        counts[length] = counts.get(length, 0) + len(idx)
        for start in range(0, len(idx), batch_size):
            chunk = idx[start:start + batch_size]
            sums: dict[int, torch.Tensor] = {}

            def add(act, hook, _sums=sums):
                _sums[hook.layer()] = act.double().sum(0).cpu()

            runner.run(chunk, skip, stop_at_layer=n_layers,
                       fwd_hooks=[(post_hook_name(layer), add) for layer in range(n_layers)])
            for layer in range(n_layers):
                total[layer] += sums[layer]
    return {length: (totals[length] / counts[length]).to(model.cfg.dtype).to(model.cfg.device)
            for length in totals}


def _run_with_neuron_edit(
    runner: PrefixRunner,
    idx: np.ndarray,
    skip: int,
    edit: Callable[[int, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """Last-position logits of prompts ``idx`` (one group of ``runner``) with every layer's
    hook_post replaced by ``edit(layer, act)``."""
    def hook(act, hook):
        return edit(hook.layer(), act)

    n_layers = runner.model.cfg.n_layers
    return runner.last_logits(idx, skip, fwd_hooks=[(post_hook_name(layer), hook)
                                                    for layer in range(n_layers)])


def top_k_mask(effect: Float[np.ndarray, "n_layers d_mlp"], k: int) -> np.ndarray:
    """Boolean (n_layers, d_mlp): the k neurons of each layer with the largest effect."""
    mask = np.zeros(effect.shape, dtype=bool)
    order = np.argsort(-effect, axis=1, kind="stable")[:, :k]
    np.put_along_axis(mask, order, True, axis=1)
    return mask


@torch.no_grad()
def faithfulness_curve(
    model: HookedTransformer,
    table: PromptTable,
    prompts: np.ndarray,
    effect: Float[np.ndarray, "n_layers d_mlp"],
    ks: list[int],
    means: dict[int, torch.Tensor],
    measured: np.ndarray | None = None,
    runner: PrefixRunner | None = None,
) -> list[tuple[int, float]]:
    """Faithfulness of the top-k-per-layer circuit for each k, on ``prompts``.

    ``measured`` (n_layers,) bool: layers outside it are never ablated (a circuit over a
    subset of layers); default all."""
    free = (np.zeros(effect.shape, dtype=bool) if measured is None
            else np.broadcast_to(~np.asarray(measured)[:, None], effect.shape))
    if len(prompts) == 0:
        return [(k, float("nan")) for k in ks]
    curve: dict[int, list[float]] = {k: [] for k in ks}
    nl_model_all, nl_empty_all = [], []
    runner = runner or PrefixRunner(model, table)
    for skip, sel in runner.groups(prompts):
        ans = torch.from_numpy(table.answer[sel]).to(model.cfg.device)
        mean = means[len(table.tokens[sel[0]]) - skip]

        def ablate(keep, _mean=mean):
            keep_t = torch.as_tensor(keep, device=model.cfg.device)

            def edit(layer, act):
                return torch.where(keep_t[layer], act, _mean[layer])
            return edit

        nl_model_all.append(normalized_logit(runner.last_logits(sel, skip), ans).cpu().numpy())
        none = free.copy()
        nl_empty_all.append(normalized_logit(
            _run_with_neuron_edit(runner, sel, skip, ablate(none)), ans).cpu().numpy())
        for k in ks:
            keep = top_k_mask(effect, k) | free
            curve[k].append(normalized_logit(
                _run_with_neuron_edit(runner, sel, skip, ablate(keep)), ans).cpu().numpy())
    nl_model, nl_empty = np.concatenate(nl_model_all), np.concatenate(nl_empty_all)
    return [(k, faithfulness(np.concatenate(curve[k]), nl_empty, nl_model)) for k in ks]


def circuit_sizes(d_mlp: int, fractions: tuple[float, ...]) -> list[int]:
    """Neurons per layer for each circuit fraction (at least 1, no duplicates)."""
    return sorted({max(1, math.ceil(f * d_mlp)) for f in fractions})


@torch.no_grad()
def accuracy_with_zeroed(
    model: HookedTransformer,
    table: PromptTable,
    prompts: np.ndarray,
    zero: Bool[np.ndarray, "prompt n_layers d_mlp"] | Bool[np.ndarray, "n_layers d_mlp"],
    runner: PrefixRunner | None = None,
) -> np.ndarray:
    """Per-prompt correctness (answer's first token), given neurons zeroed at the last position.

    ``zero`` is one mask for all prompts or one per prompt. Zeroing at the last position
    leaves every earlier position as in the clean run, so only that position is run,
    against the clean keys and values the runner keeps per prompt group (computed by the
    first knockout on those prompts, reused by the others).
    """
    out = np.zeros(len(prompts), dtype=bool)
    per_prompt = zero.ndim == 3
    runner = runner or PrefixRunner(model, table)
    n_layers = model.cfg.n_layers
    order = {int(p): i for i, p in enumerate(prompts)}
    for skip, sel in runner.groups(prompts):
        pos = np.array([order[int(p)] for p in sel])
        z = torch.as_tensor(zero[pos] if per_prompt else zero[None], device=model.cfg.device)

        def edit(act, hook, _z=z):
            return act.masked_fill(_z[:, hook.layer()][:, None, :], 0.0)

        pred = runner.last_position_logits(sel, skip, fwd_hooks=[
            (post_hook_name(layer), edit) for layer in range(n_layers)]).argmax(-1).cpu().numpy()
        out[pos] = pred == table.answer[sel]
    return out


def heuristic_knockout(
    model: HookedTransformer,
    table: PromptTable,
    prompts: np.ndarray,
    heuristic: Heuristic,
    neurons: Bool[np.ndarray, "n_layers d_mlp"],
    runner: PrefixRunner | None = None,
) -> dict:
    """Zero every neuron matched to ``heuristic``; accuracy on its prompts vs the others.

    ``prompts`` are correct prompts of one operator (accuracy 1 before the knockout).
    """
    member = heuristic.contains(table.a[prompts], table.b[prompts], table.result[prompts])
    ok = accuracy_with_zeroed(model, table, prompts, neurons, runner)
    return {
        "heuristic": heuristic.key,
        "label": heuristic.label,
        "n_neurons": int(neurons.sum()),
        "n_associated": int(member.sum()),
        "acc_associated": float(ok[member].mean()) if member.any() else float("nan"),
        "acc_other": float(ok[~member].mean()) if (~member).any() else float("nan"),
    }


def prompt_knockout(
    model: HookedTransformer,
    table: PromptTable,
    prompts: np.ndarray,
    heuristics: list[Heuristic],
    matched: list[Bool[np.ndarray, "n_layers d_mlp"]],
    top_set: Bool[np.ndarray, "n_layers d_mlp"],
    n_per_layer: int,
    seed: int,
    runner: PrefixRunner | None = None,
) -> dict:
    """Zero up to N heuristic neurons per layer per prompt, against N random top neurons.

    For each prompt, candidate neurons are the top-set neurons matched to any
    heuristic the prompt belongs to; up to ``n_per_layer`` of them are drawn per
    layer. The baseline zeroes as many neurons drawn at random from the same
    layer's top set.
    """
    rng = np.random.default_rng(seed)
    n_layers, d_mlp = top_set.shape
    member = np.stack([h.contains(table.a[prompts], table.b[prompts], table.result[prompts])
                       for h in heuristics], axis=1) if heuristics else np.zeros((len(prompts), 0),
                                                                                 dtype=bool)
    stacked = np.stack(matched) if matched else np.zeros((0, n_layers, d_mlp), dtype=bool)
    heur = np.zeros((len(prompts), n_layers, d_mlp), dtype=bool)
    rand = np.zeros_like(heur)
    for i in range(len(prompts)):
        cand = stacked[member[i]].any(axis=0) & top_set if member[i].any() else \
            np.zeros((n_layers, d_mlp), dtype=bool)
        for layer in range(n_layers):
            pool = np.nonzero(cand[layer])[0]
            take = min(n_per_layer, len(pool))
            if take:
                heur[i, layer, rng.choice(pool, take, replace=False)] = True
                top_pool = np.nonzero(top_set[layer])[0]
                rand[i, layer, rng.choice(top_pool, take, replace=False)] = True
    def acc(zero: np.ndarray) -> float:
        if not len(prompts):
            return float("nan")
        return float(accuracy_with_zeroed(model, table, prompts, zero, runner).mean())

    return {
        "n_prompts": len(prompts),
        "mean_neurons_zeroed": float(heur.sum(axis=(1, 2)).mean()) if len(prompts) else 0.0,
        "acc_heuristic_knockout": acc(heur),
        "acc_random_knockout": acc(rand),
    }
