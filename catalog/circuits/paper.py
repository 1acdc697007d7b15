"""Circuits as the heuristics paper builds them, and the faithfulness curve (docs/method.md §6).

A circuit is what a forward pass keeps (``catalog.measuring.ablation.Circuit``); its faithfulness
says how much of the model's answer survives when the rest is ablated
(``catalog.circuits.faithfulness``). How the circuit is built is the PROTOCOL, a recorded config
choice:

- ``paper``: the heuristics paper's released code. The heads of largest effect are
  kept (``heads_to_keep``; the others are mean-ablated at every position), MLP layers
  below the *first heuristics layer* stay whole, and only the MLPs from it on are pruned
  to their top-k neurons. Neurons are ranked by attribution patching at the last
  position, mean + std over pairs (or by the catalog's rank, ``circuit_ranking``).
  Means cover all four operators over the whole grid, invalid cells included
  (``mean_population``), and replace activations at every position (``ablate_context``).
- ``all-layers``: the catalog's protocol before 0.5.0, kept for comparison: every
  measured layer pruned to its top-k by the catalog's rank, heads never ablated, means
  over the run's own prompts at the prompt's own positions.
- ``counterfactual``: the paper's circuit, but what is outside it takes its value on a
  counterfactual prompt (same token length, another answer) instead of a mean, as the MIB
  benchmark's circuit track does; the empty circuit is the counterfactual everywhere.

The first heuristics layer (``late_from``) is given, or the paper's value for the
models it studied (``PAPER_FIRST_HEURISTICS_LAYER``), or found by a rule on the
component effects: the first layer from 1 whose whole-MLP effect at the last position
reaches ``LATE_SHARE`` of the largest one (the paper's code never prunes MLP 0).

Every curve comes with two controls at the same sizes: a random circuit (random neurons
of the pruned layers, a new draw per seed) and the reversed ranking (the least important
neurons first). If the ranking matters, the curve rises above both.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np
import torch
from jaxtyping import Float
from transformer_lens import HookedTransformer

from catalog.circuits import faithfulness
from catalog.config.vocab import PROTOCOLS
from catalog.measuring import ablation
from catalog.measuring.ablation import Circuit
from catalog.measuring.components import ComponentEffects
from catalog.measuring.prompts import PromptTable

LATE_SHARE = 0.1
# model_analysis_consts.py of technion-cs-nlp/llm-arithmetic-heuristics
PAPER_FIRST_HEURISTICS_LAYER = {"pythia69b": 14, "llama38b": 16, "metallama38b": 16,
                                "gptj6b": 17, "llama370b": 39, "metallama370b": 39}
# heads the paper keeps: 50 of Pythia-6.9B's 1,024 and of GPT-J's 448, 100 of
# Llama3-70B's 5,120 (Llama3-8B's were hand-picked, 6 to 20 per operator)
PAPER_HEADS = 50
PAPER_HEADS_AT = 1024
CIRCUIT_KINDS = ("ranked", "reversed", "random")


def top_k_mask(effect: Float[np.ndarray, "n_layers d_mlp"], k: int) -> np.ndarray:
    """Boolean (n_layers, d_mlp): the k neurons of each layer with the largest effect."""
    mask = np.zeros(effect.shape, dtype=bool)
    order = np.argsort(-effect, axis=1, kind="stable")[:, :k]
    np.put_along_axis(mask, order, True, axis=1)
    return mask


def circuit_sizes(d_mlp: int, fractions: tuple[float, ...]) -> list[int]:
    """Neurons per layer for each circuit fraction (at least 1, no duplicates)."""
    return sorted(set(faithfulness.fraction_counts(d_mlp, fractions)))


def heads_to_keep(n_layers: int, n_heads: int, setting: str) -> int:
    """How many heads a paper circuit keeps. ``auto``: the paper's 50 heads at 1,024,
    scaled by the square root of the model's head count (1,024 heads: 50; GPT-J's 448:
    33, the paper 50; Llama3-70B's 5,120: 112, the paper 100; Qwen2.5-0.5B's 336: 29);
    otherwise the number given. At least 1, at most every head."""
    total = n_layers * n_heads
    n = round(PAPER_HEADS * math.sqrt(total / PAPER_HEADS_AT)) if setting == "auto" \
        else int(setting)
    return max(1, min(total, n))


def known_first_layer(model_name: str) -> int | None:
    """The paper's first heuristics layer for a model it studied, else None."""
    key = re.sub(r"[^a-z0-9]", "", model_name.lower().rsplit("/", 1)[-1])
    return PAPER_FIRST_HEURISTICS_LAYER.get(key)


def first_heuristics_layer(mlp_last: np.ndarray) -> int:
    """The rule: the first layer from 1 whose whole-MLP effect at the last position
    (``mlp_last``, one rank key per layer, averaged over operators) reaches ``LATE_SHARE``
    of the largest one; 1 when no layer has an effect."""
    key = np.nan_to_num(np.asarray(mlp_last, dtype=np.float64), nan=0.0, neginf=0.0)
    if len(key) < 2:
        return 0
    peak = key[1:].max()
    if not peak > 0:
        return 1
    return 1 + int(np.argmax(key[1:] >= LATE_SHARE * peak))


@dataclass
class CircuitPlan:
    """How one protocol builds one operator's circuits at every size."""

    protocol: str
    heads: np.ndarray  # (n_layers, n_heads) bool, kept
    pruned: list[int]  # layers pruned to their top-k neurons
    whole: list[int]  # layers kept whole
    score: np.ndarray  # (n_layers, d_mlp) ranking of the pruned layers, largest first
    empty: Circuit
    late_from: int | None = None  # first heuristics layer (paper, counterfactual)
    late_source: str | None = None  # config | paper | rule

    def circuit(self, mask: np.ndarray) -> Circuit:
        """The circuit keeping ``mask`` (n_layers, d_mlp) in the pruned layers."""
        neurons = np.ones_like(mask)
        neurons[self.pruned] = mask[self.pruned]
        return Circuit(neurons, self.heads)

    def ranked(self, k: int) -> Circuit:
        return self.circuit(top_k_mask(self.score, k))

    def reversed(self, k: int) -> Circuit:
        rev = np.where(np.isfinite(self.score), -self.score, -np.inf)
        return self.circuit(top_k_mask(rev, k))

    def random(self, k: int, rng: np.random.Generator) -> Circuit:
        return self.circuit(top_k_mask(rng.random(self.score.shape), k))


def plan(protocol: str, model: HookedTransformer, measured: list[int],
         score: np.ndarray, rank_key: np.ndarray, comps: ComponentEffects | None,
         late_from: str, heads: str, sign: str, model_name: str = "",
         mlp_last: np.ndarray | None = None) -> CircuitPlan:
    """The circuits of ``protocol`` for one operator.

    ``score`` is the paper's ranking (attribution mean + std) and ``rank_key`` the
    catalog's (both (n_layers, d_mlp), largest first, -inf where unmeasured); which one a
    paper circuit uses was chosen by the caller. ``comps`` ranks the heads; ``mlp_last``
    (n_layers,) places the first heuristics layer when ``late_from`` is ``auto`` (default:
    this operator's own).
    """
    cfg = model.cfg
    n_layers, n_heads = cfg.n_layers, cfg.n_heads
    if protocol == "all-layers":
        whole = [x for x in range(n_layers) if x not in measured]
        neurons = np.ones((n_layers, score.shape[1]), dtype=bool)
        neurons[measured] = False
        all_heads = np.ones((n_layers, n_heads), dtype=bool)
        return CircuitPlan(protocol, all_heads, list(measured), whole, rank_key,
                           Circuit(neurons, all_heads))
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
    if comps is None:
        raise ValueError(f"protocol {protocol!r} needs component effects")
    if late_from != "auto":
        layer, source = int(late_from), "config"
    elif (known := known_first_layer(model_name)) is not None and known < n_layers:
        layer, source = known, "paper"
    else:
        last = comps.mlp_last(sign) if mlp_last is None else mlp_last
        layer, source = first_heuristics_layer(last), "rule"
    n_keep = heads_to_keep(n_layers, n_heads, heads)
    head_key = comps.head_scores(sign)
    kept = np.zeros(n_layers * n_heads, dtype=bool)
    kept[np.argsort(-head_key.ravel(), kind="stable")[:n_keep]] = True
    pruned = [x for x in measured if x >= layer]
    whole = [x for x in range(n_layers) if x not in pruned]
    return CircuitPlan(protocol, kept.reshape(n_layers, n_heads), pruned, whole, score,
                       Circuit.nothing(model), layer, source)


# ------------------------------------------------------------------ the curve


@dataclass
class CurveResult:
    """One protocol's faithfulness curve for one operator, with its controls."""

    protocol: str
    op: str
    plan: CircuitPlan
    n_prompts: int  # draws over the seeds (a prompt drawn by two seeds counts twice)
    n_unique: int
    seeds: int
    context: str
    population: str | None
    ranking: str
    baselines: dict = field(default_factory=dict)  # metric -> {model, empty, n_small}
    points: list[dict] = field(default_factory=list)  # circuit, k, fraction, flags, stats
    areas: dict = field(default_factory=dict)  # circuit -> metric -> statistic -> areas

    def as_dict(self) -> dict:
        p = self.plan
        return {
            "protocol": self.protocol, "op": self.op, "n_prompts": self.n_prompts,
            "n_unique": self.n_unique, "seeds": self.seeds, "context": self.context,
            "population": self.population, "ranking": self.ranking,
            "late_from": p.late_from, "late_source": p.late_source, "pruned": p.pruned,
            "whole": p.whole, "heads": [[int(a), int(b)] for a, b in np.argwhere(p.heads)],
            "n_heads_kept": int(p.heads.sum()), "n_heads": int(p.heads.size),
            "baselines": self.baselines, "points": self.points, "areas": self.areas,
        }

    def curve(self, metric: str = "nl", stat: str = "mean_ratio",
              circuit: str = "ranked") -> list[tuple[int, float | None]]:
        """(k, value) along one curve."""
        return [(pt["k"], pt[stat]) for pt in self.points
                if pt["metric"] == metric and pt["circuit"] == circuit]


@dataclass
class CurveSetup:
    """What every curve of one checkpoint shares."""

    table: PromptTable
    width: int  # d_mlp
    fractions: tuple[float, ...]
    counts: list[int]  # the paper's k schedule, or [] when not asked for
    seeds: list[np.ndarray]  # per seed, the prompts drawn (table indices)
    cf_of: dict[int, int]  # prompt -> its counterfactual prompt (same length, other answer)
    seed: int
    batch_size: int


def measure_curve(model: HookedTransformer, setup: CurveSetup, op: str, plan_: CircuitPlan,
                  replace: ablation.Replace, context: str, population: str | None,
                  ranking: str, kinds: tuple[str, ...] = CIRCUIT_KINDS) -> CurveResult:
    """The faithfulness of ``plan_``'s circuits at every size, with the controls, the
    baselines and the areas, for one operator's drawn prompts. ``kinds`` picks the
    circuits measured: the ranked one always, the reversed and random controls when named
    (the final circuit measured at an earlier checkpoint keeps only its random control)."""
    union = np.unique(np.concatenate(setup.seeds)) if setup.seeds else np.zeros(0, np.int64)
    result = CurveResult(plan_.protocol, op, plan_, sum(len(s) for s in setup.seeds),
                         len(union), len(setup.seeds), context, population, ranking)
    if not len(union):
        return result
    run = _curve_runner(model, setup, replace, context)
    model_v, empty_v = run(union, [Circuit.everything(model)]) + run(union, [plan_.empty])
    mib_ks = faithfulness.fraction_counts(setup.width, setup.fractions)  # may repeat
    sizes = CurveSizes.of(setup, mib_ks, kinds)
    # the draws, in seed order, as rows of the union
    draws = np.concatenate([np.searchsorted(union, s) for s in setup.seeds])
    values = _curve_values(run, union, draws, plan_, setup,
                           setup.table.operators.index(op), sizes)
    _fill_curve(result, values, sizes, mib_ks, setup, model_v[draws], empty_v[draws])
    return result


@dataclass
class CurveSizes:
    """The circuit sizes one curve measures: ``ks`` the ranked circuit's (every MIB level
    and the paper's counts), ``mib`` the distinct MIB levels (levels below one neuron
    share k = 1: measured once), ``reversed`` / ``random`` the controls' sizes below the
    full width (at the full width every kind keeps every neuron: one circuit, measured
    with the ranked ones), empty where the control is not asked for."""

    ks: list[int]
    mib: list[int]
    reversed: list[int]
    random: list[int]
    width: int
    kinds: tuple[str, ...]

    @classmethod
    def of(cls, setup: CurveSetup, mib_ks: list[int], kinds: tuple[str, ...]) -> CurveSizes:
        mib = sorted(set(mib_ks))
        part = [k for k in mib if k < setup.width]
        return cls(sorted(set(mib_ks) | set(setup.counts)), mib,
                   part if "reversed" in kinds else [], part if "random" in kinds else [],
                   setup.width, kinds)

    def by_kind(self) -> dict[str, list[int]]:
        """Each measured kind's sizes: the ranked circuit's and the controls' asked for."""
        out = {"ranked": self.ks}
        out.update({kind: self.mib for kind in ("reversed", "random") if kind in self.kinds})
        return out


def _curve_runner(model: HookedTransformer, setup: CurveSetup, replace: ablation.Replace,
                  context: str):
    """run(prompts, circuits) -> each circuit's metric values on those prompts."""
    table = setup.table
    answer = torch.as_tensor(table.answer, device=model.cfg.device)
    cf_answer = torch.as_tensor(np.array([table.answer[setup.cf_of.get(int(p), int(p))]
                                          for p in range(len(table))]),
                                device=model.cfg.device)

    def score(logits: torch.Tensor, idx: np.ndarray) -> np.ndarray:
        at = torch.as_tensor(idx, device=logits.device)
        return faithfulness.prompt_metrics(logits, answer[at], cf_answer[at])

    def run(prompts: np.ndarray, circuits: list[Circuit]) -> list[np.ndarray]:
        return ablation.evaluate(model, table, prompts, circuits, replace, context, score,
                                 setup.batch_size)
    return run


def _curve_values(run, union: np.ndarray, draws: np.ndarray, plan_: CircuitPlan,
                  setup: CurveSetup, o: int, sizes: CurveSizes) -> dict[str, list]:
    """Each kind's metric values per size (rows: the draws). Ranked and reversed circuits
    share everything below the first pruned layer, so they run together and the early
    layers run once; the random control draws anew per seed."""
    ks = sizes.ks
    got = [v[draws] for v in run(union, [plan_.ranked(k) for k in ks]
                                 + [plan_.reversed(k) for k in sizes.reversed])]
    ranked, rev = got[:len(ks)], dict(zip(sizes.reversed, got[len(ks):], strict=True))
    full = ranked[ks.index(sizes.width)] if sizes.width in ks else None
    per_seed = [run(s, [plan_.random(k, np.random.default_rng([setup.seed, 9, o, i, k]))
                        for k in sizes.random]) for i, s in enumerate(setup.seeds)]
    rand = {k: np.concatenate([seed_values[j] for seed_values in per_seed])
            for j, k in enumerate(sizes.random)}
    return {"ranked": ranked,
            "reversed": [rev.get(k, full) for k in sizes.mib],
            "random": [rand.get(k, full) for k in sizes.mib]}


def _fill_curve(result: CurveResult, values: dict[str, list], sizes: CurveSizes,
                mib_ks: list[int], setup: CurveSetup, m: np.ndarray, e: np.ndarray) -> None:
    """The baselines, every point's statistics and each kind's areas into ``result``
    (``m``, ``e``: the whole model's and the empty circuit's values on the draws)."""
    boot = faithfulness.resamples(len(m), setup.seed)
    for mi, metric in enumerate(faithfulness.METRICS):
        result.baselines[metric] = {
            "model": float(m[:, mi].mean()), "empty": float(e[:, mi].mean()),
            "n_small": faithfulness.small_denominators(m[:, mi], e[:, mi])}
    mib_set, paper_set, width = set(mib_ks), set(setup.counts), setup.width
    for kind, k_list in sizes.by_kind().items():
        for v, k in zip(values[kind], k_list, strict=True):
            for mi, metric in enumerate(faithfulness.METRICS):
                stats = faithfulness.point_stats(v[:, mi], e[:, mi], m[:, mi], boot)
                result.points.append({"circuit": kind, "k": int(k), "fraction": k / width,
                                      "mib": k in mib_set, "paper": k in paper_set,
                                      "metric": metric, **stats.as_dict()})
        levels = np.stack([values[kind][k_list.index(k)] for k in mib_ks])
        result.areas[kind] = {metric: faithfulness.area_stats(
            np.array(setup.fractions), levels[:, :, mi], e[:, mi], m[:, mi], boot)
            for mi, metric in enumerate(faithfulness.METRICS)}
