"""The foundations every other part of the catalog stands on: arithmetic ground truth
(``arith``), how numbers become tokens (``tokens``, ``token_format``), the KV map's
definition (``maps``), every statistic (``stats``), weight fingerprints (``weights``) and
progress for long work (``progress``).

Imports nothing from the catalog outside this package; no torch at import."""

# the catalog's packages this one may import; tests/unit/test_layers.py fails on any
# import of another
MAY_IMPORT: tuple[str, ...] = ()
