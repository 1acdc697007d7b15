"""Knockouts: the heuristics paper's two ablation checks of the heuristic story
(docs/method.md section 8).

Zeroing the neurons matched to a heuristic should hurt the prompts that heuristic is
about far more than the others (heuristic knockout), and zeroing a prompt's own
heuristic neurons should hurt it far more than zeroing as many random top neurons
(prompt knockout). Both zero neurons at the last position only, so each runs that one
position against the clean keys and values of the others (``PrefixRunner``).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from jaxtyping import Bool
from transformer_lens import HookedTransformer

from catalog.core.stats import share_se
from catalog.labels.heuristics import Heuristic
from catalog.measuring.edits import edit_hooks, read_answers
from catalog.measuring.grids import PrefixRunner
from catalog.measuring.prompts import PromptTable


@torch.no_grad()
def zeroed_answers(
    model: HookedTransformer,
    table: PromptTable,
    prompts: np.ndarray,
    zero: Bool[np.ndarray, "prompt n_layers d_mlp"] | Bool[np.ndarray, "n_layers d_mlp"],
    runner: PrefixRunner | None = None,
    values: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per prompt, (the probability of its answer's first token, whether that token is the
    top one, the top token) given neurons zeroed (or set to ``values``, per prompt like
    ``zero``) at the last position.

    ``zero`` is one mask for all prompts or one per prompt. An edit at the last position
    leaves every earlier position as in the clean run, so only that position is run,
    against the clean keys and values the runner keeps per prompt group (computed by the
    first knockout on those prompts, reused by the others).
    """
    p = np.zeros(len(prompts))
    top = np.zeros(len(prompts), dtype=bool)
    token = np.zeros(len(prompts), dtype=np.int64)
    per_prompt = zero.ndim == 3
    runner = runner or PrefixRunner(model, table)
    order = {int(q): i for i, q in enumerate(prompts)}
    device = model.cfg.device
    for skip, sel in runner.groups(prompts):
        pos = np.array([order[int(q)] for q in sel])
        # copies: a caller's mask may be a read-only broadcast view
        z = torch.as_tensor(np.array(zero[pos] if per_prompt else
                                     np.repeat(zero[None], len(pos), 0)), device=device)
        v = None if values is None else torch.as_tensor(np.array(values[pos]), device=device)
        logits = runner.last_position_logits(sel, skip, fwd_hooks=edit_hooks(
            z, v, model.cfg.n_layers))
        ans = torch.as_tensor(table.answer[sel], dtype=torch.long, device=logits.device)
        p[pos], top[pos], token[pos] = read_answers(logits, ans)
    return p, top, token


# rows of one batched forward of ``zeroed_answers_many``: its masks, values and context
# copies held at once are about this many bytes at most
MANY_BYTES = 256 * 2**20


Request = tuple[np.ndarray, np.ndarray | None, np.ndarray | None]


@torch.no_grad()
def zeroed_answers_many(
    model: HookedTransformer,
    table: PromptTable,
    prompts: np.ndarray,
    requests: list[Request],
    runner: PrefixRunner | None = None,
    max_bytes: int = MANY_BYTES,
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``zeroed_answers`` of many edits of the same ``prompts``, batched: each request is
    (mask, values or None, rows or None) as ``zeroed_answers`` takes them, where ``rows``
    (indices into ``prompts``) runs only those prompts (mask and values have a row each).
    The rows of every request that fall in one of the runner's prompt groups run together,
    as many per forward as ``max_bytes`` holds, against the group's one context; each
    request gets what ``zeroed_answers`` would return for it (its rows only, in order)."""
    if not requests:
        return []
    runner = runner or PrefixRunner(model, table)
    prompts = np.asarray(prompts)
    picks = [np.arange(len(prompts)) if rows is None else np.asarray(rows, dtype=np.int64)
             for _, _, rows in requests]
    out = [(np.zeros(len(pk)), np.zeros(len(pk), dtype=bool), np.zeros(len(pk), np.int64))
           for pk in picks]
    groups = list(runner.groups(prompts))
    group_of, local = _group_positions(prompts, groups)
    kinds = [np.asarray(v).dtype for _, v, _ in requests if v is not None]
    vtype = np.result_type(*kinds) if kinds else None
    edit = int(np.prod(requests[0][0].shape[-2:]))
    for g, (skip, sel) in enumerate(groups):
        # (request, row of the request) of every row in this group, request by request
        req = np.concatenate([np.full(int((group_of[pk] == g).sum()), r, np.int64)
                              for r, pk in enumerate(picks)])
        row = np.concatenate([np.nonzero(group_of[pk] == g)[0] for pk in picks])
        per_row = runner.context_bytes(sel, skip) + edit * (
            1 + (np.dtype(vtype).itemsize if vtype is not None else 0))
        step = max(1, max_bytes // per_row)
        for s in range(0, len(req), step):
            rq, rw = req[s:s + step], row[s:s + step]
            spans = np.split(np.arange(len(rq)), np.flatnonzero(np.diff(rq)) + 1)
            z, v = _edits(requests, rq, rw, spans, vtype)
            here = np.concatenate([picks[rq[sp[0]]][rw[sp]] for sp in spans])
            logits = runner.last_position_logits(sel, skip, local[here], fwd_hooks=edit_hooks(
                torch.as_tensor(z, device=model.cfg.device),
                None if v is None else torch.as_tensor(v, device=model.cfg.device),
                model.cfg.n_layers))
            got = read_answers(logits, torch.as_tensor(table.answer[prompts[here]],
                                                       dtype=torch.long, device=logits.device))
            for sp in spans:  # each run of one request's rows back to that request
                for k in range(3):
                    out[rq[sp[0]]][k][rw[sp]] = got[k][sp]
    return out


def _group_positions(prompts: np.ndarray, groups: list) -> tuple[np.ndarray, np.ndarray]:
    """Each prompt's (position in ``prompts``) group number and index within its group."""
    where = {int(q): i for i, q in enumerate(prompts)}
    group_of = np.zeros(len(prompts), dtype=np.int64)
    local = np.zeros(len(prompts), dtype=np.int64)
    for g, (_, sel) in enumerate(groups):
        pos = np.array([where[int(q)] for q in sel])
        group_of[pos], local[pos] = g, np.arange(len(sel))
    return group_of, local


def _edits(requests: list[Request], rq: np.ndarray, rw: np.ndarray, spans: list,
           vtype) -> tuple[np.ndarray, np.ndarray | None]:
    """The masks and values (None where no request sets values; zeros for a request that
    zeroes, where another sets) of a chunk's rows: ``rq`` / ``rw`` each row's request and
    row of it, ``spans`` the runs of one request."""
    z = np.concatenate([_rows(requests[rq[sp[0]]][0], rw[sp]) for sp in spans])
    if vtype is None:
        return z, None
    v = np.concatenate([np.zeros((len(sp), *z.shape[1:]), vtype)
                        if requests[rq[sp[0]]][1] is None
                        else _rows(requests[rq[sp[0]]][1], rw[sp]).astype(vtype)
                        for sp in spans])
    return z, v


class PromptEvaluator:
    """An evaluator of edits at the last position of ``prompts`` (the
    ``catalog.explain.controls.Evaluator`` protocol, ``many`` included) through one
    runner: ``zeroed_answers_many``."""

    def __init__(self, model: HookedTransformer, table: PromptTable, prompts: np.ndarray,
                 runner: PrefixRunner | None = None) -> None:
        self.model, self.table, self.prompts = model, table, np.asarray(prompts)
        self.runner = runner or PrefixRunner(model, table)

    def __call__(self, mask: np.ndarray, values: np.ndarray | None = None,
                 rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.many([(mask, values, rows)])[0]

    def many(self, requests: list[tuple[np.ndarray, np.ndarray | None, np.ndarray | None]]
             ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        return zeroed_answers_many(self.model, self.table, self.prompts, requests,
                                   self.runner)


def _rows(x: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Rows of a per-prompt array, or copies of a single one ((n_layers, d_mlp))."""
    x = np.asarray(x)
    return np.repeat(x[None], len(rows), 0) if x.ndim == 2 else x[rows]


def widen(mask: np.ndarray, values: np.ndarray | None, rows: np.ndarray | None, n: int
          ) -> tuple[np.ndarray, np.ndarray | None]:
    """A mask (and values) given for ``rows`` of n prompts, as one for all n (nothing
    edited on the others); unchanged where ``rows`` is None."""
    if rows is None:
        return mask, values
    full = np.zeros((n, *mask.shape[1:]), dtype=bool)
    full[rows] = mask
    vals = None
    if values is not None:
        vals = np.zeros((n, *values.shape[1:]), dtype=values.dtype)
        vals[rows] = values
    return full, vals


def accuracy_with_zeroed(
    model: HookedTransformer,
    table: PromptTable,
    prompts: np.ndarray,
    zero: Bool[np.ndarray, "prompt n_layers d_mlp"] | Bool[np.ndarray, "n_layers d_mlp"],
    runner: PrefixRunner | None = None,
) -> np.ndarray:
    """Per-prompt correctness (answer's first token), given neurons zeroed at the last
    position (``zeroed_answers``)."""
    return zeroed_answers(model, table, prompts, zero, runner)[1]


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
    acc_a = float(ok[member].mean()) if member.any() else float("nan")
    acc_o = float(ok[~member].mean()) if (~member).any() else float("nan")
    return {
        "heuristic": heuristic.key,
        "label": heuristic.label,
        "n_neurons": int(neurons.sum()),
        "n_associated": int(member.sum()),
        "acc_associated": acc_a,
        "acc_other": acc_o,
        "verdict": verdict(acc_a, int(member.sum()), acc_o, int((~member).sum())),
    }


def verdict(acc_associated: float, n_associated: int, acc_other: float, n_other: int) -> str:
    """How a heuristic knockout row reads against the paper, which finds the prompts a
    heuristic is about hurt more than the others: ``agrees`` when their accuracy is lower
    by more than two standard errors of the difference, ``contradicts`` when it is higher by
    more than two, ``inconclusive`` otherwise (or when a side has no prompt)."""
    if not (n_associated and n_other) or math.isnan(acc_associated) or math.isnan(acc_other):
        return "inconclusive"
    se = math.hypot(share_se(acc_associated, n_associated), share_se(acc_other, n_other))
    diff = acc_associated - acc_other
    # with no variance on either side (every prompt right or wrong), any gap is exact
    if diff < -2 * se or (se == 0 and diff < 0):
        return "agrees"
    if diff > 2 * se or (se == 0 and diff > 0):
        return "contradicts"
    return "inconclusive"


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
