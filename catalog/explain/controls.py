"""The prompt knockout, and controls that can come out against it.

The heuristics paper's claim for one prompt: the neurons whose heuristic holds for it
carry its answer, so zeroing them hurts it far more than zeroing as many other neurons.
A knockout set picked by each neuron's push on THIS prompt beats random neurons whatever
the labels are (it is selected on the outcome), so random neurons cannot refute it. The
comparison sets here are chosen exactly as the tested set is, except for the label:

- ``knockout``: per layer, of the labelled neurons whose label holds (its set contains
  the prompt and the neuron is on the label's side here: ``catalog.explain.holds``), the
  ``per_layer`` ranked first on this prompt (by direct term or total effect), or, as the
  paper draws them, at random from the top set;
- ``unlabelled``: the labels whose sets contain the prompt, placed at random on as many
  UNLABELLED neurons of the same layers (``placed``): a neuron so labelled joins the pool
  where the label's side condition holds on it, exactly as the tested neurons had to;
  then the same choice from that pool; ``draws`` times;
- ``not holding``: the same, placed on labelled neurons none of whose labels' sets
  contain the prompt;
- ``same ranking``: as many neurons per layer by the same ranking, labels ignored (the
  most a set of that size picked on the outcome can do);
- ``random``: as many neurons per layer drawn from the same top set the paper draws from
  (the catalog's top neurons by effect where given, else the layer), the knockout's own
  neurons left out.

The two matched controls differ from the knockout only in whether the label's SET
contains the prompt: the side condition and the choice are the same. Under labels placed
at random (same counts per layer) the knockout and the two matched controls are then
drawn alike and hurt the prompt alike in expectation (tested). What the label adds is
the answer's probability after a matched control minus after the knockout (positive: the
label's own neurons hurt more), per prompt, and over prompts with its standard error.

Each set is zeroed at the prompt's last position only (the position the catalog
measures and patches), every set of one prompt in one batched forward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from transformer_lens import HookedTransformer

from catalog.core.stats import wilson
from catalog.measuring.edits import edit_hooks, read_answers
from catalog.measuring.grids import expand_cache, final_logits, prefix_cache

CONTROLS = ("unlabelled", "not holding", "same ranking", "random")
# the controls that differ from the knockout by the label alone ("what the label adds")
MATCHED = ("unlabelled", "not holding")


def top_mask(score: np.ndarray, pool: np.ndarray, counts: np.ndarray | int) -> np.ndarray:
    """Per (prompt, layer) row of ``pool`` ((P, n_layers, d_mlp) bool), its ``counts`` ((P,
    n_layers) or one int) neurons with the largest ``score`` (same shape; ties by index)
    as a mask of the same shape. Each row's last kept value is found by a plain sort (a
    fifth of a stable argsort's time); the values above it are kept, and of those equal
    to it the first by index (``_top_mask_by_order``, which takes NaN scores, is the
    same mask: tested)."""
    w = np.where(pool, -score, np.inf)
    if np.isnan(w).any():
        return _top_mask_by_order(w, pool, counts)
    c = np.minimum(np.broadcast_to(np.asarray(counts), pool.shape[:-1]), pool.sum(-1))[..., None]
    last = np.take_along_axis(np.sort(w, axis=-1), np.maximum(c - 1, 0), -1)
    above = pool & (w < last)
    tied = pool & (w == last)
    keep = above | (tied & (np.cumsum(tied, -1) <= c - above.sum(-1, keepdims=True)))
    keep &= c > 0
    return keep


def _top_mask_by_order(w: np.ndarray, pool: np.ndarray, counts: np.ndarray | int
                       ) -> np.ndarray:
    """``top_mask`` of ``w`` (-score where ``pool``, else inf) through its stable order."""
    order = np.argsort(w, axis=-1, kind="stable")
    flags = np.take_along_axis(pool, order, -1)
    counts = np.broadcast_to(np.asarray(counts), pool.shape[:2])[..., None]
    keep = flags & (np.cumsum(flags, -1) <= counts)
    out = np.zeros_like(pool)
    np.put_along_axis(out, order, keep, -1)
    return out


def random_mask(pool: np.ndarray, counts: np.ndarray | int,
                rng: np.random.Generator) -> np.ndarray:
    """``counts`` neurons drawn at random from each (prompt, layer) row of ``pool``."""
    return top_mask(rng.random(pool.shape), pool, counts)


def placed(pool: np.ndarray, member: np.ndarray, sides: np.ndarray, candidates: np.ndarray,
           rng: np.random.Generator) -> np.ndarray:
    """Where the prompts' labels would hold had they been placed on ``pool``'s neurons at
    random: per (prompt, layer) row, each of ``candidates`` whose labels' sets contain the
    prompt (``member`` bits != 0) hands its label kinds to a neuron drawn from the row's
    ``pool`` (without replacement), which is kept when one of those kinds' side
    conditions holds on it (``sides``, catalog.explain.holds). All (P, n_layers, d_mlp)."""
    givers = candidates & (member != 0)
    m = givers.sum(-1)  # (P, n_layers)
    width = int(m.max()) if m.size else 0
    out = np.zeros_like(pool)
    if not width:
        return out
    drawn = np.argsort(np.where(pool, rng.random(pool.shape), np.inf), -1)[..., :width]
    given = np.argsort(np.where(givers, rng.random(pool.shape), np.inf), -1)[..., :width]
    kinds = np.take_along_axis(member, given, -1)
    take = np.minimum(m, pool.sum(-1))[..., None] > np.arange(width)
    keep = take & ((kinds & np.take_along_axis(sides, drawn, -1)) != 0)
    np.put_along_axis(out, drawn, keep, -1)
    return out


def _choose(score: np.ndarray | None, pool: np.ndarray, per_layer: int,
            rng: np.random.Generator) -> np.ndarray:
    """Per (prompt, layer), ``per_layer`` neurons of ``pool``: those with the largest
    ``score``, or drawn at random where ``score`` is None (the paper's choice)."""
    return top_mask(score, pool, per_layer) if score is not None \
        else random_mask(pool, per_layer, rng)


def knockout_masks(score: np.ndarray | None, labelled: np.ndarray, member: np.ndarray,
                   sides: np.ndarray, per_layer: int, draws: int, rng: np.random.Generator,
                   within: np.ndarray | None = None, matched_only: bool = False,
                   random_pool: np.ndarray | None = None) -> dict[str, list[np.ndarray]]:
    """The sets of the module doc for P prompts at once, each a (P, n_layers, d_mlp) mask:
    "knockout" (one), then each control's draws. ``score`` (P, n_layers, d_mlp) the
    ranking on each prompt (None: the paper's choice, at random), ``labelled``
    (n_layers, d_mlp) the neurons labelled for the operator, ``member`` / ``sides`` the
    bits of ``catalog.explain.holds.member_kinds`` / ``sides``, ``within`` (n_layers,
    d_mlp) the top set every set is drawn from (None: every neuron; the paper's draw),
    ``random_pool`` (n_layers, d_mlp) where the random control alone is drawn from (None:
    ``within``; a prompt's knockout ranked on the prompt draws its random control from
    the top set but its other sets from every neuron); ``matched_only``: the knockout
    and the two matched controls only (what a null placement needs)."""
    within = np.ones_like(labelled) if within is None else within
    lab = np.broadcast_to(labelled & within, member.shape)
    hold = lab & ((member & sides) != 0)
    knock = _choose(score, hold, per_layer, rng)
    counts = knock.sum(-1)
    pools = {"unlabelled": np.broadcast_to(~labelled & within, member.shape),
             "not holding": lab & (member == 0)}
    out: dict[str, list[np.ndarray]] = {"knockout": [knock]}
    for name, pool in pools.items():
        out[name] = [_choose(score, placed(pool, member, sides, lab, rng), per_layer, rng)
                     for _ in range(draws)]
    if matched_only:
        return out
    if score is not None:
        out["same ranking"] = [top_mask(score, np.broadcast_to(within, member.shape), counts)]
    pool = within if random_pool is None else random_pool
    others = np.broadcast_to(pool, member.shape) & ~knock
    out["random"] = [random_mask(others, counts, rng) for _ in range(draws)]
    return out


def neurons_of(mask: np.ndarray) -> list[tuple[int, int]]:
    """(layer, neuron) of a (n_layers, d_mlp) mask, in order."""
    return [(int(la), int(n)) for la, n in zip(*np.nonzero(mask), strict=True)]


# an evaluator over P prompts: (P, n_layers, d_mlp) mask [, values [, rows]] -> each
# prompt's (p of its answer, whether the answer is the top token, the top token) with the
# masked neurons set to ``values`` (zero where None) at the prompt's last position; with
# ``rows`` (indices), only those prompts are run (mask and values have a row each). An
# evaluator may also have ``many``: a list of (mask, values, rows) requests -> each one's
# result, run together (``evaluate_all``)
Evaluator = Callable[..., tuple[np.ndarray, np.ndarray, np.ndarray]]
Request = tuple[np.ndarray, np.ndarray | None, np.ndarray | None]


def evaluate_all(evaluate: Evaluator, requests: Sequence[Request]
                 ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Each request's result: in batched forwards where ``evaluate`` has ``many``, else
    one call each. The results do not depend on which (each row is its own forward)."""
    many = getattr(evaluate, "many", None)
    if many is not None:
        return many(list(requests))
    return [evaluate(mask, values, rows) for mask, values, rows in requests]


@torch.no_grad()
def zeroed_probs(model: HookedTransformer, tokens: np.ndarray, answer: int,
                 sets: list[list[tuple[int, int]]]) -> tuple[np.ndarray, np.ndarray]:
    """(the answer's probability, whether it is the top token) with each of ``sets`` zeroed
    at the last position (the first row of the result is the clean prompt, then one per
    set). An edit at the last position changes no earlier position, so the prompt less its
    last token runs once, and each row runs that one position against its keys and
    values: the rows cost one position each, not the whole prompt."""
    n_layers, d_mlp = model.cfg.n_layers, int(model.cfg.d_mlp or 0)
    rows = len(sets) + 1
    device = model.W_U.device
    mask = torch.zeros((rows, n_layers, d_mlp), dtype=torch.bool, device=device)
    for i, s in enumerate(sets):
        for layer, n in s:
            mask[i + 1, layer, n] = True
    tokens = np.asarray(tokens, dtype=np.int64)
    answers = torch.full((rows,), int(answer))
    if len(tokens) < 2:
        toks = torch.as_tensor(tokens, device=device)[None].expand(rows, -1)
        p, top, _ = set_last(model, toks, mask, answers)
        return p, top
    cache = expand_cache(prefix_cache(model, tokens[:-1]), rows)
    last = torch.as_tensor(tokens[-1:], device=device)[None].expand(rows, -1)
    resid = model.run_with_hooks(
        last, past_kv_cache=cache, stop_at_layer=n_layers,
        attention_mask=torch.ones((rows, 1), dtype=torch.long, device=device),
        fwd_hooks=edit_hooks(mask, None, n_layers))
    p, top, _ = read_answers(final_logits(model, resid)[:, 0], answers)
    return p, top


@torch.no_grad()
def set_last(model: HookedTransformer, toks: torch.Tensor, mask: torch.Tensor,
             answers: torch.Tensor, values: torch.Tensor | None = None
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One forward of ``toks`` (B, L) with each row's ``mask`` (B, n_layers, d_mlp) set to
    ``values`` (zero where None) at the last position (``read_answers``)."""
    logits = model.run_with_hooks(
        toks, fwd_hooks=edit_hooks(mask, values, model.cfg.n_layers))[:, -1]
    return read_answers(logits, answers)


def masked_last_position(model: HookedTransformer, tokens: list[np.ndarray],
                         answers: np.ndarray, batch: int = 64) -> Evaluator:
    """An ``Evaluator`` for many prompts by full forwards, batched by token count."""
    lengths = np.array([len(t) for t in tokens])
    groups = [np.nonzero(lengths == n)[0] for n in np.unique(lengths)]
    device = model.W_U.device

    def evaluate(mask: np.ndarray, values: np.ndarray | None = None,
                 rows: np.ndarray | None = None):
        rows = np.arange(len(tokens)) if rows is None else np.asarray(rows)
        at = {int(r): i for i, r in enumerate(rows)}
        p = np.zeros(len(rows))
        top = np.zeros(len(rows), dtype=bool)
        token = np.zeros(len(rows), dtype=np.int64)
        for g in groups:
            g = g[np.isin(g, rows)]
            for s in range(0, len(g), batch):
                idx = g[s:s + batch]
                pos = np.array([at[int(i)] for i in idx])
                toks = torch.as_tensor(np.stack([tokens[i] for i in idx]), dtype=torch.long,
                                       device=device)
                v = None if values is None else torch.as_tensor(values[pos], device=device)
                p[pos], top[pos], token[pos] = set_last(
                    model, toks, torch.as_tensor(mask[pos], device=device),
                    torch.as_tensor(answers[idx], dtype=torch.long), v)
        return p, top, token
    return evaluate


@dataclass
class ControlDraws:
    """A control's draws on one prompt: the answer's probability and top after each."""

    p: list[float]
    top: list[bool]
    n: list[int] = field(default_factory=list)  # neurons zeroed per draw

    @property
    def p_mean(self) -> float:
        return float(np.mean(self.p)) if self.p else float("nan")

    @property
    def p_se(self) -> float:
        k = len(self.p)
        return float(np.std(self.p, ddof=1) / np.sqrt(k)) if k > 1 else float("nan")

    @property
    def top_ci(self) -> tuple[float, float]:
        return wilson(int(sum(self.top)), len(self.top))


def verdict(stat: dict) -> str:
    """"adds" when the interval is above 0, "takes away" when below, "nil" when it holds 0
    (or cannot be told: fewer than two prompts)."""
    lo, hi = stat["ci"]
    if not np.isfinite(lo) or not np.isfinite(hi):
        return "nil"
    return "adds" if lo > 0 else "takes away" if hi < 0 else "nil"


@dataclass
class PromptKnockout:
    """One prompt's knockout and its controls (module doc). ``p_random`` / ``top_random``
    are the ``random`` control's draws (the paper's), kept by those names for the readers
    of stored explanations."""

    neurons: list[tuple[int, int]]
    p_clean: float
    p_knocked: float
    top_after: bool  # the answer is still the top token
    p_random: list[float]
    top_random: list[bool]
    ranking: str = "direct"  # what ranked the neurons on the prompt: "direct" or "total"
    controls: dict[str, ControlDraws] = field(default_factory=dict)

    @property
    def p_random_mean(self) -> float:
        return ControlDraws(self.p_random, self.top_random).p_mean

    @property
    def p_random_se(self) -> float:
        return ControlDraws(self.p_random, self.top_random).p_se

    @property
    def top_random_ci(self) -> tuple[float, float]:
        return ControlDraws(self.p_random, self.top_random).top_ci

    @property
    def label_adds(self) -> dict[str, float]:
        """Per matched control: its mean p after zeroing minus the knockout's (positive:
        the labelled neurons that hold hurt the answer more than the control's)."""
        return {name: self.controls[name].p_mean - self.p_knocked
                for name in MATCHED if name in self.controls and self.controls[name].p}

    def to_dict(self) -> dict:
        return {"p_random_mean": self.p_random_mean, "p_random_se": self.p_random_se,
                "top_random_ci": list(self.top_random_ci), "label_adds": self.label_adds,
                "controls": {name: {"p": c.p, "top": c.top, "n": c.n, "p_mean": c.p_mean,
                                    "p_se": c.p_se, "top_ci": list(c.top_ci)}
                             for name, c in self.controls.items()}}


def run_knockout(model: HookedTransformer, tokens: np.ndarray, answer: int,
                 masks: dict[str, list[np.ndarray]], ranking: str) -> PromptKnockout:
    """Zero the knockout set and every control draw of one prompt (``knockout_masks`` of
    P = 1), one batched forward."""
    names = [name for name in CONTROLS if name in masks]
    sets = [neurons_of(masks["knockout"][0][0])] + [
        neurons_of(m[0]) for name in names for m in masks[name]]
    p, top = zeroed_probs(model, tokens, answer, sets)
    controls, at = {}, 2
    for name in names:
        k = len(masks[name])
        controls[name] = ControlDraws([float(x) for x in p[at:at + k]],
                                      [bool(x) for x in top[at:at + k]],
                                      [len(s) for s in sets[at - 1:at - 1 + k]])
        at += k
    rnd = controls.get("random", ControlDraws([], []))
    return PromptKnockout(neurons=sets[0], p_clean=float(p[0]), p_knocked=float(p[1]),
                          top_after=bool(top[1]), p_random=rnd.p, top_random=rnd.top,
                          ranking=ranking, controls=controls)
