"""Periodic structure of neuron maps (docs/method.md section 11): spectra and the helix fit
(``spectra``), each map's profile along an axis and the null of the other operands'
effects (``profiles``), and the guard against smooth maps (``guard``).

May import ``catalog.core`` and ``catalog.config``."""
