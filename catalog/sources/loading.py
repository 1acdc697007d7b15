"""Model sources: one way to ask for a model, whatever its origin.

``load_model(name, checkpoint)`` returns a weight-processed TransformerLens
``HookedTransformer``, its tokenizer and a ``ModelInfo`` (name, checkpoint step,
weights hash, shape, tokenizer facts), for:

- the built-in arithmetic model (``builtin``), at any cached checkpoint step;
- a GGUF file (a path ending in ``.gguf``; transformers dequantizes it);
- a known model fetched with ``ncat fetch NAME`` (catalog.sources.registry), by that name;
- a local Hugging Face model directory (a path holding ``config.json``);
- a TransformerLens / Hugging Face hub name (``EleutherAI/pythia-14m``), with a
  training checkpoint given as a step (Pythia revisions ``step{N}``). With
  ``HF_HUB_OFFLINE=1`` the same code reads the local Hugging Face cache.

One module per source (``builtin``, ``gguf`` with the fetched known models, ``local``,
``hub``; ``hf`` converts what transformers loaded); ``base`` holds the vocabulary and
the registry. Sources are tried in registry order; the first whose ``accepts`` says yes
loads. Every failure names what was asked and what exists.
"""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

import torch

import catalog.sources.builtin_source as builtin_source
import catalog.sources.gguf as gguf
import catalog.sources.hub as hub
import catalog.sources.local as local
from catalog import builtin
from catalog.measuring.memory import freed_memory_returned
from catalog.sources.base import (
    SOURCES,
    LoadedModel,
    ModelInfo,
    ModelShape,
    ModelSourceError,
    Source,
    register_source,
)
from catalog.sources.hf import check_weight_files, from_hf_model
from catalog.sources.hub import cached_revisions
from catalog.sources.names import check_model_name

__all__ = ["SOURCES", "LoadedModel", "ModelInfo", "ModelShape", "ModelSourceError", "Source",
           "cached_revisions", "canonical_name", "check_model_name", "check_weight_files",
           "find_source", "from_hf_model", "inspect_model", "list_checkpoints", "load_model",
           "register_source", "transposed_layout"]

for _source in (builtin_source.SOURCE, gguf.KNOWN, gguf.SOURCE, local.SOURCE, hub.SOURCE):
    register_source(_source)


def find_source(name: str) -> Source:
    """The first registered source that accepts ``name``."""
    check_model_name(name)
    for source in SOURCES.values():
        if source.accepts(name):
            return source
    raise ModelSourceError(f"no model source accepts {name!r}")


def _quiet(fn, *args, progress: bool = True, **kwargs):
    """Call fn with stdout captured: TransformerLens prints progress notes on load. Without
    ``progress``, stderr too (the loaders' progress bars: transformers draws them with
    tqdm, which writes there); what was captured is shown if fn raises."""
    err = io.StringIO()
    with contextlib.ExitStack() as stack:
        stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
        if not progress:
            stack.enter_context(contextlib.redirect_stderr(err))
        try:
            return fn(*args, **kwargs)
        except BaseException:
            stack.close()
            sys.stderr.write(err.getvalue())
            raise


def load_model(
    name: str,
    checkpoint: int | None = None,
    *,
    tokenizer=None,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    builtin_config: builtin.TrainConfig | None = None,
    cache_root: Path | None = None,
    progress: bool = True,
) -> LoadedModel:
    """Load ``name`` at training step ``checkpoint`` (None: the final weights); without
    ``progress``, the loaders draw no progress bars (``--quiet``).

    Weights are read, hashed and processed (LayerNorm folding, centering) in float32 and
    then cast to ``dtype``, so a checkpoint's weights hash does not depend on the dtype a
    run asks for, and the processing does not round twice. A source that
    ``loads_in_dtype`` (GGUF files, Hugging Face folders, cached hub checkpoints) does this
    one tensor or layer at a time and holds
    the weights in ``dtype`` only; the others load in float32 and are cast after. No
    weight requires grad (the catalog's backward passes need gradients of activations
    only).
    """
    source = find_source(name)
    with freed_memory_returned():
        lm = _quiet(source.load, name, checkpoint, tokenizer=tokenizer, device=device,
                    dtype=dtype if source.loads_in_dtype else torch.float32,
                    builtin_config=builtin_config, cache_root=cache_root,
                    progress=progress)
        if lm.model.cfg.dtype != dtype or any(
                p.is_floating_point() and p.dtype != dtype for p in lm.model.parameters()):
            lm.model.to(dtype)
            lm.model.cfg.dtype = dtype
        transposed_layout(lm.model)
    # the catalog never trains: a weight that requires grad gets a gradient as large as
    # itself in every backward pass (attribution patching), which doubled a run's memory
    lm.model.requires_grad_(False)
    return lm


# (module attribute path, parameter) that TransformerLens 3.9 multiplies as
# ``F.linear(x, W.T.contiguous())``
_LINEAR_WEIGHTS = (("unembed", "W_U"), ("mlp", "W_gate"), ("mlp", "W_in"), ("mlp", "W_out"))


def transposed_layout(model) -> None:
    """Store the weights that TransformerLens 3.9 multiplies as ``F.linear(x,
    W.T.contiguous())`` (the unembedding; the gated MLP's three matrices) as the transpose
    of a contiguous tensor, so that ``W.T.contiguous()`` is ``W.T`` itself and no copy is
    made. Without it, every forward copies each of them: the unembedding of a 151,936-token
    vocabulary is 545 MB in float32, copied on every call (0.3 s on 2 CPU cores), and a
    single-position patched forward spent more time copying than multiplying. The numbers
    are unchanged: ``F.linear`` receives the same contiguous matrix as before."""
    from transformer_lens.components.mlps.gated_mlp import GatedMLP

    modules = [model] + [block for block in model.blocks]
    for owner in modules:
        for attr, name in _LINEAR_WEIGHTS:
            module = getattr(owner, attr, None)
            if module is None or (attr == "mlp" and not isinstance(module, GatedMLP)):
                continue
            w = getattr(module, name, None)
            if isinstance(w, torch.nn.Parameter) and w.dim() == 2 and not w.T.is_contiguous():
                w.data = w.data.T.contiguous().T


def inspect_model(name: str, checkpoint: int | None = None, **kwargs) -> ModelShape:
    """Layer count and number tokenization of ``name`` at ``checkpoint``, cheaply.

    Checks that the model and checkpoint exist. Built-in models and Hugging Face
    configs and GGUF metadata are read without weights.
    """
    return find_source(name).inspect(name, checkpoint, **kwargs)


def canonical_name(name: str, **kwargs) -> str:
    """The name a model is catalogued under: ``builtin`` -> ``builtin-arith``, hub aliases ->
    official names, paths -> absolute paths. Raises ModelSourceError for unknown names."""
    return find_source(name).canonical(name, **kwargs)


def list_checkpoints(name: str, **kwargs) -> list[int] | None:
    """Training steps available for ``name`` (None where the model has no checkpoints)."""
    return find_source(name).checkpoints(name, **kwargs)
