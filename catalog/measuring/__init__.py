"""Measuring a model on arithmetic prompts: the prompts and counterfactual pairs
(``prompts``), every neuron's activations (``grids``, on keys and values kept by
``kv_cache``), the logit lens (``lens``), exact and attribution patching (``patching``,
``single_position``, ``effects``), ablated forward passes (``ablation``), the effects of
heads and whole MLP layers (``components``), and the memory a request needs (``memory``).

May import ``catalog.core`` and ``catalog.config``."""

# the catalog's packages this one may import; tests/unit/test_layers.py fails on any
# import of another
MAY_IMPORT: tuple[str, ...] = ("core", "config")
