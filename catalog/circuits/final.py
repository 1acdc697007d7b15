"""The final checkpoint's circuit, measured at an earlier checkpoint (docs/training.md).

Does the mechanism a trained model ends with already explain it earlier in training? The
heuristics paper follows Pythia-6.9B's circuit neurons across checkpoints; the catalog
measures it directly: at each catalogued checkpoint it builds the circuit of the FINAL
checkpoint (its neuron ranking, its kept heads, its first heuristics layer and so its
pruned layers; protocol ``paper``) and measures that circuit's faithfulness on THIS
checkpoint's model, prompts and mean activations, at the same sizes as the checkpoint's
own circuit. Its control is a random circuit under the same plan (the final circuit's
heads and pruned layers, random neurons of those layers), so the comparison keeps every
structure except which neurons were chosen. The model and empty-circuit baselines are the
checkpoint's own (the same prompts, the same empty circuit), stored with its own curve.

A checkpoint's own circuit is always at least as faithful as the final one at the same
size only in expectation: both are rankings, neither is the optimum. Where the final
circuit reaches the own circuit's faithfulness, the final mechanism is already there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from catalog.circuits.paper import CircuitPlan
from catalog.measuring.ablation import Circuit

PROTOCOL = "paper"  # the protocol whose final circuit is carried back in training
KINDS = ("ranked", "random")  # what is measured of it: the reversed control is not


@dataclass
class FinalCircuit:
    """The final checkpoint's circuit per operator: enough to rebuild it on any checkpoint
    of the same model (same shape)."""

    step: int | None  # the final checkpoint's step
    plans: dict[str, CircuitPlan] = field(default_factory=dict)  # op -> its plan

    @classmethod
    def from_curves(cls, curves, step: int | None) -> FinalCircuit:
        """From a summary's ``CurveResult``s (the final checkpoint's own curves)."""
        return cls(step, {c.op: c.plan for c in curves if c.protocol == PROTOCOL})

    @classmethod
    def from_stored(cls, step: int | None, shape: tuple[int, int, int],
                    rows: dict[str, dict]) -> FinalCircuit:
        """From what the store keeps: ``shape`` = (n_layers, n_heads, d_mlp); ``rows``: op
        -> {"score": (n_layers, d_mlp) ranking, largest first (-inf where unmeasured),
        "heads": [[layer, head], ...] kept, "pruned": [...], "whole": [...],
        "late_from", "late_source"} (circuit_summary's columns)."""
        n_layers, n_heads, d_mlp = shape
        plans = {}
        for op, r in rows.items():
            score = np.asarray(r["score"], dtype=np.float64)
            if score.shape != (n_layers, d_mlp):
                raise ValueError(f"the final circuit's ranking for {op!r} has shape "
                                 f"{score.shape}, the model needs {(n_layers, d_mlp)}")
            heads = np.zeros((n_layers, n_heads), dtype=bool)
            for layer, head in r["heads"]:
                heads[int(layer), int(head)] = True
            empty = Circuit(np.zeros((n_layers, d_mlp), dtype=bool),
                            np.zeros((n_layers, n_heads), dtype=bool))
            plans[op] = CircuitPlan(PROTOCOL, heads, [int(x) for x in r["pruned"]],
                                    [int(x) for x in r["whole"]], score, empty,
                                    r.get("late_from"), r.get("late_source"))
        return cls(step, plans)

    def check(self, n_layers: int, n_heads: int, d_mlp: int) -> None:
        """Refuse a final circuit of another model's shape, naming what differs."""
        for op, p in self.plans.items():
            if p.score.shape != (n_layers, d_mlp) or p.heads.shape != (n_layers, n_heads):
                raise ValueError(
                    f"the final circuit ({op!r}, step {self.step}) has {p.score.shape[0]} "
                    f"layers x {p.score.shape[1]} neurons and {p.heads.shape[1]} heads per "
                    f"layer; this model has {n_layers} x {d_mlp} and {n_heads}")
