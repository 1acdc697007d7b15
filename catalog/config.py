"""Measurement configuration: what is measured (hashed) apart from how it is run (not).

``ScienceConfig`` holds every choice that changes a stored number. It is validated
when built (bad values raise ``ValueError`` naming the field and what would be
right) and hashes deterministically, so that the same model, checkpoint and config
always name the same catalog rows (docs/method.md, "Provenance").

``ExecutionConfig`` holds how the work is batched and where it runs (batch sizes,
device, activation budget). Every measured number is the same up to float rounding
whatever it says, so it is never hashed or stored, and each worker may choose its own.

Each field's metadata carries its help text (and, where it differs from
``--field-name``, its command-line flag): the ``ncat`` flags and the explorer's job
form are generated from it (``catalog.config_fields``), so each default and its
help text live in exactly one place.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields

from catalog.arith import OPERATORS
from catalog.tokens import NumberTokens

CATALOG_VERSION = "0.1.0"

HEURISTIC_VARIANTS = ("paper", "code")
BOTTOM_MODES = ("auto", "always", "never")
PATCHING_METHODS = ("exact", "attribution")
# keys that configs stored before the split carried; they never changed a number
LEGACY_EXECUTION_KEYS = ("batch_size", "patch_chunk")


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
    template: str = _opt("{a}{op}{b}=", "prompt text with {a}, {op} and {b}")
    few_shot: str = _opt("", "text put before every prompt (solved examples)")
    pairs_per_op: int = _opt(100, "counterfactual pairs per operator for patching (paper: "
                                  "about 100)", flag="--pairs", form=True)
    seed: int = _opt(0, "seeds pair sampling and every other random choice", form=True)
    patching: tuple[str, ...] = _opt(
        PATCHING_METHODS, "patching methods, comma-separated: exact, attribution",
        kind="words")
    heuristic_variant: str = _opt(
        "paper", "'paper' (modulo n in 2..9, 11, 13, 15; Algorithm 1 for patterns) or "
        "'code' (the released code: modulo n in 2..10, patterns counted among the top K)",
        flag="--variant", form=True, choices=HEURISTIC_VARIANTS)
    score_floor: float = _opt(0.3, "heuristic scores below it are not stored")
    match_threshold: float = _opt(
        0.6, "score from which a neuron implements a heuristic (paper: 0.6); knockouts and "
             "summaries use it, analysts may choose another in SQL")
    score_bottom: str = _opt("auto", "also score the bottom-k of each map: auto (gated MLPs "
                                     "only), always or never", choices=BOTTOM_MODES)
    lens_top_k: int = _opt(10, "top and bottom vocabulary tokens kept per neuron's lens")
    circuit_fractions: tuple[float, ...] = _opt(
        (0.01, 0.02, 0.05, 0.1, 0.2, 0.5), "circuit sizes (share of each layer's neurons) "
        "of the faithfulness curve, comma-separated", kind="floats")
    faithfulness_prompts: int = _opt(200, "correct prompts per operator for faithfulness "
                                          "and knockouts")
    knockout_neurons: int = _opt(10, "N of the prompt knockout (neurons per layer)")
    top_set_fraction: float = _opt(0.05, "share of each layer's neurons (by effect) that "
                                         "the knockouts draw from (the top set)")
    pattern_top_k: int = _opt(100, "K of the released code's pattern counting "
                                   "(variant 'code')")
    multi_result_top: int = _opt(50, "top cells examined by the multi-result heuristic "
                                     "(/ only)")

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
                     "multi_result_top"):
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
    def from_dict(cls, d: dict) -> ScienceConfig:
        """The config stored as JSON (keys of configs stored before the execution split,
        which never changed a number, are ignored)."""
        d = {k: v for k, v in d.items() if k not in LEGACY_EXECUTION_KEYS}
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


# The former name: every stored config is a ScienceConfig.
MeasureConfig = ScienceConfig


@dataclass(frozen=True)
class ExecutionConfig:
    """How the work runs. Never hashed: each changes speed and memory, not the numbers."""

    batch_size: int = _opt(4096, "prompts per forward pass (lower it on a small GPU)")
    patch_chunk: int = _opt(64, "neurons patched together in one batched forward")
    device: str = _opt("cpu", "torch device of the forward passes: cpu, cuda, cuda:1, ...",
                       form=True)
    activation_budget: int = _opt(
        2 * 1024**3, "bytes of activations one grid pass may keep; over it, each layer's "
                     "grid is computed when the layer runs and dropped once it is done")

    def __post_init__(self) -> None:
        for name in ("batch_size", "patch_chunk"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.activation_budget < 0:
            raise ValueError(f"activation_budget must be >= 0, got {self.activation_budget}")
        if not self.device:
            raise ValueError("device is empty; use cpu, cuda or cuda:N")
