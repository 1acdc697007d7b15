"""One checkpoint, measured: ``CheckpointRun`` (``checkpoint``) runs every layer and the
summary for every driver, its results (``results``), the checkpoint-level summary
(``summarize``) and ``measure`` for notebooks (``measurement``).

The top of the catalog: may import every other package of it."""
