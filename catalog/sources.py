"""Model sources: one way to ask for a model, whatever its origin.

``load_model(name, checkpoint)`` returns a weight-processed TransformerLens
``HookedTransformer``, its tokenizer and a ``ModelInfo`` (name, checkpoint step,
weights hash, shape, tokenizer facts), for:

- the built-in arithmetic model (``builtin``), at any cached checkpoint step;
- a GGUF file (a path ending in ``.gguf``; transformers dequantizes it);
- a known model fetched with ``ncat fetch NAME`` (catalog.registry), by that name;
- a local Hugging Face model directory (a path holding ``config.json``);
- a TransformerLens / Hugging Face hub name (``EleutherAI/pythia-14m``), with a
  training checkpoint given as a step (Pythia revisions ``step{N}``). With
  ``HF_HUB_OFFLINE=1`` the same code reads the local Hugging Face cache.

Sources are tried in registry order; the first whose ``accepts`` says yes loads.
Every failure names what was asked and what exists.
"""

from __future__ import annotations

import contextlib
import io
import logging
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from transformer_lens import HookedTransformer
from transformer_lens import loading_from_pretrained as tl_loading

from catalog import builtin
from catalog.tokens import detect_number_tokens
from catalog.weights import weights_hash

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelInfo:
    """What the catalog records about a loaded model checkpoint."""

    name: str
    source: str  # builtin | known | gguf | local | hub
    checkpoint: int | None  # training step, None for a model without checkpoints
    revision: str | None  # e.g. "step1000" for hub checkpoints
    weights_hash: str
    n_layers: int
    d_model: int
    d_mlp: int
    d_vocab: int
    act_fn: str
    gated_mlp: bool
    number_limit: int
    digit_level: bool

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class LoadedModel:
    model: HookedTransformer
    tokenizer: object
    info: ModelInfo


class ModelSourceError(ValueError):
    """A model, path or checkpoint that cannot be loaded, with what exists instead."""


@dataclass(frozen=True)
class ModelShape:
    """What validation needs to know about a model, without loading its weights."""

    n_layers: int
    numbers: object  # catalog.tokens.NumberTokens


@dataclass(frozen=True)
class Source:
    """One origin of models: which names it takes, how it loads, lists checkpoints,
    inspects a model without its weights (where it can), and names it in the catalog."""

    name: str
    accepts: Callable[[str], bool]
    load: Callable[..., LoadedModel]
    checkpoints: Callable[..., list[int] | None]
    inspect: Callable[..., ModelShape]
    canonical: Callable[..., str]


SOURCES: dict[str, Source] = {}


def register_source(source: Source) -> Source:
    """Add a model source; a second source of the same name is refused."""
    if source.name in SOURCES:
        raise ValueError(f"model source {source.name!r} is already registered")
    SOURCES[source.name] = source
    return source


def _info(name, source, checkpoint, revision, whash, model, tokenizer) -> ModelInfo:
    numbers = detect_number_tokens(tokenizer, prepend_bos=model.cfg.default_prepend_bos)
    return ModelInfo(
        name=name, source=source, checkpoint=checkpoint, revision=revision, weights_hash=whash,
        n_layers=model.cfg.n_layers, d_model=model.cfg.d_model, d_mlp=model.cfg.d_mlp,
        d_vocab=model.cfg.d_vocab, act_fn=str(model.cfg.act_fn),
        gated_mlp=bool(model.cfg.gated_mlp), number_limit=numbers.limit,
        digit_level=numbers.digit_level,
    )


# ------------------------------------------------------------------ built-in


def _is_builtin(name: str) -> bool:
    return name.partition("@")[0] in (builtin.BUILTIN_NAME, "builtin")


def _builtin_config(name: str, builtin_config, cache_root) -> builtin.TrainConfig:
    if builtin_config is not None:
        return builtin_config
    try:
        return builtin.config_from_name(name, cache_root)
    except FileNotFoundError as exc:
        raise ModelSourceError(str(exc)) from exc


def _load_builtin(name, checkpoint, *, tokenizer=None, device="cpu", dtype=torch.float32,
                  builtin_config=None, cache_root=None) -> LoadedModel:
    cfg = _builtin_config(name, builtin_config, cache_root)
    steps = builtin.available_steps(cfg, cache_root)
    if checkpoint is None:
        if not steps:
            raise ModelSourceError(
                "the built-in model has no checkpoints yet; train it first "
                "(ncat train-builtin, or catalog.builtin.train())")
        checkpoint = steps[-1]
    try:
        model, meta = builtin.load_checkpoint(cfg, checkpoint, cache_root, device=device)
    except FileNotFoundError as exc:
        raise ModelSourceError(str(exc)) from exc
    except ValueError as exc:
        raise ModelSourceError(str(exc)) from exc
    model.to(dtype)
    tok = tokenizer or builtin.builtin_tokenizer()
    info = _info(builtin.model_name(cfg), "builtin", checkpoint, f"step{checkpoint}",
                 meta["weights_hash"], model, tok)
    return LoadedModel(model, tok, info)


def _builtin_checkpoints(name: str, builtin_config=None, cache_root=None) -> list[int]:
    return builtin.available_steps(_builtin_config(name, builtin_config, cache_root), cache_root)


# ------------------------------------------------------- Hugging Face models


# Config attributes that TransformerLens 3.x reads under names recent transformers
# configs may lack, by architecture: the old name and how to find its value. A GPT-2
# config built in code and saved has n_positions only (the hub's gpt2 config.json has
# n_ctx too).
_TL_ALIASES: dict[str, dict[str, Callable[[Any], Any]]] = {
    "GPT2LMHeadModel": {"n_ctx": lambda c: getattr(c, "n_positions", None)},
}


def _from_hf_model(hf_model, tokenizer, shown: str, device, dtype) -> HookedTransformer:
    """Convert a loaded Hugging Face causal LM into a weight-processed HookedTransformer.

    TransformerLens derives its config from the model's config, saved into a folder of
    a neutral name: from a folder whose path holds "llama" or "gemma" it takes the
    architecture from the name and reads no config (a local ``~/models/Llama-3.2-1B``
    crashed). Names it reads that the config lacks are filled in (``_TL_ALIASES``). The
    weights come from ``hf_model``; nothing is downloaded. An architecture it cannot
    convert is a ModelSourceError naming it and the model (``shown``).
    """
    config = hf_model.config
    if not config.architectures:  # GGUF configs do not record it
        config.architectures = [type(hf_model).__name__]
    arch = config.architectures[0]
    for old, find in _TL_ALIASES.get(arch, {}).items():
        if not hasattr(config, old) and (value := find(config)) is not None:
            setattr(config, old, value)
    with tempfile.TemporaryDirectory() as tmp:
        neutral = str(Path(tmp) / "model")
        config.save_pretrained(neutral)
        try:
            cfg = tl_loading.get_pretrained_model_config(
                neutral, fold_ln=True, device=device, dtype=dtype)
            state_dict = tl_loading.get_pretrained_state_dict(neutral, cfg, hf_model,
                                                              dtype=dtype)
        except (NotImplementedError, AttributeError, KeyError, ValueError) as exc:
            from importlib.metadata import version

            raise ModelSourceError(
                f"TransformerLens {version('transformer-lens')} cannot convert the {arch} "
                f"model {shown!r}: {exc} (it converts Llama, Mistral, Qwen2, GPT-2, "
                "GPT-NeoX/Pythia, GPT-J, GPT-Neo, OPT, Bloom and others; see its model "
                "table)") from exc
        # built while the folder exists: without a tokenizer, TransformerLens looks there
        model = HookedTransformer(cfg, tokenizer, move_to_device=False)
    model.cfg.model_name = shown
    model.load_and_process_state_dict(
        state_dict, fold_ln=True, center_writing_weights=True, center_unembed=True)
    model.to(device)
    model.eval()
    return model


def _is_gguf(name: str) -> bool:
    return name.lower().endswith(".gguf")


def _gguf_path(name: str, checkpoint: int | None) -> Path:
    """The GGUF file ``name``; a missing file or a checkpoint is refused."""
    path = Path(name)
    if not path.is_file():
        raise ModelSourceError(f"GGUF file {name!r} does not exist")
    if checkpoint is not None:
        raise ModelSourceError(f"a GGUF file has no training checkpoints; got checkpoint "
                               f"{checkpoint} for {name!r}")
    return path


def _load_gguf(name, checkpoint, *, tokenizer=None, device="cpu", dtype=torch.float32,
               **_) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = _gguf_path(name, checkpoint)
    try:
        hf_model = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=dtype)
        tok = tokenizer or AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as exc:
        raise ModelSourceError(f"GGUF file {name!r} cannot be loaded: {exc}") from exc
    whash = weights_hash(hf_model.state_dict())
    model = _from_hf_model(hf_model, tok, name, device, dtype)
    info = _info(str(path.resolve()), "gguf", None, None, whash, model, tok)
    return LoadedModel(model, tok, info)


def _inspect_gguf_file(path: Path) -> ModelShape:
    """Layers and number tokens from a GGUF file's metadata and tokenizer (no weights)."""
    from transformers import AutoConfig, AutoTokenizer

    try:
        cfg = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as exc:
        raise ModelSourceError(f"GGUF file {str(path)!r} cannot be read: {exc}") from exc
    # TransformerLens prepends BOS where the tokenizer has one (not for GPT-NeoX)
    prepend = cfg.model_type != "gpt_neox" and tok.bos_token_id is not None
    return ModelShape(int(cfg.num_hidden_layers), detect_number_tokens(tok, prepend_bos=prepend))


# ------------------------------------------------------- fetched known models


def _is_known(name: str) -> bool:
    from catalog import registry

    return name in registry.KNOWN


def _known_path(name: str) -> Path:
    from catalog import registry
    from catalog.settings import get_settings

    path = registry.fetched_path(name, get_settings().ncat_home)
    if path is None:
        raise ModelSourceError(f"{name} is a known model that is not fetched yet; run "
                               f"`ncat fetch {name}` first ({registry.KNOWN[name].about})")
    return path


def _load_known(name, checkpoint, **kwargs) -> LoadedModel:
    if checkpoint is not None:
        raise ModelSourceError(f"{name} has no training checkpoints; got checkpoint "
                               f"{checkpoint}")
    lm = _load_gguf(str(_known_path(name)), None, **kwargs)
    lm.info = replace(lm.info, name=name, source="known")
    return lm


def _inspect_known(name, checkpoint, **_) -> ModelShape:
    if checkpoint is not None:
        raise ModelSourceError(f"{name} has no training checkpoints; got checkpoint "
                               f"{checkpoint}")
    return _inspect_gguf_file(_known_path(name))


def _is_local(name: str) -> bool:
    return (Path(name) / "config.json").is_file()


def _load_local(name, checkpoint, *, tokenizer=None, device="cpu", dtype=torch.float32,
                **_) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if checkpoint is not None:
        raise ModelSourceError(
            f"local model directory {name!r} has no training checkpoints; got checkpoint "
            f"{checkpoint} (point at one directory per checkpoint instead)")
    try:
        hf_model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype)
        tok = tokenizer or AutoTokenizer.from_pretrained(name)
    except Exception as exc:
        raise ModelSourceError(f"local model directory {name!r} cannot be loaded: {exc}") from exc
    whash = weights_hash(hf_model.state_dict())
    model = _from_hf_model(hf_model, tok, name, device, dtype)
    info = _info(str(Path(name).resolve()), "local", None, None, whash, model, tok)
    return LoadedModel(model, tok, info)


def _official_name(name: str) -> str:
    try:
        return tl_loading.get_official_model_name(name)
    except ValueError:
        raise ModelSourceError(
            f"unknown model {name!r}: it is not the built-in model ('builtin'), not an "
            "existing local directory or .gguf file, and not a TransformerLens model name "
            "(e.g. 'EleutherAI/pythia-14m', 'gpt2')") from None


def _hub_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def cached_revisions(official: str) -> list[str]:
    """Revisions of ``official`` in the local Hugging Face cache (its refs)."""
    from huggingface_hub import constants

    refs = Path(constants.HF_HUB_CACHE) / f"models--{official.replace('/', '--')}" / "refs"
    return sorted(p.name for p in refs.iterdir() if p.is_file()) if refs.is_dir() else []


def _revision_kwargs(revision: str | None) -> dict[str, Any]:
    return {"revision": revision} if revision else {}


def _cached_snapshot(official: str, revision: str | None) -> str | None:
    """The local folder of ``official`` at ``revision`` (default main) in the Hugging Face
    cache, or None when it is not cached."""
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(official, revision=revision or "main", local_files_only=True)
    except Exception:  # noqa: BLE001 - not cached (or an unusable cache entry): use the hub
        return None


def _cached_steps(official: str) -> list[int]:
    return sorted(int(r[4:]) for r in cached_revisions(official)
                  if r.startswith("step") and r[4:].isdigit())


def _published_steps(official: str) -> list[int] | None:
    try:
        labels, label_type = tl_loading.get_checkpoint_labels(official)
    except ValueError:
        return None
    return list(labels) if label_type == "step" else None


def _hub_checkpoints(name: str, **_) -> list[int] | None:
    """The published training steps; offline (HF_HUB_OFFLINE), those the cache holds."""
    official = _official_name(name)
    published = _published_steps(official)
    if published is None or not _hub_offline():
        return published
    cached = set(_cached_steps(official))
    return [s for s in published if s in cached]


def _load_hub(name, checkpoint, *, tokenizer=None, device="cpu", dtype=torch.float32,
              **_) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    official = _official_name(name)
    revision = _hub_revision(official, checkpoint)
    # From the cached snapshot's folder when there is one: TransformerLens reloads the
    # tokenizer by its name_or_path without a revision, which fails for a cache that holds
    # only refs/stepN (no refs/main) while offline.
    source = _cached_snapshot(official, revision) or official
    try:
        hf_model = AutoModelForCausalLM.from_pretrained(
            source, dtype=dtype, **({} if source != official else {"revision": revision}))
        tok = tokenizer or AutoTokenizer.from_pretrained(
            source, **({} if source != official else {"revision": revision}))
    except Exception as exc:
        where = f" at revision {revision}" if revision else ""
        raise ModelSourceError(
            f"cannot load {official}{where}: {type(exc).__name__}: {exc}") from exc
    whash = weights_hash(hf_model.state_dict())
    # The checkpoint's own HF model is passed in, so TransformerLens converts exactly
    # these weights (its config is the same at every revision).
    try:
        model = HookedTransformer.from_pretrained(
            official, hf_model=hf_model, tokenizer=tok, device=device, dtype=dtype,
            fold_ln=True, center_writing_weights=True, center_unembed=True,
            **_revision_kwargs(revision))  # its config at this revision
    except (OSError, ValueError) as exc:
        raise ModelSourceError(
            f"cannot convert {official} at {revision or 'main'}: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''} (cached revisions: "
            f"{cached_revisions(official)})") from exc
    model.eval()
    info = _info(official, "hub", checkpoint, revision, whash, model, tok)
    return LoadedModel(model, tok, info)


def _inspect_builtin(name, checkpoint, builtin_config=None, cache_root=None, **_) -> ModelShape:
    cfg = _builtin_config(name, builtin_config, cache_root)
    steps = builtin.available_steps(cfg, cache_root)
    if not steps:
        raise ModelSourceError(f"{name!r} has no checkpoints yet; train it first "
                               "(ncat train-builtin)")
    if checkpoint is not None and checkpoint not in steps:
        raise ModelSourceError(f"built-in checkpoint step {checkpoint} not found; "
                               f"available steps: {steps}")
    return ModelShape(cfg.n_layers, detect_number_tokens(builtin.builtin_tokenizer()))


def _canonical_builtin(name, builtin_config=None, cache_root=None, **_) -> str:
    return builtin.model_name(_builtin_config(name, builtin_config, cache_root))


def _inspect_gguf(name, checkpoint, **_) -> ModelShape:
    path = _gguf_path(name, checkpoint)
    return _inspect_gguf_file(path)


def _canonical_path(name, **_) -> str:
    return str(Path(name).resolve())


def _hub_revision(target: str, checkpoint: int | None) -> str | None:
    if checkpoint is None:
        return None
    labels = _published_steps(target)
    if labels is None:
        raise ModelSourceError(f"{target} has no training checkpoints; got checkpoint "
                               f"{checkpoint}")
    if checkpoint in labels and _hub_offline() and checkpoint not in _cached_steps(target):
        cached = _cached_steps(target)
        raise ModelSourceError(
            f"checkpoint step {checkpoint} of {target} is not in the offline Hugging Face "
            f"cache (HF_HUB_OFFLINE is set); cached steps: "
            f"{cached if cached else 'none'} (revisions {cached_revisions(target)})")
    if checkpoint not in labels:
        near = sorted(sorted(labels, key=lambda s: abs(s - checkpoint))[:5])
        raise ModelSourceError(f"checkpoint step {checkpoint} does not exist for {target}; "
                               f"nearest published steps: {near} ({len(labels)} in all, "
                               f"{labels[0]}..{labels[-1]})")
    return f"step{checkpoint}"


def _inspect_hf(target: str, revision: str | None) -> ModelShape:
    """Layers and number tokens from a Hugging Face config and tokenizer (no weights)."""
    from transformers import AutoConfig, AutoTokenizer

    try:
        hf_cfg = AutoConfig.from_pretrained(target, revision=revision)
        tok = AutoTokenizer.from_pretrained(target, revision=revision)
    except Exception as exc:
        where = f" at revision {revision}" if revision else ""
        raise ModelSourceError(f"cannot read {target}{where}: {type(exc).__name__}: "
                               f"{exc}") from exc
    n_layers = getattr(hf_cfg, "num_hidden_layers", None) or hf_cfg.n_layer
    # TransformerLens prepends BOS for most architectures, not for GPT-NeoX (Pythia)
    prepend = hf_cfg.model_type != "gpt_neox"
    return ModelShape(int(n_layers), detect_number_tokens(tok, prepend_bos=prepend))


def check_weight_files(folder: Path) -> None:
    """Raise ModelSourceError unless every safetensors file of ``folder`` (and every shard
    its index names) is whole: the header parses and the file is exactly as long as the
    header says. Reads headers only."""
    import json
    import struct

    index = folder / "model.safetensors.index.json"
    if index.exists():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (ValueError, KeyError) as exc:
            raise ModelSourceError(f"{index} is not a safetensors index: {exc}") from None
        missing = sorted(x for x in shards if not (folder / x).exists())
        if missing:
            raise ModelSourceError(f"{folder}: the index names weight files that are missing: "
                                   f"{', '.join(missing)}")
    for path in sorted(folder.glob("*.safetensors")):
        size = path.stat().st_size
        try:
            with open(path, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                if n > size - 8:
                    raise ValueError(f"a header of {n} bytes in a file of {size}")
                header = json.loads(f.read(n))
            end = max((int(t["data_offsets"][1]) for k, t in header.items()
                       if k != "__metadata__"), default=0)
        except (ValueError, KeyError, TypeError, struct.error) as exc:
            raise ModelSourceError(f"weight file {path} is not valid safetensors ({exc}); "
                                   "is it truncated?") from None
        if size != 8 + n + end:
            raise ModelSourceError(f"weight file {path} holds {size:,} bytes but its header "
                                   f"describes {8 + n + end:,}: it is truncated or damaged")


def _inspect_local(name, checkpoint, **_) -> ModelShape:
    if checkpoint is not None:
        raise ModelSourceError(f"local model directory {name!r} has no training checkpoints; "
                               f"got checkpoint {checkpoint}")
    check_weight_files(Path(name))
    return _inspect_hf(name, None)


def _inspect_hub(name, checkpoint, **_) -> ModelShape:
    target = _official_name(name)
    return _inspect_hf(target, _hub_revision(target, checkpoint))


def _canonical_hub(name, **_) -> str:
    return _official_name(name)


register_source(Source("builtin", _is_builtin, _load_builtin, _builtin_checkpoints,
                       _inspect_builtin, _canonical_builtin))
register_source(Source("known", _is_known, _load_known, lambda name, **_: None, _inspect_known,
                       lambda name, **_: name))
register_source(Source("gguf", _is_gguf, _load_gguf, lambda name, **_: None, _inspect_gguf,
                       _canonical_path))
register_source(Source("local", _is_local, _load_local, lambda name, **_: None, _inspect_local,
                       _canonical_path))
register_source(Source("hub", lambda name: True, _load_hub, _hub_checkpoints, _inspect_hub,
                       _canonical_hub))


def find_source(name: str) -> Source:
    """The first registered source that accepts ``name``."""
    if not name:
        raise ModelSourceError("model name is empty")
    p = Path(name)
    if (name.startswith((".", "/", "~")) or p.suffix == ".gguf") and not p.exists():
        raise ModelSourceError(f"path {name!r} does not exist")
    if p.is_dir() and not _is_local(name):
        raise ModelSourceError(f"directory {name!r} is not a Hugging Face model (no config.json)")
    for source in SOURCES.values():
        if source.accepts(name):
            return source
    raise ModelSourceError(f"no model source accepts {name!r}")


def _quiet(fn, *args, **kwargs):
    """Call fn with stdout captured: TransformerLens prints progress notes on load."""
    with contextlib.redirect_stdout(io.StringIO()):
        return fn(*args, **kwargs)


def load_model(
    name: str,
    checkpoint: int | None = None,
    *,
    tokenizer=None,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    builtin_config: builtin.TrainConfig | None = None,
    cache_root: Path | None = None,
) -> LoadedModel:
    """Load ``name`` at training step ``checkpoint`` (None: the final weights).

    Weights are read, hashed and processed (LayerNorm folding, centering) in float32 and
    then cast to ``dtype``, so a checkpoint's weights hash does not depend on the dtype a
    run asks for, and the processing does not round twice.
    """
    source = find_source(name)
    lm = _quiet(source.load, name, checkpoint, tokenizer=tokenizer, device=device,
                dtype=torch.float32, builtin_config=builtin_config, cache_root=cache_root)
    if dtype != torch.float32:
        lm.model.to(dtype)
        lm.model.cfg.dtype = dtype
    transposed_layout(lm.model)
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
