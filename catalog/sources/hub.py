"""A TransformerLens / Hugging Face hub name (``EleutherAI/pythia-14m``), with a
training checkpoint given as a step: Pythia's revisions ``step{N}`` (TransformerLens's
labels), or the step in the repository's branch names (OLMo's ``step{N}-tokens{M}B`` and
``stage1-step{N}-tokens{M}B``). The checkpoint's own transformers model is converted and
checked as every source's is (``catalog.sources.hf``). With ``HF_HUB_OFFLINE=1`` the same
code reads the local Hugging Face cache."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from transformer_lens import loading_from_pretrained as tl_loading

from catalog.core.weights import weights_hash
from catalog.sources.base import LoadedModel, ModelShape, ModelSourceError, Source, model_info
from catalog.sources.hf import from_hf_model, inspect_hf
from catalog.sources.streaming import load_streamed_or_none


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


# a training step in a branch name: Pythia's step1000, OLMo's step1000-tokens4B, OLMo 2's
# stage1-step1000-tokens3B
_STEP = re.compile(r"(?:^|-)step(\d+)(?:-|$)")


def step_revisions(revisions: Iterable[str]) -> dict[int, str]:
    """Training step -> the revision (branch) that holds it, from branch names that carry a
    step. Where several branches carry one step (OLMo 2's later stages and their
    ingredients count their own steps), the main run's: a name that starts with ``step``
    or ``stage1-``, else the first in sorted order."""
    found: dict[int, list[str]] = {}
    for name in revisions:
        m = _STEP.search(name)
        if m:
            found.setdefault(int(m.group(1)), []).append(name)
    return {step: sorted(names, key=lambda n: (not n.startswith(("step", "stage1-")), n))[0]
            for step, names in sorted(found.items())}


def _hub_branches(official: str) -> list[str]:
    """The repository's branches on the hub; offline (HF_HUB_OFFLINE) or where the hub does
    not answer, the revisions the local cache holds."""
    if not _hub_offline():
        from huggingface_hub import list_repo_refs

        try:
            return [b.name for b in list_repo_refs(official).branches]
        except Exception:  # noqa: BLE001 - no network, a private repo: what the cache holds
            pass
    return cached_revisions(official)


def _cached_steps(official: str) -> list[int]:
    return list(step_revisions(cached_revisions(official)))


def _published(official: str) -> dict[int, str] | None:
    """Published training step -> revision: TransformerLens's labels where it has them
    (Pythia: ``step{N}``), else the steps in the hub's branch names (OLMo)."""
    try:
        labels, label_type = tl_loading.get_checkpoint_labels(official)
    except ValueError:
        labels, label_type = None, None
    if labels is not None:
        return {int(s): f"step{s}" for s in labels} if label_type == "step" else None
    return step_revisions(_hub_branches(official)) or None


def _published_steps(official: str) -> list[int] | None:
    published = _published(official)
    return None if published is None else list(published)


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
    at = {} if source != official else {"revision": revision}
    where = f" at revision {revision}" if revision else ""
    try:
        tok = tokenizer or AutoTokenizer.from_pretrained(source, **at)
    except Exception as exc:
        raise ModelSourceError(
            f"cannot load {official}{where}: {type(exc).__name__}: {exc}") from exc
    # a cached snapshot's safetensors, one tensor at a time in the working dtype
    streamed = (load_streamed_or_none(Path(source), None, tok, official, device, dtype)
                if source != official else None)
    if streamed is not None:
        model, whash = streamed
        return LoadedModel(model, tok, model_info(official, "hub", checkpoint, revision,
                                                  whash, model, tok))
    try:
        hf_model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, **at)
    except Exception as exc:
        raise ModelSourceError(
            f"cannot load {official}{where}: {type(exc).__name__}: {exc}") from exc
    whash = weights_hash(hf_model.state_dict())
    # the checkpoint's own model is converted (its config at this revision), checked
    # against transformers as every other source's
    try:
        model = from_hf_model(hf_model, tok, official, device, torch.float32,
                              release_source=True)
    except ModelSourceError:
        raise
    except (OSError, ValueError) as exc:
        raise ModelSourceError(
            f"cannot convert {official} at {revision or 'main'}: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''} (cached revisions: "
            f"{cached_revisions(official)})") from exc
    model.eval()
    info = model_info(official, "hub", checkpoint, revision, whash, model, tok)
    return LoadedModel(model, tok, info)


def _hub_revision(target: str, checkpoint: int | None) -> str | None:
    if checkpoint is None:
        return None
    published = _published(target)
    if published is None:
        raise ModelSourceError(f"{target} has no training checkpoints; got checkpoint "
                               f"{checkpoint}")
    labels = list(published)
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
    return published[checkpoint]


def _inspect_hub(name, checkpoint, **_) -> ModelShape:
    target = _official_name(name)
    return inspect_hf(target, _hub_revision(target, checkpoint))


def _canonical_hub(name, **_) -> str:
    return _official_name(name)


SOURCE = Source("hub", lambda name: True, _load_hub, _hub_checkpoints, _inspect_hub,
                _canonical_hub, loads_in_dtype=True)
