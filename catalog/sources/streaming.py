"""A GGUF file or a Hugging Face folder of safetensors loaded one tensor at a time,
straight into the working dtype.

transformers' own GGUF loading dequantizes every tensor of the file into one dict, builds
the model from it, and only then does TransformerLens convert and process the weights:
Qwen2.5-Coder-0.5B peaked at 3.78 GiB over the process whatever dtype was asked for,
2.8x its bfloat16 weights. Here nothing holds more than one set of weights in the working
dtype and one layer's float32 tensors besides:

1. The transformers model is built with its parameters on the meta device (its buffers,
   the rotary tables, real), so its state dict names every tensor and where the files
   hold it (GGUF: transformers' own name map and tensor processors; safetensors: the
   checkpoint's keys as transformers renames them on load), and nothing is allocated.
2. The weights hash: every tensor dequantized in the hash's order (sorted names), hashed
   as float32 exactly as ``catalog.core.weights.weights_hash`` of the transformers model
   loaded whole, and dropped.
3. The reference for ``check_against_transformers``: transformers' forward on the check
   tokens, each decoder layer's parameters dequantized just before it runs and dropped
   after (forward hooks); the embeddings, final norm and head for the whole pass.
4. The conversion: for each group (the tensors outside the decoder layers, then each
   layer) its transformers parameters are dequantized in float32, TransformerLens's
   converter runs on the model (the other groups' tensors on the meta device, where
   every operation is free), and its weight processing (``hf.process_weights``) runs on
   the group's tensors; each result is cast to the working dtype and assigned to the
   HookedTransformer, whose parameters wait on the meta device.

Every step is TransformerLens's and transformers' own code on fewer tensors at once, so
the float32 result is the whole-model load's to the bit (tests/unit/test_streaming.py).
Where this cannot hold (a tensor processor that is not one tensor in, one out; a key
transformers converts rather than renames; a parameter the files or the converter do not
give; an operation that mixes groups), the loader raises ``StreamUnsupported`` and the
caller loads the model whole.

``parameters_on_meta`` swaps ``torch.nn.Module.register_parameter`` while a model is
built: a module built on another thread at that moment would get meta parameters too
(the catalog loads models on one thread).
"""

from __future__ import annotations

import copy
import hashlib
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from transformer_lens import HookedTransformer
from transformer_lens.utilities.activation_functions import softcap_enabled
from transformer_lens.utilities.architectures import POST_NORM_ARCHITECTURES

from catalog.core.weights import hash_tensor
from catalog.sources.hf import (
    _LN_KEYS,
    _architecture,
    _cannot_convert,
    _tl_config,
    check_against_transformers,
    process_weights,
    reference_logprobs,
)
from catalog.sources.tensor_files import (
    GGUFTensors,
    SafetensorsTensors,
    StreamedTensors,
    StreamUnsupported,
)


@contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules built inside get their parameters on the meta device (buffers stay real):
    a model's structure without its weights. ``torch.empty`` allocates the parameter
    first but never touches its pages; initialisers then run on the meta copy."""
    original = torch.nn.Module.register_parameter

    def register(module, name, param):
        original(module, name, param)
        if param is not None and param.device.type != "meta":
            module._parameters[name] = torch.nn.Parameter(
                param.detach().to("meta"), requires_grad=param.requires_grad)

    torch.nn.Module.register_parameter = register  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = original  # type: ignore[method-assign]


def _set_parameter(model: torch.nn.Module, name: str, value: torch.Tensor) -> None:
    owner, _, attr = name.rpartition(".")
    module = model.get_submodule(owner) if owner else model
    module._parameters[attr] = torch.nn.Parameter(value, requires_grad=False)



def streamed_hash(tensors: StreamedTensors) -> str:
    """``catalog.core.weights.weights_hash`` of the transformers model loaded whole in float32,
    with one tensor in memory at a time."""
    h = hashlib.sha256()
    for name in tensors.names:
        hash_tensor(h, name, tensors.get(name))
    return h.hexdigest()


def _layer_container(hf_model, n_layers: int) -> str:
    """The dotted name of the decoder layers' ModuleList."""
    for name, module in hf_model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == n_layers and name:
            return name
    raise StreamUnsupported("no list of decoder layers in the transformers model")


def _groups(names: list[str], layers: str, n_layers: int) -> list[list[str]]:
    """The parameters outside the decoder layers, then each layer's."""
    pattern = re.compile(re.escape(layers) + r"\.(\d+)\.")
    groups: list[list[str]] = [[] for _ in range(n_layers + 1)]
    for name in names:
        m = pattern.match(name)
        groups[0 if m is None else int(m.group(1)) + 1].append(name)
    return groups


class _Materialized:
    """Sets a group's parameters of the meta-device transformers model to real float32
    tensors, and puts them back on the meta device."""

    def __init__(self, hf_model, tensors: StreamedTensors):
        self.hf_model, self.tensors = hf_model, tensors

    def load(self, names: list[str]) -> None:
        loaded: dict[str, torch.Tensor] = {}
        for name in names:
            twin = self.tensors.aliases.get(name, name)
            if twin not in loaded:
                loaded[twin] = self.tensors.get(twin)
            _set_parameter(self.hf_model, name, loaded[twin])

    def drop(self, names: list[str]) -> None:
        for name in names:
            _set_parameter(self.hf_model, name,
                           torch.empty(self.tensors.shapes[name], device="meta"))


def streamed_reference(hf_model, tensors: StreamedTensors, groups, layers: str, d_vocab: int):
    """``hf.reference_logprobs`` of the whole transformers model, one decoder layer's
    parameters real at a time."""
    real = _Materialized(hf_model, tensors)
    container = hf_model.get_submodule(layers)
    handles = []
    for i, layer in enumerate(container):
        names = groups[i + 1]
        handles.append(layer.register_forward_pre_hook(lambda *_, n=names: real.load(n)))
        handles.append(layer.register_forward_hook(lambda *_, n=names: real.drop(n)))
    real.load(groups[0])
    try:
        return reference_logprobs(hf_model, d_vocab, device=torch.device("cpu"))
    finally:
        for handle in handles:
            handle.remove()
        for names in groups:
            real.drop(names)


def _group_of(key: str) -> int:
    """The group of a TransformerLens parameter: 0 outside the blocks, else block + 1."""
    m = re.match(r"blocks\.(\d+)\.", key)
    return 0 if m is None else int(m.group(1)) + 1


# TransformerLens parameters outside the blocks that its forward uses after the last block
_READ_OUT = ("ln_final.", "unembed.")


def streamed_conversion(model, hf_model, tensors: StreamedTensors, groups, neutral: str,
                        tokens: torch.Tensor, *, dtype: torch.dtype, fold_ln: bool,
                        center_writing_weights: bool,
                        center_unembed: bool) -> tuple[bool, torch.Tensor]:
    """Convert and process the weights group by group into ``model`` (a HookedTransformer
    built with ``parameters_on_meta``), each parameter cast to ``dtype`` once its group
    has run. Returns whether the norms were folded (as ``hf.load_processed`` decides) and
    the float32 logits of ``tokens``: TransformerLens's forward, the embedding, then each
    block, then the read-out, each run while its group's weights are still in float32 (the
    read-out's stay so until the end), so the check against transformers is as strict in
    every working dtype as in float32."""

    cfg = model.cfg
    # the converters move each tensor to ``cfg.device``; with None, meta tensors stay
    convert_cfg = copy.copy(cfg)
    convert_cfg.device = None
    wanted = {name for name, _ in model.named_parameters()}
    done: set[str] = set()
    read_out: list[str] = []
    unembed: dict[str, list[torch.Tensor]] = {}
    real = _Materialized(hf_model, tensors)
    resid = tokens
    for index, names in enumerate(groups):
        holder = _group_state(real, names, index, neutral, convert_cfg, hf_model)
        if index == 0:  # as hf.load_processed decides, from every key
            fold_ln = _folds(cfg, fold_ln, holder[0])
        try:
            processed = process_weights(cfg, holder, fold_ln=fold_ln,
                                        center_writing_weights=center_writing_weights,
                                        center_unembed=center_unembed)
        except RuntimeError as exc:
            raise StreamUnsupported(f"weight processing mixes layers: {exc}") from None
        assigned = _assign_group(model, processed, index, wanted, done, unembed)
        resid = _group_forward(model, tokens, resid, index)
        read_out += _cast_group(model, assigned, index, dtype)
    missing = sorted(wanted - done)
    if missing:
        raise StreamUnsupported(f"the converter gives no {', '.join(missing[:4])}")
    logits = _read_out(model, resid, unembed, dtype)
    for key in read_out:
        _cast(model, key, dtype)
    return fold_ln, logits


@torch.no_grad()
def _group_forward(model, tokens: torch.Tensor, resid: torch.Tensor, index: int
                   ) -> torch.Tensor:
    """The residual stream after group ``index`` (0: the embedding of ``tokens``; i: block
    i - 1 run on ``resid``)."""
    if index == 0:
        return model(tokens, stop_at_layer=0)
    return model(resid, start_at_layer=index - 1, stop_at_layer=index)


def _cast_group(model, assigned, index: int, dtype: torch.dtype) -> list[str]:
    """Cast group ``index``'s parameters to ``dtype``, but the read-out's of group 0
    (returned: they stay in float32 until the logits are checked)."""
    kept = []
    for key in assigned:
        if index == 0 and key.startswith(_READ_OUT):
            kept.append(key)
        else:
            _cast(model, key, dtype)
    return kept


def _group_state(real: _Materialized, names, index: int, neutral: str, convert_cfg,
                 hf_model) -> list[dict]:
    """The converter's state dict with group ``index``'s own tensors real and the rest on
    the meta device (every processing step is then computed for this group alone: an
    operation mixing groups raises), in a list that holds its only reference (each step
    frees its input as it goes)."""
    from transformer_lens import loading_from_pretrained as tl_loading

    real.load(names)
    try:
        converted = tl_loading.get_pretrained_state_dict(neutral, convert_cfg, hf_model,
                                                         dtype=torch.float32)
    finally:
        real.drop(names)
    holder = [{k: (v if _group_of(k) == index else v.to("meta"))
               for k, v in converted.items()}]
    del converted
    return holder


def _folds(cfg, fold_ln: bool, state_dict: dict) -> bool:
    """Whether the norms are folded, as ``hf.load_processed`` decides from every key;
    StreamUnsupported where folding would swap them."""
    fold_ln = (fold_ln and cfg.normalization_type in ("LN", "LNPre", "RMS", "RMSPre")
               and any(k.endswith(_LN_KEYS) for k in state_dict))
    if fold_ln and cfg.normalization_type in ("LN", "RMS"):
        raise StreamUnsupported("the norms are not swapped for folding")
    return fold_ln


def _assign_group(model, processed: dict, index: int, wanted: set[str], done: set[str],
                  unembed: dict[str, list[torch.Tensor]]) -> list[str]:
    """Group ``index``'s processed parameters into ``model`` (the unembedding kept apart
    in float32 slices, ``unembed``), each popped as it goes; returns the keys assigned."""
    cfg = model.cfg
    assigned = []
    for key in list(processed):
        value = processed.pop(key)
        if _group_of(key) != index or key not in wanted:
            continue
        if value.device.type == "meta":
            raise StreamUnsupported(f"{key} does not come from its own layer's tensors")
        done.add(key)
        if key in _UNEMBED:  # kept apart, in float32, a slice of the vocabulary each
            unembed[key] = _vocab_slices(value)
            continue
        value = value.T.contiguous().T if _multiplied_transposed(key, cfg) \
            else value.contiguous()
        model.load_state_dict({key: value}, strict=False, assign=True)
        assigned.append(key)
        del value
    return assigned


# the unembedding: its float32 copy waits in slices for the read-out, so that the cast to
# the working dtype frees each slice as it writes it (a whole cast would hold the float32
# unembedding and its cast at once: 0.25 GiB more for Qwen2.5-Coder-0.5B in bfloat16)
_UNEMBED = ("unembed.W_U", "unembed.b_U")
_SLICES = 8


def _vocab_slices(value: torch.Tensor) -> list[torch.Tensor]:
    """``value`` (``W_U`` [d_model, vocab] or ``b_U`` [vocab]) as contiguous copies of
    slices of the vocabulary, ``W_U``'s transposed ([vocab slice, d_model])."""
    rows = value.T if value.dim() == 2 else value
    step = -(-rows.shape[0] // _SLICES)
    return [rows[i:i + step].clone(memory_format=torch.contiguous_format)
            for i in range(0, rows.shape[0], step)]


def _read_out(model, resid: torch.Tensor, unembed: dict[str, list[torch.Tensor]],
              dtype: torch.dtype) -> torch.Tensor:
    """The float32 logits of the last residual ``resid``: TransformerLens's read-out (final
    norm, unembedding, any soft cap: elementwise over the vocabulary) run once per slice of
    the vocabulary with that slice's float32 unembedding; each slice is then written into
    the unembedding in ``dtype`` (stored transposed, as ``transposed_layout`` has it) and
    freed."""
    w_slices, b_slices = unembed["unembed.W_U"], unembed.get("unembed.b_U")
    vocab = sum(t.shape[0] for t in w_slices)
    w_t = torch.empty((vocab, w_slices[0].shape[1]), dtype=dtype)
    b = torch.empty(vocab, dtype=dtype) if b_slices is not None else None
    logits, start = [], 0
    with torch.no_grad():
        while w_slices:
            w = w_slices.pop(0)
            stop = start + w.shape[0]
            model.unembed.W_U = torch.nn.Parameter(w.T, requires_grad=False)
            if b_slices is not None:
                model.unembed.b_U = torch.nn.Parameter(b_slices.pop(0), requires_grad=False)
            logits.append(model(resid, start_at_layer=model.cfg.n_layers).float())
            w_t[start:stop] = w
            if b is not None:
                b[start:stop] = model.unembed.b_U
            start = stop
            del w
    model.unembed.W_U = torch.nn.Parameter(w_t.T, requires_grad=False)
    if b is not None:
        model.unembed.b_U = torch.nn.Parameter(b, requires_grad=False)
    return torch.cat(logits, dim=-1)


def _multiplied_transposed(key: str, cfg) -> bool:
    """Whether TransformerLens 3.9 multiplies parameter ``key`` as ``F.linear(x,
    W.T.contiguous())`` (the unembedding; a gated MLP's matrices): stored as the transpose
    of a contiguous tensor, the product copies nothing (``sources.transposed_layout``;
    a copy of a 151,936-token unembedding in float32 is 0.5 GiB)."""
    if key == "unembed.W_U":
        return True
    gated = cfg.gated_mlp and not getattr(cfg, "load_in_4bit", False)
    return gated and re.fullmatch(r"blocks\.\d+\.mlp\.W_(in|gate|out)", key) is not None


def _cast(model, key: str, dtype: torch.dtype) -> None:
    """Parameter ``key`` of ``model`` in ``dtype``, its layout kept."""
    param = model.get_parameter(key)
    if param.dtype != dtype:
        param.data = param.data.to(dtype)  # elementwise: the strides are kept


def load_streamed(path: Path, config, tokenizer, shown: str, device, dtype: torch.dtype):
    """(HookedTransformer weight-processed in ``dtype``, weights hash) of the GGUF file or
    Hugging Face folder (safetensors) at ``path`` whose transformers config is ``config``;
    StreamUnsupported where it cannot be streamed (nothing is held then)."""
    from transformers import AutoModelForCausalLM

    with parameters_on_meta():
        try:
            hf_model = AutoModelForCausalLM.from_config(config)
        except Exception as exc:  # noqa: BLE001  transformers cannot build it here
            raise StreamUnsupported(f"transformers cannot build {type(config).__name__}: "
                                    f"{exc}") from None
    hf_model.eval()
    arch = _architecture(config, type(hf_model).__name__)
    tensors = (SafetensorsTensors(path, hf_model) if path.is_dir()
               else GGUFTensors(path, hf_model))
    tensors.start_progress()
    try:
        whash = streamed_hash(tensors)
        model, folded, reference, logits = _converted(hf_model, tensors, config, arch,
                                                      tokenizer, shown, device, dtype)
    finally:
        tensors.close()
    del hf_model, tensors
    model.cfg.model_name = shown
    model.to(dtype)  # the buffers (rotary tables), computed in float32 as a whole load's
    model.cfg.dtype = dtype
    if folded:
        model.setup()
    model.to(device)
    model.eval()
    check_against_transformers(reference, model, shown, logits=logits)
    return model, whash


def load_streamed_or_none(path: Path, config, tokenizer, shown: str, device,
                          dtype: torch.dtype):
    """``load_streamed``, or None where the model cannot be streamed (the reason logged):
    the caller then loads it whole. ``config`` None: read from the folder at ``path``."""
    import logging

    from transformers import AutoConfig

    try:
        if config is None:
            config = AutoConfig.from_pretrained(str(path))
        return load_streamed(path, config, tokenizer, shown, device, dtype)
    except StreamUnsupported as why:
        logging.getLogger(__name__).info("%s is loaded whole: %s", shown, why)
        return None


def _converted(hf_model, tensors: StreamedTensors, config, arch: str, tokenizer, shown: str,
               device, dtype: torch.dtype):
    """(HookedTransformer, whether its norms were folded, the reference log-probabilities
    for the check, the converted model's float32 logits of the same tokens): the check's
    reference and the conversion, group by group."""
    n_layers = int(config.num_hidden_layers)
    layers = _layer_container(hf_model, n_layers)
    groups = _groups(tensors.names, layers, n_layers)
    with tempfile.TemporaryDirectory() as tmp:
        neutral = str(Path(tmp) / "model")
        config.save_pretrained(neutral)
        try:
            cfg = _tl_config(neutral, config, arch, device, torch.float32)
        except (NotImplementedError, AttributeError, KeyError, ValueError) as exc:
            raise _cannot_convert(arch, shown, exc) from exc
        reference = streamed_reference(hf_model, tensors, groups, layers, cfg.d_vocab)
        with parameters_on_meta():
            model = HookedTransformer(cfg, tokenizer, move_to_device=False)
        # as hf.from_hf_model decides: no folding or centring past a norm after each
        # sublayer's output; no centring of the unembedding under a logit soft cap
        post_norm = arch in POST_NORM_ARCHITECTURES
        try:
            folded, logits = streamed_conversion(
                model, hf_model, tensors, groups, neutral, reference[0], dtype=dtype,
                fold_ln=not post_norm, center_writing_weights=not post_norm,
                center_unembed=not softcap_enabled(cfg.output_logits_soft_cap))
        except (NotImplementedError, AttributeError, KeyError, ValueError) as exc:
            raise _cannot_convert(arch, shown, exc) from exc
    return model, folded, reference, logits


__all__ = ["GGUFTensors", "SafetensorsTensors", "StreamUnsupported", "StreamedTensors",
           "load_streamed", "load_streamed_or_none", "parameters_on_meta", "streamed_hash"]
