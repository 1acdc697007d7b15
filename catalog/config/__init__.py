"""Configuration: what is measured (hashed) apart from how it is run (not). The package
also holds the config's checks (``checks``), its command-line and form fields
(``flags``), the vocabularies of its fields (``vocab``) and every environment variable
the project reads (``settings``). May import ``catalog.core`` only.

``ScienceConfig`` holds every choice that changes a stored number. It is validated
when built (bad values raise ``ValueError`` naming the field and what would be
right) and hashes deterministically, so that the same model, checkpoint and config
always name the same catalog rows (docs/method.md, "Provenance").

``ExecutionConfig`` holds how the work is batched and where it runs (batch sizes,
device, activation budget). Every measured number is the same up to float rounding
whatever it says, so it is never hashed or stored, and each worker may choose its own.

Each field's metadata carries its help text (and, where it differs from
``--field-name``, its command-line flag): the ``ncat`` flags and the explorer's job
form are generated from it (``catalog.config.flags``), so each default and its
help text live in exactly one place.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field, fields

from catalog.config.checks import check_science
from catalog.config.vocab import (
    BOTTOM_MODES,
    CONTEXTS,
    DEFAULT_FAMILIES,
    DTYPES,
    HEURISTIC_VARIANTS,
    LABEL_RULES,
    LEGACY_EXECUTION_KEYS,
    LEGACY_SCIENCE,
    MIB_FRACTIONS,
    NULL_STRATA,
    OP_WORDS,
    PATCHING_METHODS,
    POPULATIONS,
    RANK_SIGNS,
    RANK_STATISTICS,
    RANKINGS,
    TEMPLATES,
)
from catalog.core.arith import OPERATORS
from catalog.core.tokens import NumberTokens

# 0.2.0: labels with the significance rule, constant neurons without rows, robust ranking,
# the value family, prompts tokenized as prefix + prompt (docs/method.md)
# 0.3.0: scores stored per family (scores_per_family), the forward passes' dtype
# 0.4.0: grid storage tiers (full_grids: full grids for the top set, sketches for the rest)
# 0.5.0: circuits as the heuristics paper builds them (faithfulness protocols, component
# effects, curve controls and areas, well-conditioned faithfulness statistics)
# 0.6.0: labels under the value-permutation null (label_rule values, null_strata), each
# cell set scored once (dedupe_heuristics), correctness needs a non-digit after the answer
# 0.7.0: periodic structure of every map, with the config's spectra on (catalog.periodic.spectra)
# 0.8.0: the spectra's null fits the other operands' effects (catalog.periodic.spectra), periods
# with three cycles on the axis, the cubic guard
# 0.9.0: the spectra's guard also needs a period to beat a cubic plus one range of values
# on the axis's own effect (windows of the result were called periodic at the longest
# candidate periods)
# 0.10.0: a result label must explain the KV map beyond both operands' additive effects and
# this operator's result must fit it at least as well as another operator's
# (result_beyond_operands); the explanations stored per labelled map
# 0.11.0: a result label must also beat its rivals (catalog.labels.rivals: every other
# operator's result in an order-free form, max and min of the operands), held out and in
# a nested test; the stored comparison names the rival
CATALOG_VERSION = "0.11.0"

def _opt(default, help: str, flag: str | None = None, form: bool = False, **extra):
    """A config field with its help text; ``form`` puts it on the explorer's job form."""
    return field(default=default, metadata={"help": help, "flag": flag, "form": form, **extra})


@dataclass(frozen=True)
class ScienceConfig:
    """What to measure and how (docs/method.md defines each quantity)."""

    operators: tuple[str, ...] = _opt(
        OPERATORS, "operators to measure, e.g. '+-' (default all four)", flag="--ops",
        form=True, kind="operators")
    operand_lo: int = _opt(0, "smallest operand: a, b range over [lo, hi)", flag="--lo",
                           form=True)
    operand_hi: int = _opt(300, "operands range over [lo, hi); the paper used [0, 300), "
                                "[0, 100) is 9x cheaper", flag="--hi", form=True)
    template: str = _opt("{a}{op}{b}=", "prompt text with {a}, {b} and {op} (or {op_word}: "
                         "plus, minus, times, divided by), or a named template: "
                         + ", ".join(f"{k} = {v!r}" for k, v in TEMPLATES.items()), form=True)
    few_shot: str = _opt("", "fixed text put before every prompt (before the solved examples)")
    shots: int = _opt(0, "solved examples of the same operator put before every prompt "
                         "(deterministic from the seed; their cells are left out of pairs, "
                         "faithfulness and knockouts)", form=True)
    shot_separator: str = _opt("\n", "text after each solved example")
    pairs_per_op: int = _opt(100, "counterfactual pairs per operator for patching (paper: "
                                  "about 100)", flag="--pairs", form=True)
    seed: int = _opt(0, "seeds pair sampling and every other random choice", form=True)
    patching: tuple[str, ...] = _opt(
        PATCHING_METHODS, "patching methods: exact, attribution or both", kind="methods",
        form=True)
    dtype: str = _opt(
        "float32", "dtype of the weights and forward passes (bfloat16 or float16 halve memory "
        "and speed up GPUs, but their rounding swamps exact effects: keep float32 for "
        "them); logits, probabilities and effects are always float32",
        choices=DTYPES, form=True)
    exact: str = _opt("all", "which neurons get exact patching: all, none, or top:N (the N "
                             "neurons per layer and operator of largest |attribution|; needs "
                             "attribution)", form=True)
    rank_statistic: str = _opt(
        "trimmed", "statistic of the per-pair effects that ranks neurons and builds circuits: "
        "trimmed (10%-trimmed mean of the log-space effect), median (of the log-space "
        "effect) or mean (the paper's effect)", flag="--rank-by", choices=RANK_STATISTICS)
    rank_sign: str = _opt("abs", "rank by |statistic| (abs) or by its signed value (signed, "
                                 "the paper's order)", choices=RANK_SIGNS)
    heuristic_variant: str = _opt(
        "paper", "'paper' (modulo n in 2..9, 11, 13, 15; Algorithm 1 for patterns) or "
        "'code' (the released code: modulo n in 2..10, patterns counted among the top K)",
        flag="--variant", form=True, choices=HEURISTIC_VARIANTS)
    score_floor: float = _opt(0.3, "heuristic scores below it are not stored")
    scores_per_family: int = _opt(
        1, "scores stored per neuron, operator and heuristic family: its N best, plus every "
           "heuristic it implements (label rule); 0 stores every score >= score_floor")
    full_grids: str = _opt(
        "top:20", "grids stored at full resolution: top:N (the N neurons per layer and "
                  "operator of highest rank, as the circuit views take them; default the "
                  "views' circuit size), all, or none; every other grid is stored as a "
                  "sketch (at most 32 x 32 block means plus row and column means) and can "
                  "be filled in later with `ncat enqueue --full-grid`", form=True)
    match_threshold: float = _opt(
        0.6, "score from which a neuron implements a heuristic (paper: 0.6); knockouts and "
             "summaries use it, analysts may choose another in SQL")
    label_rule: str = _opt(
        "values", "when a neuron implements a heuristic: 'values' (score >= match_threshold "
        "AND significant, family-wise over the neuron's heuristics, against maps whose "
        "operand or result VALUES are permuted), 'significant' (the same against maps whose "
        "CELLS are shuffled: the rule before 0.6.0) or 'paper' (score >= match_threshold "
        "alone)", choices=LABEL_RULES, form=True)
    significance_level: float = _opt(
        0.05, "family-wise error rate per neuron and operator of the 'values' and "
              "'significant' rules (Tarone-Bonferroni over the heuristics scored)")
    result_beyond_operands: bool = _opt(
        True, "a result label must also explain the KV map beyond its least-squares "
              "f(op1) + g(op2) (both operands' main effects; a partial regression test at "
              "the rule's corrected level), and this operator's result must explain the map "
              "at least as well as every rival (another operator's result in a form that "
              "does not depend on the operands' order, max and min of the operands) and "
              "beyond each of them: a map that adds a feature of each operand (digit "
              "counts, token counts) or follows max(op1, op2) is not a result heuristic "
              "(docs/method.md section 7); under label_rule values only; off: the labels "
              "before 0.10.0")
    null_strata: str = _opt(
        "digits", "values the 'values' rule permutes among: digits (values with the same "
        "number of digits: one- against two-digit operands is tokenisation, not arithmetic) "
        "or none (all values of the operand or result)", choices=NULL_STRATA)
    spectra: bool = _opt(
        True, "the periodic structure of every map (catalog.periodic.spectra, docs/method.md "
              "section 11): about 7% of a run's time, 3-5% of neuron_op's bytes")
    dedupe_heuristics: bool = _opt(
        True, "score each cell set once, under its simplest name (the others are its "
              "aliases); off: every heuristic, as before 0.6.0")
    families: tuple[str, ...] = _opt(
        DEFAULT_FAMILIES, "heuristic families scored, comma-separated (`python -m "
        "catalog.labels.families` lists them)", kind="words")
    score_bottom: str = _opt("auto", "also score the bottom-k of each map: auto (gated MLPs "
                                     "only), always or never", choices=BOTTOM_MODES)
    lens_top_k: int = _opt(10, "top and bottom vocabulary tokens kept per neuron's lens")
    faithfulness_protocols: tuple[str, ...] = _opt(
        ("paper",), "how circuits are built and ablated, comma-separated: paper (the heuristics "
        "paper: top heads kept, MLPs pruned from the first heuristics layer on, means over "
        "all operators and the whole grid at every position), all-layers (every measured "
        "layer pruned, heads kept: the catalog's protocol before 0.5.0) and counterfactual "
        "(the paper's circuit, the rest patched from a counterfactual prompt, as MIB)",
        flag="--protocols", kind="words", form=True)
    late_from: str = _opt(
        "auto", "first heuristics layer: MLPs below it stay whole in a paper circuit; auto "
        "takes the paper's value for a model it studied, else the first layer from 1 whose "
        "whole-MLP effect at the last position reaches 10% of the largest")
    heads_kept: str = _opt(
        "auto", "attention heads a paper circuit keeps (the others are ablated): a number, or "
        "auto, the paper's 50 at 1,024 heads scaled by the square root of the head count",
        flag="--heads")
    circuit_ranking: str = _opt(
        "auto", "what ranks a paper circuit's neurons: attribution (the paper's: mean + std "
        "over pairs of attribution patching at the last position), rank (the catalog's rank "
        "statistic) or auto (attribution where attribution patching runs, else rank; the "
        "ranking used is stored with each curve)", choices=RANKINGS)
    mean_population: str = _opt(
        "grid", "prompts that mean ablation averages over: grid (all four operators over "
        "the whole operand grid, invalid cells included, as the paper) or valid (the run's "
        "own prompts)", choices=POPULATIONS)
    mean_prompts: int = _opt(500, "at most this many prompts of the mean population, an "
                                  "equal seeded sample per operator (0: all); each mean's "
                                  "standard error is then 4.5% of the activations' spread")
    ablate_context: str = _opt(
        "all", "positions a paper circuit ablates: all (every position, the few-shot prefix "
        "included) or prompt (the prompt's own tokens; the prefix runs clean)",
        choices=CONTEXTS)
    circuit_fractions: tuple[float, ...] = _opt(
        MIB_FRACTIONS, "circuit sizes as shares of each pruned layer's neurons, comma-"
        "separated (default the MIB benchmark's levels; the curve's areas and its controls "
        "use them)", kind="floats")
    circuit_counts: str = _opt(
        "none", "more circuit sizes in neurons per layer: paper (the heuristics paper's 0, "
        "10, ..., 490, then steps of 50 to the full width), none, or numbers")
    faithfulness_prompts: int = _opt(50, "correct prompts per operator and seed for "
                                         "faithfulness and knockouts (paper: 50)")
    faithfulness_seeds: int = _opt(3, "draws of faithfulness prompts (paper: 3); the "
                                      "random-circuit control draws anew for each")
    component_positions: tuple[str, ...] = _opt(
        ("last",), "prompt positions where every head and MLP layer is exactly patched, "
        "comma-separated from op1, op, op2, last (attribution covers all four); none: no "
        "component effects", kind="words")
    component_exact_heads: str = _opt(
        "auto", "heads exactly patched for component effects (every MLP layer always is): "
        "all, a number, or auto (twice the heads a paper circuit keeps); the others keep "
        "their attribution estimate, chosen by its size", flag="--component-exact-heads")
    knockout_neurons: int = _opt(10, "N of the prompt knockout (neurons per layer)")
    top_set_fraction: float = _opt(0.05, "share of each layer's neurons (by effect) that "
                                         "the knockouts draw from (the top set)")
    pattern_top_k: int = _opt(100, "K of the released code's pattern counting "
                                   "(variant 'code')")
    multi_result_top: int = _opt(50, "top cells examined by the multi-result heuristic "
                                     "(/ only)")

    def __post_init__(self) -> None:
        check_science(self)  # normalises in place (tuples, named templates) and validates

    def counts(self, width: int) -> list[int]:
        """The extra circuit sizes of ``circuit_counts`` for layers of ``width`` neurons
        (ValueError if malformed)."""
        text = self.circuit_counts.strip()
        if text == "none":
            return []
        if text == "paper":
            return sorted({k for k in list(range(0, 500, 10)) + list(range(500, width, 50))
                           if k <= width} | {width})
        try:
            values = sorted({int(w) for w in text.split(",") if w.strip()})
        except ValueError:
            values = []
        if not values or values[0] < 0:
            raise ValueError(f"circuit_counts must be paper, none or whole numbers >= 0, "
                             f"got {self.circuit_counts!r}")
        return [min(v, width) for v in values]

    def mean_passes(self) -> list[tuple[str, str, int]]:
        """(population, context, cap) of each mean-activation pass that the faithfulness
        protocols need (``counterfactual`` needs none; ``all-layers`` averages the run's own
        prompts at their own positions, as the catalog did before 0.5.0)."""
        out: list[tuple[str, str, int]] = []
        for protocol in self.faithfulness_protocols:
            if protocol == "all-layers":
                key = ("valid", "prompt", 0)
            elif protocol == "paper":
                key = (self.mean_population, self.ablate_context, self.mean_prompts)
            else:
                continue
            if key not in out:
                out.append(key)
        return out

    def mean_population_size(self, kind: str, cap: int, n_valid: int) -> int:
        """How many prompts a mean population of ``kind`` holds (``n_valid``: the run's
        prompts; catalog.measuring.ablation.mean_population)."""
        n_ops = 4 if kind == "grid" else len(self.operators)  # grid: all four operators
        side = self.operand_hi - self.operand_lo
        whole = n_ops * side * side if kind == "grid" else n_valid
        # a cap takes an equal share per operator (an operator with fewer gives them all)
        return min(whole, n_ops * -(-cap // n_ops)) if cap else whole

    def torch_dtype(self):
        """The torch dtype of ``dtype``."""
        import torch

        return getattr(torch, self.dtype)

    def precision_caveat(self) -> str | None:
        """Why this request's exact effects cannot be trusted at its dtype, or None. In
        bfloat16 or float16 a patched forward rounds differently all the way down, and that
        rounding swamps all but the largest effects (docs/real-models.md, "bfloat16 against
        float32")."""
        if self.dtype == "float32" or "exact" not in self.patching or self.exact == "none":
            return None
        return (f"exact patching in {self.dtype} is rounding noise for all but the largest "
                "effects (measured on Qwen2.5-Coder-0.5B, every neuron, against float32: "
                "top-50 overlap 0-7 of 50 in layers 0-13, median |effect| of early layers "
                "up to 490x too large); use --dtype float32 for effects you will read, "
                "bfloat16 only to save memory or time on grids and attribution")

    def scores_bottom(self, gated_mlp: bool) -> bool:
        """Whether the bottom of each map is scored too: ``score_bottom`` always or never,
        or (auto) for gated MLPs, whose activations are signed."""
        if self.score_bottom == "auto":
            return bool(gated_mlp)
        return self.score_bottom == "always"

    def exact_top(self) -> int | None:
        """N of ``exact = top:N``; None for all or none (ValueError if malformed)."""
        if self.exact in ("all", "none"):
            return None
        head, _, n = self.exact.partition(":")
        if head != "top" or not n.isdigit() or int(n) < 1:
            raise ValueError(f"exact must be all, none or top:N with N >= 1, got {self.exact!r}")
        return int(n)

    def full_grid_top(self) -> int | None:
        """How many grids per layer and operator are stored in full: None for all, 0 for
        none, else N of ``top:N`` (ValueError if malformed)."""
        if self.full_grids == "all":
            return None
        if self.full_grids == "none":
            return 0
        head, _, n = self.full_grids.partition(":")
        if head != "top" or not n.isdigit() or int(n) < 1:
            raise ValueError(f"full_grids must be all, none or top:N with N >= 1, "
                             f"got {self.full_grids!r}")
        return int(n)

    def prompt_text(self, a: int, op: str, b: int) -> str:
        """The template written out for one cell (without prefix)."""
        return self.template.format(a=a, op=op, b=b, op_word=OP_WORDS[op])

    # ------------------------------------------------------------ provenance

    def as_dict(self) -> dict:
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, tuple):
                d[k] = list(v)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> ScienceConfig:
        """The config stored as JSON. Keys of configs stored before the execution split,
        which never changed a number, are ignored; fields a stored config predates take
        the value that config meant (``LEGACY_SCIENCE``: the paper's rules), not today's
        default."""
        d = {k: v for k, v in d.items() if k not in LEGACY_EXECUTION_KEYS}
        d = {**{k: v for k, v in LEGACY_SCIENCE.items() if k not in d}, **d}
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown measurement config keys: {sorted(unknown)}")
        return cls(**d)

    def config_hash(self) -> str:
        """SHA-256 of the canonical JSON of this config and the catalog version."""
        blob = json.dumps({"config": self.as_dict(), "catalog": CATALOG_VERSION},
                          sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()

    def check_tokens(self, numbers: NumberTokens) -> None:
        """Refuse operand ranges the tokenizer cannot write as single tokens.

        Digit-level tokenizers have no such limit: operands become several tokens.
        """
        if numbers.digit_level:
            return
        if self.operand_hi - 1 > numbers.limit:
            raise ValueError(
                f"operand range [{self.operand_lo}, {self.operand_hi}) exceeds this tokenizer's "
                f"single-token limit {numbers.limit}; use operand_hi <= {numbers.limit + 1}"
            )

    def modulo_bases(self) -> tuple[int, ...]:
        """Moduli of the modulo heuristics for this variant."""
        if self.heuristic_variant == "paper":
            return (2, 3, 4, 5, 6, 7, 8, 9, 11, 13, 15)
        return tuple(range(2, 11))


# the device types torch names, with an optional index (cuda:1)
DEVICE = re.compile(r"^(cpu|cuda|mps|xpu|hpu|npu)(:\d+)?$")


@dataclass(frozen=True)
class ExecutionConfig:
    """How the work runs. Never hashed: each changes speed and memory, not the numbers."""

    batch_size: int = _opt(4096, "prompts per forward pass (lower it on a small GPU)")
    patch_chunk: int = _opt(64, "neurons patched together in one batched forward (at most: "
                                "halved where the run would not fit the memory budget)")
    device: str = _opt("cpu", "torch device of the forward passes: cpu, cuda, cuda:1, ...",
                       form=True)
    activation_budget: int = _opt(
        2 * 1024**3, "bytes of activations one grid pass may keep; over it, each layer's "
                     "grid is computed when the layer runs and dropped once it is done (also "
                     "where keeping them would not fit the memory budget)")
    memory_budget: int = _opt(
        0, "bytes of host memory a run may use; over it, the patch chunk and the activations "
           "kept are lowered, and a request that still does not fit is refused before loading "
           "(0: NCAT_MEMORY_BUDGET, such as 12G, else the memory available)")
    k_explanations: bool = _opt(
        False, "also the held-out explanations of each explained neuron's K map (stored "
               "beside the KV map's; they decide no label, and cost about 8% of a demo "
               "checkpoint; off: NULL in map_explanation's K columns)")

    def __post_init__(self) -> None:
        for name in ("batch_size", "patch_chunk"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.activation_budget < 0:
            raise ValueError(f"activation_budget must be >= 0, got {self.activation_budget}")
        if self.memory_budget < 0:
            raise ValueError(f"memory_budget must be >= 0, got {self.memory_budget}")
        if not self.device:
            raise ValueError("device is empty; use cpu, cuda or cuda:N")
        if not DEVICE.match(self.device):  # torch.device raised a RuntimeError (a traceback)
            raise ValueError(f"device {self.device!r} is not a torch device; use cpu, cuda, "
                             "cuda:N, mps or xpu")

# the catalog's packages this one may import; tests/unit/test_layers.py fails on any
# import of another
MAY_IMPORT: tuple[str, ...] = ("core",)
