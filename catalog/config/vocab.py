"""The config's vocabulary: the choices each field accepts, the named prompt templates,
and what configs stored before a field existed meant (``LEGACY_SCIENCE``)."""

from __future__ import annotations

HEURISTIC_VARIANTS = ("paper", "code")
BOTTOM_MODES = ("auto", "always", "never")
PATCHING_METHODS = ("exact", "attribution")
LABEL_RULES = ("values", "significant", "paper")
NULL_STRATA = ("digits", "none")
RANK_STATISTICS = ("trimmed", "median", "mean")
RANK_SIGNS = ("abs", "signed")
DTYPES = ("float32", "bfloat16", "float16")
# Named templates: --template NAME stores the text. {op_word} writes the operator as a word.
TEMPLATES = {
    "bare": "{a}{op}{b}=",
    "spaced": "{a} {op} {b} =",
    "qa": "Q: How much is {a} {op_word} {b}? A:",
    "question": "What is {a} {op_word} {b}? Answer:",
}
OP_WORDS = {"+": "plus", "-": "minus", "*": "times", "/": "divided by"}
# the heuristic families a config scores unless told (each family is defined in
# catalog.labels.families, which says which exist; a new family is opted into with
# --families, so adding one moves no stored config's hash)
DEFAULT_FAMILIES = ("range", "modulo", "pattern", "identical", "value", "multi_result")
# circuits and faithfulness (catalog.circuits.paper, catalog.measuring.ablation;
# docs/method.md section 6)
PROTOCOLS = ("paper", "all-layers", "counterfactual")
RANKINGS = ("auto", "attribution", "rank")
CONTEXTS = ("prompt", "all")
POPULATIONS = ("grid", "valid")
# prompt positions that component effects patch: the last token of the first operand, of
# the operator and of the second operand, and the last position
ROLES = ("op1", "op", "op2", "last")
MIB_FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
# keys that configs stored before the split carried; they never changed a number
LEGACY_EXECUTION_KEYS = ("batch_size", "patch_chunk")
# What configs stored before these fields existed meant: the paper's rules, no shots.
LEGACY_SCIENCE = {"shots": 0, "shot_separator": "\n", "exact": "all", "rank_statistic": "mean",
                  "rank_sign": "signed", "label_rule": "paper", "significance_level": 0.05,
                  "families": ["range", "modulo", "pattern", "identical", "multi_result"],
                  # before 0.3.0 every score >= the floor was stored, in float32
                  "scores_per_family": 0, "dtype": "float32",
                  # before 0.4.0 every grid was stored at full resolution
                  "full_grids": "all",
                  # before 0.5.0: the all-layers protocol only, one draw of prompts, no
                  # component effects
                  "faithfulness_protocols": ["all-layers"], "faithfulness_seeds": 1,
                  "circuit_counts": "none", "component_positions": [], "late_from": "auto",
                  "heads_kept": "auto", "circuit_ranking": "rank", "mean_population": "valid",
                  "mean_prompts": 0, "ablate_context": "prompt",
                  "component_exact_heads": "all",
                  # before 0.6.0: every heuristic scored, duplicates of a cell set included
                  "dedupe_heuristics": False, "null_strata": "digits"}

# the explanation columns of neuron_op (catalog.labels.operand_fit; migration 0025), K map then KV
# map (held-out R^2 each), and which operator's result fit best beside this one's
FIT_COLS = ("fit_operands", "fit_result", "fit_joint", "fit_other",
            "kv_fit_operands", "kv_fit_result", "kv_fit_joint", "kv_fit_other")
FIT_OP_COLS = ("fit_other_op", "kv_fit_other_op")

# a factor with more values than this (op1 * op2 on a large grid) is fit by this many bins
# of its values (consecutive values by rank), so its normal equations stay small
MAX_LEVELS = 1024
# folds of the held-out fits (catalog.labels.fit_models); every cell of one unordered operand
# pair in the same fold
FOLDS = 5
# the held-out models of the operands with one label's set that an operator's fit keeps for
# the next checkpoint (``catalog.labels.rival_rule.set_model``), at most this many bytes
SET_MODELS_BYTES = 64 << 20
