"""One call measures a checkpoint in memory: ``measure(model, tokenizer, config)``.

It returns plain arrays and records and touches no database: activation grids, logit
lens, exact and attribution patching effects and heuristic scores per layer, and the
checkpoint summary (accuracy, faithfulness curve, knockouts). It is the simplest
driver of ``catalog.run.checkpoint.CheckpointRun``, which ``ncat catalog`` and the workers
drive too.
"""

from __future__ import annotations

from transformer_lens import HookedTransformer

from catalog.config import ExecutionConfig, ScienceConfig
from catalog.run.checkpoint import (
    CheckpointResult,
    CheckpointRun,
    LayerResult,
    Summary,
    check_layers,
)

__all__ = ["CheckpointResult", "LayerResult", "Summary", "check_layers", "measure"]


def measure(
    model: HookedTransformer,
    tokenizer,
    config: ScienceConfig | None = None,
    layers: list[int] | None = None,
    progress: bool = True,
    summary: bool = True,
    provenance: dict | None = None,
    execution: ExecutionConfig | None = None,
) -> CheckpointResult:
    """Measure every neuron of ``layers`` (default all) and the summary over those layers."""
    run = CheckpointRun(model, tokenizer, config or ScienceConfig(),
                        execution or ExecutionConfig(), layers).prepare(progress=progress)
    out = run.run_all(keep=True, summary=summary, progress=progress)
    return CheckpointResult(run.config, run.numbers, run.table, out.results, out.summary,
                            run.provenance(provenance))
