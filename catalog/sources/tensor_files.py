"""The files of a model, read one tensor at a time in float32 under the transformers
model's parameter names: a GGUF file (``GGUFTensors``: transformers' name map and tensor
processors, each tensor dequantized on its own) or a Hugging Face folder of safetensors
(``SafetensorsTensors``: the checkpoint's keys as transformers renames them on load).
``catalog.sources.streaming`` loads a model from them; ``StreamUnsupported`` says a file
cannot be read this way and is to be loaded whole."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from catalog.measuring.memory import trim


class StreamUnsupported(Exception):
    """This file cannot be loaded one tensor at a time (the reason says why); load it
    whole."""



# tensor processors that turn one GGUF tensor into one transformers tensor of the same
# name (the others split or merge tensors: mixture-of-experts, fused QKV, GPT-2's layout)
ONE_TO_ONE = ("TensorProcessor", "LlamaTensorProcessor", "Gemma2TensorProcessor",
              "NemotronTensorProcessor")

# transformers' model types whose GGUF architecture is named otherwise
_GGUF_ARCH = {"qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe", "gemma3_text": "gemma3",
              "gpt_oss": "gpt-oss", "cohere": "command-r", "minimax_m2": "minimax-m2"}


def streams(model_type: str) -> bool:
    """Whether a GGUF file of this transformers model type can be loaded one tensor at a
    time (its tensor processor maps one tensor to one parameter); a file may still fall
    back on what only loading finds (a parameter the file lacks)."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    arch = _GGUF_ARCH.get(model_type, model_type)
    return TENSOR_PROCESSORS.get(arch, TensorProcessor).__name__ in GGUFTensors._ONE_TO_ONE


class StreamedTensors:
    """A model's parameters read from its files one at a time in float32, under the
    transformers model's names: ``names`` (sorted, the hash's order), ``shapes``,
    ``aliases`` (a tied name -> the name whose tensor it is), ``get(name)``. Subclasses
    say which names their files hold (``_index``) and read one (``_read``)."""

    what = "tensors"
    bar = None

    def _index(self, hf_model: torch.nn.Module, present: set[str]) -> None:
        """Names, shapes and aliases for ``hf_model`` (built with ``parameters_on_meta``)
        whose files hold ``present``: every parameter must be there or tied to one that
        is; tied names read the tensor of the first of them that is present, as
        transformers ties the head to the embedding after loading."""
        params = dict(hf_model.named_parameters(remove_duplicate=False))
        self.aliases: dict[str, str] = {}
        for name, param in params.items():
            source = next((n for n, p in params.items() if p is param and n in present), None)
            if source is None:
                raise StreamUnsupported(f"the files hold no tensor for {name}")
            if source != name:
                self.aliases[name] = source
        extra = set(hf_model.state_dict()) - set(params)
        if extra:  # persistent buffers are part of the hash and not in the files
            raise StreamUnsupported(f"the model's state dict holds buffers: {sorted(extra)}")
        self.shapes = {name: tuple(p.shape) for name, p in params.items()}
        self.names = sorted(params)

    def start_progress(self) -> None:
        """A progress bar over the three passes: every tensor is read for the hash, for
        the check and for the conversion (the hash reads a tied tensor under each name)."""
        from tqdm.auto import tqdm

        distinct = len(self.names) - len(self.aliases)
        self.bar = tqdm(total=len(self.names) + 2 * distinct, unit="tensor",
                        desc=f"{self.what} (hash, check, convert)")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def get(self, name: str) -> torch.Tensor:
        """Parameter ``name`` in float32, as transformers' whole load gives it."""
        source = self.aliases.get(name, name)
        tensor = self._read(source)
        if tuple(tensor.shape) != self.shapes[name]:
            try:
                tensor = tensor.reshape(self.shapes[name])
            except RuntimeError:
                raise StreamUnsupported(f"{source} has shape {tuple(tensor.shape)}, the "
                                        f"model's {name} {self.shapes[name]}") from None
        if self.bar is not None:
            self.bar.update()
        return tensor

    def _read(self, name: str) -> torch.Tensor:
        raise NotImplementedError


class SafetensorsTensors(StreamedTensors):
    """A Hugging Face folder's safetensors files (one, or the shards its index names),
    whose tensor names are the transformers model's own; each read opens the file for that
    tensor alone and casts it to float32 as ``from_pretrained(dtype=float32)`` does. A
    checkpoint whose names transformers renames on load is not streamed."""

    what = "safetensors tensors"

    def __init__(self, folder: Path, hf_model: torch.nn.Module):
        import json

        from safetensors import safe_open

        index = folder / "model.safetensors.index.json"
        if index.exists():
            weight_map = json.loads(index.read_text())["weight_map"]
            self._file = {k: folder / v for k, v in weight_map.items()}
        else:
            self._file = {}
            for path in sorted(folder.glob("*.safetensors")):
                with safe_open(str(path), framework="pt") as f:
                    self._file.update({k: path for k in f.keys()})
        if not self._file:
            raise StreamUnsupported(f"no safetensors files in {folder}")
        self._key = _renamed_keys(hf_model, list(self._file))  # model name -> file key
        self._index(hf_model, set(self._key))

    def _read(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        key = self._key[name]
        with safe_open(str(self._file[key]), framework="pt") as f:
            tensor = f.get_tensor(key)
        # an owned float32 copy: nothing left pointing into the file's pages
        return tensor.to(torch.float32, copy=True)


def _renamed_keys(hf_model, keys: list[str]) -> dict[str, str]:
    """{the model's parameter name: the checkpoint's key} under transformers' own renaming
    of checkpoint keys on load (GPT-NeoX's ``embed_out`` is its ``lm_head``; a missing or
    extra base-model prefix). A key that transformers would convert (merge or split)
    rather than rename is StreamUnsupported."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import (
            WeightConverter,
            WeightRenaming,
            rename_source_key,
        )
    except ImportError:  # another transformers: names as they are
        return {k: k for k in keys}
    transforms = get_model_conversion_mapping(hf_model)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    meta = hf_model.state_dict()
    out: dict[str, str] = {}
    for key in keys:
        name, converted = rename_source_key(key, renamings, converters,
                                            hf_model.base_model_prefix, meta)
        if converted is not None:
            raise StreamUnsupported(f"transformers converts {key} on load")
        out[name] = key
    return out


class GGUFTensors(StreamedTensors):
    """The tensors of a GGUF file under their transformers names, dequantized to float32
    one at a time, for a transformers model ``hf_model`` of the file's config built with
    ``parameters_on_meta``."""

    what = "GGUF tensors"

    _ONE_TO_ONE = ONE_TO_ONE

    def __init__(self, path: Path, hf_model: torch.nn.Module):
        from gguf import GGUFReader
        from transformers.modeling_gguf_pytorch_utils import (
            TENSOR_PROCESSORS,
            TensorProcessor,
            get_gguf_hf_weights_map,
            read_field,
        )

        # the reader parses every metadata field (a 151,936-token vocabulary: 0.44 GB of
        # small arrays); only the tensors' places in the file are kept
        reader = GGUFReader(str(path))
        arch = read_field(reader, "general.architecture")[0]
        self._places = {t.name: (t.tensor_type, t.data_offset, t.data.dtype, t.data.shape)
                        for t in reader.tensors}
        del reader
        trim()
        self.path = path
        processor_class = TENSOR_PROCESSORS.get(arch, TensorProcessor)
        if processor_class.__name__ not in self._ONE_TO_ONE:
            raise StreamUnsupported(f"transformers' {processor_class.__name__} for {arch} "
                                    "does not map one GGUF tensor to one parameter")
        # the processors read head counts under the transformers config's names
        config = hf_model.config.to_dict()  # type: ignore[union-attr,operator]
        self.processor = processor_class(config=config)
        self.key_mapping = get_gguf_hf_weights_map(hf_model, self.processor)
        self._gguf_name = {hf: g for g, hf in self.key_mapping.items() if g in self._places}
        self._index(hf_model, set(self._gguf_name))

    def _read(self, hf_name: str) -> torch.Tensor:
        """The file is mapped for this tensor alone, so its pages leave the resident set
        with it."""
        gguf_name = self._gguf_name[hf_name]
        qtype, offset, item, shape = self._places[gguf_name]
        data = np.memmap(self.path, dtype=item, mode="r", offset=offset,
                         shape=(int(np.prod(shape)),)).reshape(shape)
        weights = _dequantized(data, qtype)
        result = self.processor.process(weights=weights, name=gguf_name,
                                        tensor_key_mapping=self.key_mapping,
                                        parsed_parameters={})
        if result.name != gguf_name:
            raise StreamUnsupported(f"the tensor processor renamed {gguf_name} to "
                                    f"{result.name}")
        out = result.weights
        if np.shares_memory(out, data) or not out.flags.writeable:
            out = np.array(out, copy=True)  # a view of the file (an unquantized tensor)
        tensor = torch.from_numpy(np.ascontiguousarray(out)).to(torch.float32)
        del data, weights, result, out
        return tensor


# rows dequantized at once: the dequantizers' temporaries are a few times their output
_CHUNK_ELEMENTS = 1 << 22


def _dequantized(data: np.ndarray, qtype) -> np.ndarray:
    """``gguf.dequantize`` of ``data`` (rows of blocks), a chunk of rows at a time into one
    float32 array, so that the dequantizer's temporaries stay small next to the tensor."""
    from gguf import dequantize

    if data.ndim < 2 or data.size <= _CHUNK_ELEMENTS:
        return dequantize(data, qtype)
    step = max(1, _CHUNK_ELEMENTS // int(np.prod(data.shape[1:])))
    first = dequantize(data[:step], qtype)
    out = np.empty((data.shape[0], *first.shape[1:]), dtype=first.dtype)
    out[:step] = first
    del first
    for start in range(step, data.shape[0], step):
        out[start:start + step] = dequantize(data[start:start + step], qtype)
    return out
