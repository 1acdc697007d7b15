"""One checkpoint, measured: ``CheckpointRun`` (``checkpoint``) runs every layer and the
summary for every driver, its results (``results``), the checkpoint-level summary
(``summarize``) and ``measure`` for notebooks (``measurement``).

The top of the catalog: may import every other package of it."""

# the catalog's packages this one may import; tests/unit/test_layers.py fails on any
# import of another
MAY_IMPORT: tuple[str, ...] = (
    "core", "config", "measuring", "builtin", "sources", "labels", "periodic", "circuits",
    "explain")
