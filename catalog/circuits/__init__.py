"""Circuits and what they keep of the answer (docs/method.md sections 6 and 8): circuits
as the heuristics paper builds them and their faithfulness curves (``paper``), the
well-conditioned faithfulness statistics (``faithfulness``) and the heuristic and prompt
knockouts (``knockouts``).

May import ``catalog.core``, ``catalog.config``, ``catalog.measuring`` and
``catalog.labels``."""

# the catalog's packages this one may import; tests/unit/test_layers.py fails on any
# import of another
MAY_IMPORT: tuple[str, ...] = ("core", "config", "measuring", "labels")
