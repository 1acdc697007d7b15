"""Wrong answers across runs (issue 83): which heuristics push the answer a model writes
where it is wrong, and whether other runs of the model fail on the same prompts.

``written`` reads, for every prompt of an operator's grid, the answer's first token and
the model's top token at the last position (greedy decoding's first token). A prompt is
answered wrong where they differ.

``wrong_split``: on the prompts answered wrong with a number, the exact direct
decomposition (``catalog.explain.decompose``) of T_w, the written token's logit less the
mean of the operator's other first tokens, split between labelled neurons whose label
holds with the result taken as the value the model WROTE only, as the TRUE result only,
as both (every operand label: it does not read the result), as neither, the other
neurons, the heads and the rest (embeddings and biases). A label holds as in
``catalog.explain.holds`` (its set and its side, the side read against the written
token's lens). If the heuristics push wrong answers by their sets, labels that hold for
the written value carry T_w; the control that can refute it is the same split with the
labels placed at random on the neurons of their layers (``reassign``, ``placements``
times): the figure is reported less that null's mean, with an interval combining the
prompts' standard error and the placements' spread (``against_null``).

``shared_failures``: for two runs over the same prompts, how often run j fails where run
i fails against how often j fails at all, and against what independent runs would share
given each run's error rate per stratum of the result's size (difficulty alone: larger
results are missed by every run); and on shared failures, how often both wrote the same
wrong token.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
from transformer_lens import HookedTransformer

from catalog.config import ScienceConfig
from catalog.core.stats import wilson
from catalog.explain.grid import holding, score_prompts
from catalog.explain.holds import Label, as_labels
from catalog.explain.label_figures import against_null, reassign
from catalog.explain.prompt import Prompt, build_many, grid_cells

SPLIT = ("holds for the written value only", "holds for the true result only",
         "holds for both", "labelled, holds for neither", "other neurons", "heads", "rest")


@dataclass
class Written:
    """One run's answers on an operator's grid (P prompts)."""

    op: str
    a: np.ndarray
    b: np.ndarray
    result: np.ndarray
    answer: np.ndarray  # the true result's first token
    top: np.ndarray  # the model's top token at the last position
    value: np.ndarray  # the number the top token writes (-1: not a number)
    prompts: list[Prompt]

    @property
    def wrong(self) -> np.ndarray:
        return self.top != self.answer


def token_values(tokenizer, tokens: np.ndarray) -> np.ndarray:
    """The number each token writes (its text, stripped, read as a whole number), -1 for
    a token that is not one."""
    out = np.full(len(tokens), -1, dtype=np.int64)
    for i, t in enumerate(tokens):
        text = tokenizer.decode([int(t)]).strip()
        if text.isdigit():
            out[i] = int(text)
    return out


@torch.no_grad()
def written(model: HookedTransformer, tokenizer, config: ScienceConfig, op: str,
            batch: int = 256) -> Written:
    """Every grid prompt of ``op`` (``catalog.explain.prompt.grid_cells``) with the model's
    top token at its last position."""
    a, b, _ = grid_cells(model, tokenizer, config, op)
    prompts = build_many(model, tokenizer, op, a, b, config)
    top = np.zeros(len(prompts), dtype=np.int64)
    lengths = np.array([len(p.tokens) for p in prompts])
    for length in np.unique(lengths):
        idx_all = np.nonzero(lengths == length)[0]
        for start in range(0, len(idx_all), batch):
            idx = idx_all[start:start + batch]
            toks = torch.as_tensor(np.stack([prompts[i].tokens for i in idx]),
                                   device=model.W_U.device)
            top[idx] = model(toks)[:, -1].argmax(-1).cpu().numpy()
    return Written(op=op, a=np.array([p.a for p in prompts]), b=np.array([p.b for p in prompts]),
                   result=np.array([p.result for p in prompts]),
                   answer=np.array([p.answer for p in prompts]), top=top,
                   value=token_values(tokenizer, top), prompts=prompts)


def _split(scored, heads: np.ndarray, labels: Mapping[tuple[int, int], Sequence[Label]],
           true_result: np.ndarray) -> dict[str, np.ndarray]:
    """Per prompt, each part of ``SPLIT`` as a share of T_w (``scored``: the prompts with
    the written token as answer and the written value as result)."""
    keys = sorted(labels)
    n, d_mlp = len(scored.a), scored.scores["direct"].shape[2]
    flat = np.array([layer * d_mlp + k for layer, k in keys], dtype=np.int64)
    hold_w = holding(scored, labels, keys, flat)[3]
    hold_r = holding(replace(scored, result=true_result), labels, keys, flat)[3]
    terms = scored.scores["direct"].reshape(n, -1)
    lab = terms[:, flat] if len(flat) else np.zeros((n, 0))
    parts = {SPLIT[0]: (lab * (hold_w & ~hold_r)).sum(1),
             SPLIT[1]: (lab * (hold_r & ~hold_w)).sum(1),
             SPLIT[2]: (lab * (hold_w & hold_r)).sum(1),
             SPLIT[3]: (lab * ~(hold_w | hold_r)).sum(1)}
    parts[SPLIT[4]] = terms.sum(1) - sum(parts.values())
    parts[SPLIT[5]] = heads
    parts[SPLIT[6]] = scored.target - terms.sum(1) - heads
    t = scored.target
    with np.errstate(divide="ignore", invalid="ignore"):
        return {k: np.where(t != 0, v / t, np.nan) for k, v in parts.items()}


def wrong_split(model: HookedTransformer, got: Written,
                labels: Mapping[tuple[int, int], Sequence[Label]],
                typical: Mapping | None = None, typical_kv: Mapping | None = None,
                placements: int = 20, seed: int = 0, batch: int = 128) -> dict:
    """The module doc's split of T_w over the prompts answered wrong with a number, beside
    the same split under ``placements`` random placements of the labels; JSON-ready."""
    labels = as_labels(labels)
    sel = np.nonzero(got.wrong & (got.value >= 0))[0]
    out = {"op": got.op, "prompts": len(got.a), "wrong": int(got.wrong.sum()),
           "wrong_not_a_number": int((got.wrong & (got.value < 0)).sum()),
           "split_over": int(len(sel)), "labelled_neurons": len(labels)}
    if not len(sel) or not labels:
        return out
    prompts = [replace(got.prompts[i], answer=int(got.top[i]), result=int(got.value[i]))
               for i in sel]
    layers = sorted({layer for layer, _ in labels})
    scored, heads = score_prompts(model, prompts, layers, typical, typical_kv, batch)
    true = _split(scored, heads, labels, got.result[sel])
    rng = np.random.default_rng([seed, 83])
    d_mlp = scored.scores["direct"].shape[2]
    nulls = [_split(scored, heads, reassign(labels, d_mlp, rng), got.result[sel])
             for _ in range(placements)]
    out["shares"] = {k: _finite_mean(v) for k, v in true.items()}
    out["against_placements"] = against_null(
        {k: true[k] for k in SPLIT[:4]}, [{k: nl[k] for k in SPLIT[:4]} for nl in nulls])
    return out


def _finite_mean(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    return float(x.mean()) if len(x) else float("nan")


def result_strata(result: np.ndarray, bins: int = 10) -> np.ndarray:
    """Each prompt's stratum of difficulty: its result's decile (``bins`` quantiles of the
    results), equal results always in one stratum (so strata of a result that many
    prompts share, as 0 for ``/``, are larger)."""
    result = np.asarray(result, dtype=np.float64)
    edges = np.quantile(result, np.arange(1, bins) / bins)
    return np.searchsorted(edges, result, side="right").astype(np.int64)


def shared_failures(wrong_i: np.ndarray, wrong_j: np.ndarray, strata: np.ndarray,
                    top_i: np.ndarray | None = None, top_j: np.ndarray | None = None
                    ) -> dict:
    """Run j's failures where run i fails (the same prompts, in the same order): the
    share with its Wilson interval, j's error rate over every prompt (the base rate), the
    count shared against what independent runs would share stratum by stratum (each run's
    error rate per stratum), and, where both fail, how often they wrote the same token."""
    wrong_i, wrong_j = np.asarray(wrong_i, bool), np.asarray(wrong_j, bool)
    n_i, both = int(wrong_i.sum()), int((wrong_i & wrong_j).sum())
    expected = 0.0
    for s in np.unique(strata):
        at = strata == s
        expected += float(wrong_i[at].sum()) * float(wrong_j[at].mean())
    out = {"prompts": int(len(wrong_i)), "wrong_i": n_i, "wrong_j": int(wrong_j.sum()),
           "shared": both, "given_i": both / n_i if n_i else float("nan"),
           "given_i_ci": list(wilson(both, n_i)) if n_i else [float("nan")] * 2,
           "base_j": float(wrong_j.mean()),
           "base_j_ci": list(wilson(int(wrong_j.sum()), len(wrong_j))),
           "expected_shared_by_stratum": expected,
           "shared_over_expected": both / expected if expected else float("nan")}
    if top_i is not None and top_j is not None and both:
        same = int((wrong_i & wrong_j & (np.asarray(top_i) == np.asarray(top_j))).sum())
        out["same_wrong_token"] = same
        out["same_wrong_token_ci"] = list(wilson(same, both))
    return out
