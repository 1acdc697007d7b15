"""The measurement configuration: every choice that changes a stored number.

A config is validated when built (bad values raise ``ValueError`` naming the field
and what would be right) and hashes deterministically, so that the same model,
checkpoint and config always name the same catalog rows (method.md, Provenance).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields

from catalog.arith import OPERATORS
from catalog.tokens import NumberTokens

CATALOG_VERSION = "0.1.0"

HEURISTIC_VARIANTS = ("paper", "code")
BOTTOM_MODES = ("auto", "always", "never")
PATCHING_METHODS = ("exact", "attribution")
# how the work is batched, not what is measured (see MeasureConfig)
EXECUTION_FIELDS = ("batch_size", "patch_chunk")


@dataclass(frozen=True)
class MeasureConfig:
    """What to measure and how (see method.md for each quantity).

    operators: subset of + - * /.
    operand_lo, operand_hi: operands a, b range over [lo, hi) (paper: [0, 300)).
    template: prompt text with {a}, {op}, {b}; few_shot: text put before it.
    pairs_per_op: counterfactual pairs per operator for patching (paper: ~100).
    seed: seeds pair sampling and every other random choice.
    patching: which patching methods to run ("exact", "attribution").
    heuristic_variant: "paper" (modulo n in 2..9, 11, 13, 15; Algorithm 1 for
        patterns) or "code" (modulo n in 2..10; patterns counted among the top-K).
    score_floor: heuristic scores below it are not returned.
    match_threshold: score from which a neuron "implements" a heuristic (paper: 0.6);
        used by knockouts and summaries, analysts may choose another in SQL.
    score_bottom: also score bottom-k of each map: "auto" (gated MLPs only),
        "always" or "never".
    lens_top_k: top and bottom tokens kept per neuron from the full-vocabulary lens.
    circuit_fractions: circuit sizes (share of each layer's neurons) for the
        faithfulness curve.
    faithfulness_prompts: correct prompts per operator used for faithfulness and
        knockouts.
    knockout_neurons: N of the prompt knockout (neurons per layer).
    top_set_fraction: share of each layer's neurons (by effect) that the knockouts draw
        from: the "top set" of method.md section 8.
    pattern_top_k: K of the released code's pattern counting (variant "code").
    multi_result_top: top cells examined by the multi-result heuristic (/ only).
    batch_size: prompts per forward pass.
    patch_chunk: neurons patched together in one batched forward.

    batch_size and patch_chunk (EXECUTION_FIELDS) only trade memory for speed: every
    number measured is the same up to float rounding, so they are left out of the hash
    and a worker may choose its own (NCAT_BATCH_SIZE, NCAT_PATCH_CHUNK).
    """

    operators: tuple[str, ...] = OPERATORS
    operand_lo: int = 0
    operand_hi: int = 300
    template: str = "{a}{op}{b}="
    few_shot: str = ""
    pairs_per_op: int = 100
    seed: int = 0
    patching: tuple[str, ...] = PATCHING_METHODS
    heuristic_variant: str = "paper"
    score_floor: float = 0.3
    match_threshold: float = 0.6
    score_bottom: str = "auto"
    lens_top_k: int = 10
    circuit_fractions: tuple[float, ...] = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
    faithfulness_prompts: int = 200
    knockout_neurons: int = 10
    top_set_fraction: float = 0.05
    pattern_top_k: int = 100
    multi_result_top: int = 50
    batch_size: int = 4096
    patch_chunk: int = 64

    def __post_init__(self) -> None:
        # tuples keep the config hashable and its JSON stable, even if lists were passed
        for name in ("operators", "patching", "circuit_fractions"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if not self.operators:
            raise ValueError("operators is empty; choose at least one of + - * /")
        for op in self.operators:
            if op not in OPERATORS:
                raise ValueError(f"unknown operator {op!r} in operators; choose from + - * /")
        if len(set(self.operators)) != len(self.operators):
            raise ValueError(f"operators has duplicates: {self.operators}")
        if self.operand_lo < 0:
            raise ValueError(f"operand_lo must be >= 0, got {self.operand_lo}")
        if self.operand_hi <= self.operand_lo + 1:
            raise ValueError(
                f"operand range [{self.operand_lo}, {self.operand_hi}) is empty or a single "
                "number; operand_hi must exceed operand_lo + 1"
            )
        for key in ("{a}", "{op}", "{b}"):
            if key not in self.template:
                raise ValueError(f"template {self.template!r} lacks {key}")
        if self.pairs_per_op < 1:
            raise ValueError(f"pairs_per_op must be >= 1, got {self.pairs_per_op}")
        if not self.patching or any(m not in PATCHING_METHODS for m in self.patching):
            raise ValueError(
                f"patching must be a non-empty subset of {PATCHING_METHODS}, got {self.patching}"
            )
        if self.heuristic_variant not in HEURISTIC_VARIANTS:
            raise ValueError(
                f"heuristic_variant must be one of {HEURISTIC_VARIANTS}, "
                f"got {self.heuristic_variant!r}"
            )
        if self.score_bottom not in BOTTOM_MODES:
            raise ValueError(
                f"score_bottom must be one of {BOTTOM_MODES}, got {self.score_bottom!r}")
        for name in ("score_floor", "match_threshold"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {v}")
        if not 0 < self.top_set_fraction <= 1:
            raise ValueError(f"top_set_fraction must be in (0, 1], got {self.top_set_fraction}")
        if not self.circuit_fractions or any(not 0 < f <= 1 for f in self.circuit_fractions):
            raise ValueError(f"circuit_fractions must be in (0, 1], got {self.circuit_fractions}")
        for name in ("lens_top_k", "faithfulness_prompts", "knockout_neurons", "pattern_top_k",
                     "multi_result_top", "batch_size", "patch_chunk"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    # ------------------------------------------------------------ provenance

    def as_dict(self) -> dict:
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, tuple):
                d[k] = list(v)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> MeasureConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown measurement config keys: {sorted(unknown)}")
        return cls(**d)

    def config_hash(self) -> str:
        """SHA-256 of the canonical JSON of this config (less the execution fields) and the
        catalog version."""
        config = {k: v for k, v in self.as_dict().items() if k not in EXECUTION_FIELDS}
        blob = json.dumps({"config": config, "catalog": CATALOG_VERSION}, sort_keys=True)
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
