"""Periodic structure of neuron maps (docs/method.md section 11): spectra and the helix fit
(``spectra``), each map's profile along an axis and the null of the other operands'
effects (``profiles``), and the guard against smooth maps (``guard``).

May import ``catalog.core`` and ``catalog.config``."""

# the catalog's packages this one may import; tests/unit/test_layers.py fails on any
# import of another
MAY_IMPORT: tuple[str, ...] = ("core", "config")
