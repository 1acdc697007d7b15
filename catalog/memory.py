"""Memory as a budget: a request's peak host (and GPU) memory, estimated from the model's
shape before any weight is loaded, and the budget it must fit (docs/memory.md).

The estimate is a sum of parts, each an upper bound of what the code holds at once,
with the load's factor measured on real models:

- the process itself: Python with torch, transformers and TransformerLens imported
  (466 MB measured on this project's CPU machine);
- loading: every source reads the weights in float32 and converts them; at the peak a
  processing step's input and its full copy are alive together (the transformers model
  has given up its weights by then: ``catalog.sources.hf.load_processed``). Measured peak
  over the float32 weights: 2.3x for Qwen2.5-Coder-0.5B from its GGUF (5.91 GiB with the
  process for 2.35 GiB; 4.1x before the loader freed its source); LOAD_FACTOR keeps a
  margin over it;
- measuring: the weights in the run's dtype, the grid's activations (all layers when
  they fit the activation budget, else one layer's), one layer's matching work, and
  exact patching's batched forwards with their key/value caches and logits.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

GIB = 1024**3

PROCESS_BYTES = 640 * 1024**2  # imports (466 MB measured) and the interpreter's own growth

# peak while loading, in float32 weights (TransformerLens' count, untied unembedding)
LOAD_FACTOR = {"gguf": 3.0, "hub": 3.0, "local": 3.0, "builtin": 3.0}

# one layer's matching work over its maps: activations, ranks, sorted copies, scores
LAYER_COPIES = 6

_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1024, "kib": 1024, "m": 1024**2, "mb": 1024**2,
          "mib": 1024**2, "g": GIB, "gb": GIB, "gib": GIB, "t": 1024**4, "tb": 1024**4,
          "tib": 1024**4}


class MemoryBudgetError(ValueError):
    """A request whose estimated peak memory is over the budget (nothing was loaded)."""


def parse_bytes(text: str | int, what: str = "NCAT_MEMORY_BUDGET") -> int:
    """``12G``, ``512M``, ``1.5GiB`` or a plain number of bytes (binary units)."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"{what} must be a size such as 12G, 512M or 8000000000 bytes, "
                         f"got {text!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def available_memory() -> int:
    """The host memory available now (MemAvailable; the physical memory where that
    cannot be read)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def memory_budget(explicit: int = 0) -> tuple[int, str]:
    """(bytes, where the number came from): ``explicit`` (a flag) when > 0, else
    NCAT_MEMORY_BUDGET, else the memory available on this machine now."""
    if explicit > 0:
        return explicit, "--memory-budget"
    from catalog.settings import get_settings

    env = (get_settings().ncat_memory_budget or "").strip()
    if env:
        return parse_bytes(env), "NCAT_MEMORY_BUDGET"
    return available_memory(), "the memory available on this machine"


@dataclass(frozen=True)
class Footprint:
    """A model's shape as far as memory goes (read from its config, no weights)."""

    source: str  # gguf, hub, local, builtin
    n_params: int  # as TransformerLens holds them (a tied embedding counted twice)
    n_layers: int
    d_model: int
    d_mlp: int
    d_vocab: int


@dataclass
class MemoryEstimate:
    host_peak: float
    gpu_peak: float  # 0 on the CPU
    parts: dict[str, float] = field(default_factory=dict)  # bytes by what holds them

    def render(self) -> str:
        lines = [f"{'memory':<34}{'peak':>12}"]
        for name, b in self.parts.items():
            lines.append(f"{name:<34}{_gib(b):>12}")
        lines.append(f"{'host peak':<34}{_gib(self.host_peak):>12}")
        if self.gpu_peak:
            lines.append(f"{'GPU peak':<34}{_gib(self.gpu_peak):>12}")
        return "\n".join(lines)


def _gib(b: float) -> str:
    return f"{b / GIB:.2f} GiB"


def dtype_bytes(dtype: str) -> int:
    return {"float32": 4, "float16": 2, "bfloat16": 2}.get(dtype, 4)


def estimate_memory(fp: Footprint, *, prompts: int, n_layers: int, pairs: int,
                    n_ctx: int, dtype: str, device: str, batch_size: int, patch_chunk: int,
                    activation_budget: int, exact: bool) -> MemoryEstimate:
    """The peak of a measure of ``n_layers`` layers over ``prompts`` prompts with
    ``pairs`` counterfactual pairs per operator at most, prompts ``n_ctx`` tokens long."""
    w32 = fp.n_params * 4.0
    w_run = fp.n_params * float(dtype_bytes(dtype))
    load = LOAD_FACTOR.get(fp.source, max(LOAD_FACTOR.values())) * w32
    grid_all = float(prompts) * n_layers * fp.d_mlp * 4
    acts = grid_all if grid_all <= activation_budget else float(prompts) * fp.d_mlp * 4
    layer = LAYER_COPIES * float(prompts) * fp.d_mlp * 4
    # a batched forward: the residual stream and the MLP's hidden layer of every token
    forward = float(min(batch_size, prompts)) * n_ctx * (4 * fp.d_model + 2 * fp.d_mlp) * 4
    # exact patching: chunk x pairs single-position rows over every later block (with the
    # pairs' key/value caches) and the logits of the vocabulary
    patch = 0.0
    if exact:
        rows = float(patch_chunk) * pairs
        cache = float(pairs) * n_ctx * fp.n_layers * 2 * fp.d_model * 4
        patch = rows * (fp.d_vocab + 4 * fp.d_model + 2 * fp.d_mlp) * 4 + cache
    on_gpu = device.startswith("cuda")
    parts = {"process (Python, torch imported)": float(PROCESS_BYTES),
             "loading (float32, converted)": load}
    run = acts + layer + (0.0 if on_gpu else w_run + forward + patch)
    parts["measuring (host)"] = run
    host = PROCESS_BYTES + max(load, run)
    gpu = w_run + forward + patch if on_gpu else 0.0
    if on_gpu:
        parts["GPU: weights, forwards, patching"] = gpu
    return MemoryEstimate(host_peak=host, gpu_peak=gpu, parts=parts)


def check_budget(est: MemoryEstimate, budget: int, where: str, what: str) -> None:
    """MemoryBudgetError naming the need, the budget and where it came from."""
    if est.host_peak > budget:
        raise MemoryBudgetError(
            f"{what} needs about {_gib(est.host_peak)} of host memory at its peak, over the "
            f"budget of {_gib(budget)} ({where}); nothing was loaded. Measure fewer layers "
            f"or operands, lower --activation-budget, or raise the budget "
            f"(NCAT_MEMORY_BUDGET=24G or --memory-budget).\n{est.render()}")


def request_memory(shape, config, execution, n_layers: int) -> MemoryEstimate | None:
    """The estimate of measuring ``n_layers`` layers of a model whose ModelShape is
    ``shape`` with ``config`` and ``execution``; None where the source gave no footprint."""
    import numpy as np

    from catalog.arith import is_valid
    from catalog.prompts import UNLIMITED, longest_prompt

    fp = shape.footprint
    if fp is None:
        return None
    numbers = shape.numbers
    limit = UNLIMITED if numbers.digit_level else numbers.limit
    r = np.arange(config.operand_lo, config.operand_hi)
    a, b = (x.reshape(-1) for x in np.meshgrid(r, r, indexing="ij"))
    prompts = sum(int(is_valid(op, a, b, limit).sum()) for op in config.operators)
    n_ctx = (longest_prompt(shape.tokenizer, numbers, config) if shape.tokenizer is not None
             else shape.n_ctx or 64)
    return estimate_memory(
        fp, prompts=prompts, n_layers=n_layers, pairs=config.pairs_per_op, n_ctx=n_ctx,
        dtype=config.dtype, device=execution.device, batch_size=execution.batch_size,
        patch_chunk=execution.patch_chunk, activation_budget=execution.activation_budget,
        exact="exact" in config.patching)


def check_request(shape, config, execution, n_layers: int, what: str) -> MemoryEstimate | None:
    """Refuse (MemoryBudgetError) a request whose estimated host peak is over the budget
    (execution.memory_budget, NCAT_MEMORY_BUDGET or the memory available now)."""
    est = request_memory(shape, config, execution, n_layers)
    if est is not None:
        budget, where = memory_budget(execution.memory_budget)
        check_budget(est, budget, where, what)
    return est
