"""Memory as a budget: a request's peak host (and GPU) memory, estimated from the model's
shape before any weight is loaded, and the budget it must fit (docs/memory.md).

The estimate is a sum of parts, each an upper bound of what the code holds at once,
with the load's factor measured on real models:

- the process itself: Python with torch, transformers and TransformerLens imported
  (466 MB measured on this project's CPU machine);
- loading: every source reads the weights in float32 and converts them; each weight-
  processing step copies one tensor at a time, freeing its source as it goes
  (``catalog.sources.hf.load_processed``), and freed tensors go back to the system
  (``freed_memory_returned``). Measured peak over the float32 weights (the process
  apart), 2026-11-26: 1.42x for Qwen2.5-Coder-0.5B from its GGUF (3.78 GiB; the peak is
  transformers' dequantization, before any processing), 2.06x for a random 0.9 GiB Qwen 2
  from safetensors (half of it the file's pages, mapped and clean, freed only when every
  tensor of the file is: the whole file is one storage). LOAD_FACTOR keeps a margin;
- measuring: the weights in the run's dtype, the grid's activations (all layers when
  they fit the activation budget, else one layer's), one layer's matching work, and
  exact patching's batched forwards with their key/value caches and logits.
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, field

GIB = 1024**3

PROCESS_BYTES = 640 * 1024**2  # imports (466 MB measured) and the interpreter's own growth

# peak while loading, in float32 weights (TransformerLens' count, untied unembedding)
LOAD_FACTOR = {"gguf": 2.0, "hub": 3.0, "local": 3.0, "builtin": 3.0}

# a GGUF file loaded one tensor at a time (``sources.streaming``) holds the weights in
# the run's dtype and, until the end, the unembedding in float32; at its start, the
# embedding and unembedding group holds three float32 copies of the larger of the two.
# Measured (2026-11-26, over the process): Qwen2.5-Coder-0.5B 1.66 GiB in bfloat16
# (estimated 1.68 before the margin), 2.54 GiB in float32 (2.86)
STREAMED_MARGIN = 1.1


def streamed_load(fp: Footprint, dtype: str) -> float:
    """Peak bytes of a streamed GGUF load, beyond the process (see STREAMED_MARGIN)."""
    head32 = 4.0 * fp.d_vocab * fp.d_model
    return STREAMED_MARGIN * max(fp.n_params * float(dtype_bytes(dtype)) + head32,
                                 3 * head32)

# one layer's matching work over its maps: activations, ranks, sorted copies, scores,
# the value null's walks (the built-in model's default request, every layer: the matching
# phase peaked at 6.20 GiB, 4.3 GiB estimated with 6 copies; 2026-11-26), and the label
# rule's second pass (catalog.labels.operator_labels.rescued: the maps without a result label,
# their K maps and their residual beyond the operands, sorted again)
LAYER_COPIES = 15

_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1024, "kib": 1024, "m": 1024**2, "mb": 1024**2,
          "mib": 1024**2, "g": GIB, "gb": GIB, "gib": GIB, "t": 1024**4, "tb": 1024**4,
          "tib": 1024**4}


# glibc's mallopt parameter, and the thresholds set while loading and after it
_M_MMAP_THRESHOLD, _M_TRIM_THRESHOLD = -3, -1
_LOADING_MMAP_THRESHOLD = 1024**2
_AFTER_MMAP_THRESHOLD = 32 * 1024**2  # glibc's own ceiling of its sliding threshold


def _glibc():
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


@contextmanager
def freed_memory_returned():
    """While loading a model, give every freed tensor of 1 MiB or more back to the system.

    glibc raises its mmap threshold to the size of each large block freed (up to 32 MiB),
    after which blocks of that size come from the heap, whose holes stay resident. A
    loader that frees each source tensor as it copies it (``hf.load_processed``) then
    still grows: Qwen2.5-Coder-0.5B's load peaked at 4.29 GiB and kept 4.26 resident; with
    the threshold held at 1 MiB, 3.78 GiB (transformers' dequantization of the GGUF file)
    and 3.23 after. On leaving, the threshold is set to 32 MiB (where glibc's own sliding
    one ends) and the trim threshold to twice that, so that the run's forwards reuse heap
    blocks as they would have, and the heap is trimmed. Does
    nothing where the C library is not glibc."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(_M_MMAP_THRESHOLD, _LOADING_MMAP_THRESHOLD)
    try:
        yield
    finally:
        if libc is not None:
            libc.mallopt(_M_MMAP_THRESHOLD, _AFTER_MMAP_THRESHOLD)
            # as glibc's sliding thresholds would have it: the heap's top is given back
            # only past twice the mmap threshold, not after every large free
            libc.mallopt(_M_TRIM_THRESHOLD, 2 * _AFTER_MMAP_THRESHOLD)
            libc.malloc_trim(0)


def trim() -> None:
    """Give the heap's free pages back to the system (glibc's ``malloc_trim``): after a
    burst of small allocations, such as a GGUF file's metadata parsed into a hundred
    thousand small arrays, which otherwise stay resident. Does nothing elsewhere."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


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
    from catalog.config.settings import get_settings

    env = (get_settings().ncat_memory_budget or "").strip()
    if env:
        return parse_bytes(env), "NCAT_MEMORY_BUDGET"
    return available_memory(), "the memory available on this machine"


@dataclass(frozen=True)
class Footprint:
    """A model's shape as far as memory goes (read from its config, no weights)."""

    source: str  # gguf-streamed (one tensor at a time), gguf (whole), hub, local, builtin
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
                    activation_budget: int, exact: bool, labels: float = 0.0) -> MemoryEstimate:
    """The peak of a measure of ``n_layers`` layers over ``prompts`` prompts with
    ``pairs`` counterfactual pairs per operator at most, prompts ``n_ctx`` tokens long;
    ``labels``: the label rule's fits (``label_fit_bytes``), on the run's device."""
    w32 = fp.n_params * 4.0
    w_run = fp.n_params * float(dtype_bytes(dtype))
    if fp.source == "gguf-streamed":
        load = streamed_load(fp, dtype)
    else:
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
             ("loading (one tensor at a time)" if fp.source == "gguf-streamed"
              else "loading (float32, converted)"): load}
    run = acts + layer + (0.0 if on_gpu else w_run + forward + patch + labels)
    parts["measuring (host)"] = run
    host = PROCESS_BYTES + max(load, run)
    gpu = w_run + forward + patch + labels if on_gpu else 0.0
    if on_gpu:
        parts["GPU: weights, forwards, patching"] = gpu
    return MemoryEstimate(host_peak=host, gpu_peak=gpu, parts=parts)


def check_budget(est: MemoryEstimate, budget: int, where: str, what: str) -> None:
    """MemoryBudgetError naming the need, the budget and where it came from."""
    if est.host_peak > budget:
        raise MemoryBudgetError(
            f"{what} needs about {_gib(est.host_peak)} of host memory at its peak, over the "
            f"budget of {_gib(budget)} ({where}); nothing was loaded. Measure fewer layers "
            f"or operands (the need shown is with one layer's activations at a time and "
            f"the smallest patch chunk that can be lowered to), or raise the budget "
            f"(NCAT_MEMORY_BUDGET=24G or --memory-budget).\n{est.render()}")


def label_fit_bytes(config) -> float:
    """An upper bound of what the label gate holds per run (``catalog.labels.operand_fit``):
    per operator, and again for its relabelled control, the rival sets, float64, and for
    the operator's own fit (the controls never explain: ``OperandFit.models``) the
    held-out fits' inverses (five folds of each model: the operands, the result, the
    result of each operator with the operands) and the models of the operands with a
    label's set it keeps (``SET_MODELS_BYTES``)."""
    if not (config.result_beyond_operands and config.label_rule == "values"):
        return 0.0
    from catalog.config.vocab import FOLDS, MAX_LEVELS, SET_MODELS_BYTES

    side = config.operand_hi - config.operand_lo
    cells = float(side) ** 2
    ops_w = 2 * side + 16  # each operand's values and the layouts
    levels = {"+": 2 * side, "-": side, "*": min(MAX_LEVELS, side * side), "/": side}
    models = 0.0
    for op in config.operators:
        widths = [ops_w, levels[op]] + [ops_w + n for n in levels.values()]
        models = max(models, FOLDS * sum(w * w for w in widths) * 8.0 + SET_MODELS_BYTES)
    # the rivals (residues and digit patterns of three operators, a few hundred each) on
    # every cell (the windows keep each cell's bin and their roots' picks, not per-cell
    # rows: ``WindowScan``)
    rest = 3 * 300 * cells * 8.0
    return len(config.operators) * (models + 2 * rest)


def request_memory(shape, config, execution, n_layers: int) -> MemoryEstimate | None:
    """The estimate of measuring ``n_layers`` layers of a model whose ModelShape is
    ``shape`` with ``config`` and ``execution``; None where the source gave no footprint."""
    import numpy as np

    from catalog.core.arith import is_valid
    from catalog.measuring.prompts import UNLIMITED, longest_prompt

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
        exact="exact" in config.patching, labels=label_fit_bytes(config))


# the smallest patch chunk tried while the grid's activations of every layer are kept;
# below it, each layer's grid is computed when the layer runs instead
_KEEP_ACTIVATIONS_MIN_CHUNK = 16


@dataclass
class Fitted:
    """The execution a request runs with, its estimate, and what was lowered to fit."""

    execution: object  # catalog.config.ExecutionConfig
    estimate: MemoryEstimate | None
    note: str | None = None  # None: nothing changed


def _halvings(chunk: int, down_to: int) -> list[int]:
    out = [chunk]
    while out[-1] > down_to:
        out.append(max(out[-1] // 2, down_to))
    return out


def fit_request(shape, config, execution, n_layers: int, what: str) -> Fitted:
    """The request sized to the budget (execution.memory_budget, NCAT_MEMORY_BUDGET or the
    memory available now): ``execution``'s patch chunk and activation budget are ceilings;
    where the estimate is over the budget, the patch chunk is halved (down to 16) with
    every layer's grid activations kept, then the activations are given up (each layer's
    grid computed when it runs) and the chunk halved again from its ceiling down to 1.
    The first that fits is returned. None fits: MemoryBudgetError with the need of the
    smallest (nothing is loaded). None of these changes a stored number."""
    from dataclasses import replace

    est = request_memory(shape, config, execution, n_layers)
    if est is None:
        return Fitted(execution, None)
    budget, where = memory_budget(execution.memory_budget)
    if est.host_peak <= budget:
        return Fitted(execution, est)
    chunk = execution.patch_chunk
    tries = [replace(execution, patch_chunk=c)
             for c in _halvings(chunk, min(chunk, _KEEP_ACTIVATIONS_MIN_CHUNK))[1:]]
    tries += [replace(execution, patch_chunk=c, activation_budget=0)
              for c in _halvings(chunk, 1)]
    for fitted in tries:
        est = request_memory(shape, config, fitted, n_layers)
        assert est is not None
        if est.host_peak <= budget:
            lowered = ([f"patch chunk {chunk} -> {fitted.patch_chunk}"]
                       if fitted.patch_chunk != chunk else [])
            lowered.append("every layer's grid activations kept" if fitted.activation_budget
                           else "each layer's grid computed when the layer runs")
            return Fitted(fitted, est, (
                f"{what}: memory budget {_gib(budget)} ({where}): {', '.join(lowered)}; "
                f"estimated peak {_gib(est.host_peak)}"))
    check_budget(est, budget, where, what)
    raise AssertionError("unreachable: check_budget raises over the budget")


