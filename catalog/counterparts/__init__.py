"""Counterparts of neurons across runs (issue 83): whether a neuron of one model or
checkpoint has one in another that computes the same function on the same prompts
(``match``: each neuron's activations over a grid of cells as its profile, the
correlation of two profiles as their similarity, one-to-one and best matches, and a null
from an unrelated model that says when a similarity is more than chance).

May import ``catalog.core``, ``catalog.config`` and ``catalog.measuring``."""

# the catalog's packages this one may import; tests/unit/test_layers.py fails on any
# import of another
MAY_IMPORT: tuple[str, ...] = ("core", "config", "measuring")
