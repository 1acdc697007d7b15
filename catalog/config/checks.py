"""Validation of a ``ScienceConfig`` (its ``__post_init__``): each field against its
vocabulary (``catalog.config.vocab``) and the fields against each other, with errors that name
the field, the value and what is accepted."""

from __future__ import annotations

from typing import Any

from catalog.config.vocab import (
    BOTTOM_MODES,
    CONTEXTS,
    DTYPES,
    HEURISTIC_VARIANTS,
    LABEL_RULES,
    NULL_STRATA,
    PATCHING_METHODS,
    POPULATIONS,
    PROTOCOLS,
    RANK_SIGNS,
    RANK_STATISTICS,
    RANKINGS,
    ROLES,
    TEMPLATES,
)
from catalog.core.arith import OPERATORS

# The checks read a ``catalog.config.ScienceConfig`` by its field names; they take it as
# ``Any`` so this module need not import the one that imports it (no cycle, not even one
# for the type checker). tests/integration/test_cli_fuzz.py and the unit tests reach the
# checks through the class.
Science = Any


# fields whose value must be one of a vocabulary's: each refused as "NAME must be one of ..."
VOCABULARIES = (("rank_statistic", RANK_STATISTICS), ("rank_sign", RANK_SIGNS),
                ("label_rule", LABEL_RULES), ("null_strata", NULL_STRATA),
                ("heuristic_variant", HEURISTIC_VARIANTS), ("score_bottom", BOTTOM_MODES),
                ("dtype", DTYPES))
CIRCUIT_VOCABULARIES = (("circuit_ranking", RANKINGS), ("ablate_context", CONTEXTS),
                        ("mean_population", POPULATIONS))
# fields that must be at least 1, 0, or lie in [0, 1]
AT_LEAST_ONE = ("pairs_per_op", "lens_top_k", "faithfulness_prompts", "knockout_neurons",
                "pattern_top_k", "multi_result_top", "faithfulness_seeds")
AT_LEAST_ZERO = ("shots", "scores_per_family")
IN_UNIT = ("score_floor", "match_threshold")
TUPLES = ("operators", "patching", "circuit_fractions", "families", "faithfulness_protocols",
          "component_positions")


def check_science(self: Science) -> None:
    for name in TUPLES:
        object.__setattr__(self, name, tuple(getattr(self, name)))
    if self.component_positions == ("none",):  # how a command line says "no positions"
        object.__setattr__(self, "component_positions", ())
    _check_operands(self)
    _check_template(self)
    _check_bounds(self)
    _check_patching(self)
    _check_vocabularies(self, VOCABULARIES)
    _check_labels(self)
    _check_circuits(self)


def _check_operands(self: Science) -> None:
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


def _check_template(self: Science) -> None:
    if self.template in TEMPLATES:
        object.__setattr__(self, "template", TEMPLATES[self.template])
    for key in ("{a}", "{b}"):
        if key not in self.template:
            raise ValueError(f"template {self.template!r} lacks {key}")
    if "{op}" not in self.template and "{op_word}" not in self.template:
        raise ValueError(f"template {self.template!r} lacks {{op}} or {{op_word}}")
    try:
        self.template.format(a=1, b=2, op="+", op_word="plus")
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"template {self.template!r} has an unknown placeholder or a "
                         f"stray brace ({exc}); use {{a}}, {{b}}, {{op}}, {{op_word}}, "
                         "and {{ }} for literal braces") from None


def _check_bounds(self: Science) -> None:
    """Counts at least 1 or 0, shares in [0, 1]."""
    for names, low in ((AT_LEAST_ZERO, 0), (AT_LEAST_ONE, 1)):
        for name in names:
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be >= {low}, got {getattr(self, name)}")
    for name in IN_UNIT:
        v = getattr(self, name)
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {v}")


def _check_patching(self: Science) -> None:
    if not self.patching or any(m not in PATCHING_METHODS for m in self.patching):
        raise ValueError(
            f"patching must be a non-empty subset of {PATCHING_METHODS}, got {self.patching}"
        )
    if self.exact == "none":  # attribution only
        if self.patching == ("exact",):
            raise ValueError("exact is 'none' and patching is 'exact': nothing to measure; "
                             "use --patching attribution or both")
        object.__setattr__(self, "patching", ("attribution",))
    elif "exact" not in self.patching:
        object.__setattr__(self, "exact", "none")
    self.exact_top()  # validates the form
    self.full_grid_top()
    if self.exact.startswith("top:") and "attribution" not in self.patching:
        raise ValueError(f"exact {self.exact!r} picks neurons by |attribution|; use "
                         "--patching both")


def _check_vocabularies(self: Science, vocabularies) -> None:
    for name, allowed in vocabularies:
        if getattr(self, name) not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")


def _check_labels(self: Science) -> None:
    if not 0.0 < self.significance_level < 1.0:
        raise ValueError(f"significance_level must be in (0, 1), got "
                         f"{self.significance_level}")
    # which names exist is the families' registry's to say (catalog.labels.families:
    # check_names, asked wherever a config comes in and before any partition is built)
    bad = [f for f in self.families if not (isinstance(f, str) and f.isidentifier())]
    if bad or not self.families:
        raise ValueError(f"families {list(self.families)} must be a non-empty list of "
                         "family names")
    if not 0 < self.top_set_fraction <= 1:
        raise ValueError(f"top_set_fraction must be in (0, 1], got {self.top_set_fraction}")
    if not self.circuit_fractions or any(not 0 < f <= 1 for f in self.circuit_fractions):
        raise ValueError(f"circuit_fractions must be in (0, 1], got {self.circuit_fractions}")


def _check_circuits(self: Science) -> None:
    _check_protocols(self)
    _check_heads(self)
    _check_vocabularies(self, CIRCUIT_VOCABULARIES)
    if self.mean_prompts < 0:
        raise ValueError(f"mean_prompts must be >= 0, got {self.mean_prompts}")
    self.counts(1)  # validates the form
    _check_paper_protocols(self)


def _check_heads(self: Science) -> None:
    bad = [p for p in self.component_positions if p not in ROLES]
    if bad:
        raise ValueError(f"component_positions {bad} unknown; choose from {ROLES}")
    v = self.component_exact_heads
    if v not in ("auto", "all") and not v.isdigit():
        raise ValueError(f"component_exact_heads must be auto, all or a whole number, "
                         f"got {v!r}")
    for name, least in (("late_from", 0), ("heads_kept", 1)):
        v = getattr(self, name)
        if v != "auto" and not (v.isdigit() and int(v) >= least):
            raise ValueError(f"{name} must be auto or a whole number"
                             f"{' >= 1' if least else ''}, got {v!r}")


def _check_protocols(self: Science) -> None:
    bad = [p for p in self.faithfulness_protocols if p not in PROTOCOLS]
    if bad or not self.faithfulness_protocols:
        raise ValueError(f"faithfulness_protocols {list(self.faithfulness_protocols)} must "
                         f"be a non-empty subset of {PROTOCOLS}")
    if len(set(self.faithfulness_protocols)) != len(self.faithfulness_protocols):
        raise ValueError(f"faithfulness_protocols has duplicates: "
                         f"{list(self.faithfulness_protocols)}")


def _check_paper_protocols(self: Science) -> None:
    paper_like = [p for p in self.faithfulness_protocols if p != "all-layers"]
    if paper_like and not self.component_positions:
        raise ValueError(f"protocols {paper_like} pick heads and the first heuristics layer "
                         "from component effects; give component_positions (e.g. last)")
    if paper_like and self.circuit_ranking == "attribution" \
            and "attribution" not in self.patching:
        raise ValueError("circuit_ranking 'attribution' ranks neurons by attribution "
                         "patching; use --patching both or --circuit-ranking rank")
