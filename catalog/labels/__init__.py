"""Heuristic labels of neuron maps (docs/method.md section 7): the heuristic families, one
object each (``families``), the heuristics (``heuristics``), Algorithm 1's scores
(``matching``, ``matches``), the label rule's tests (``significance``, ``value_null``
and its exact ``tails``), whether a result label says more than the operands
(``operand_fit``, its ``additive`` fit, ``fit_models``, kept on disk by
``fit_store``), one operator's labels end to
end (``operator_labels``), and whether important neurons are labelled more often
(``enrichment``).

May import ``catalog.core``, ``catalog.config`` and ``catalog.measuring``."""

# the catalog's packages this one may import; tests/unit/test_layers.py fails on any
# import of another
MAY_IMPORT: tuple[str, ...] = ("core", "config", "measuring")
