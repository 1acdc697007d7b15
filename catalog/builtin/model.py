"""The built-in model's architecture, its training configuration, and the checkpoint cache.

Checkpoints live in ``<root>/<TrainConfig.key()>/step{N}.pt`` (plus a JSON of held-out
accuracies and the weights hash); the default root is ``NCAT_HOME/builtin``.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from catalog.builtin.vocab import MAX_NUMBER, builtin_vocab
from catalog.config.settings import get_settings
from catalog.core.arith import OPERATORS
from catalog.core.weights import weights_hash

BUILTIN_NAME = "builtin-arith"


N_CTX = 8  # positions the built-in model reads: BOS, a, op, b, "=", the answer, spares


def builtin_model_config(
    n_layers: int = 2, d_model: int = 128, n_heads: int = 4, d_mlp: int = 512
) -> HookedTransformerConfig:
    """TransformerLens config of the built-in model (defaults: about 0.66M parameters)."""
    if d_model % n_heads:
        raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
    return HookedTransformerConfig(
        n_layers=n_layers,
        d_model=d_model,
        n_heads=n_heads,
        d_head=d_model // n_heads,
        d_mlp=d_mlp,
        d_vocab=len(builtin_vocab()),
        n_ctx=N_CTX,
        act_fn="gelu",
        normalization_type="LN",
        positional_embedding_type="standard",
        model_name=BUILTIN_NAME,
        default_prepend_bos=True,
        seed=None,
    )


# 2: deterministic algorithms; 3: trained in a child process with pinned numerics
TRAINER_VERSION = 3


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines the built-in model's checkpoints (hashed into the cache key)."""

    n_layers: int = 2
    d_model: int = 128
    n_heads: int = 4
    d_mlp: int = 512
    operand_hi: int = 300  # operands a, b in [0, operand_hi), as in the heuristics paper's grid
    steps: int = 3000
    batch_size: int = 512
    lr: float = 5e-3
    weight_decay: float = 0.1
    warmup_steps: int = 100
    holdout_fraction: float = 0.1
    seed: int = 0
    eval_prompts_per_op: int = 2000
    extra_steps: tuple[int, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if not 1 < self.operand_hi <= MAX_NUMBER + 1:
            raise ValueError(f"operand_hi must be in (1, {MAX_NUMBER + 1}], got {self.operand_hi}")
        if not 0 < self.holdout_fraction < 1:
            raise ValueError(f"holdout_fraction must be in (0, 1), got {self.holdout_fraction}")
        if self.batch_size < len(OPERATORS):
            raise ValueError(f"batch_size must be >= {len(OPERATORS)}, got {self.batch_size}")


    def key(self) -> str:
        """Deterministic short hash naming this configuration's checkpoint folder (and the
        trainer's version, so a changed trainer never reuses an old run)."""
        blob = json.dumps({**asdict(self), "trainer": TRAINER_VERSION}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    def checkpoint_steps(self) -> list[int]:
        """Pythia-like schedule: 0, 1, 2, 4, ... below ``steps``, then ``steps`` itself."""
        out = [0]
        s = 1
        while s < self.steps:
            out.append(s)
            s *= 2
        out.append(self.steps)
        out.extend(x for x in self.extra_steps if 0 <= x <= self.steps)
        return sorted(set(out))


def model_name(cfg: TrainConfig) -> str:
    """Catalog name of a built-in model: ``builtin-arith``; ``builtin-arith@seed<N>`` for
    the default model trained from another seed (the views group a name's seeds:
    migration 0031); ``builtin-arith@<key>`` for a variant trained with other settings
    (its cache folder name)."""
    if cfg == TrainConfig():
        return BUILTIN_NAME
    if cfg == TrainConfig(seed=cfg.seed):
        return f"{BUILTIN_NAME}@seed{cfg.seed}"
    return f"{BUILTIN_NAME}@{cfg.key()}"


def config_from_name(name: str, root: Path | None = None) -> TrainConfig:
    """The TrainConfig that ``builtin``, ``builtin-arith`` or ``builtin-arith@<key>`` names.

    A variant's settings are read from ``train_config.json`` in its cache folder.
    """
    base, _, key = name.partition("@")
    if base not in ("builtin", BUILTIN_NAME):
        raise ValueError(f"{name!r} is not a built-in model name")
    if not key:
        return TrainConfig()
    if re.fullmatch(r"seed\d+", key):
        return TrainConfig(seed=int(key[4:]))
    path = (root or default_cache_root()) / key / "train_config.json"
    if not path.exists():
        have = sorted(p.name for p in (root or default_cache_root()).glob("*") if p.is_dir())
        raise FileNotFoundError(f"no built-in model variant {key!r} in "
                                f"{root or default_cache_root()}; cached variants: {have}")
    data = json.loads(path.read_text())
    data["extra_steps"] = tuple(data.get("extra_steps", ()))
    return TrainConfig(**data)


def default_cache_root() -> Path:
    """Built-in checkpoints live in ``$NCAT_HOME/builtin`` (default ``~/.cache/neuron-catalog``)."""
    return get_settings().builtin_root


def checkpoint_dir(cfg: TrainConfig, root: Path | None = None) -> Path:
    return (root or default_cache_root()) / cfg.key()


def checkpoint_path(cfg: TrainConfig, step: int, root: Path | None = None) -> Path:
    return checkpoint_dir(cfg, root) / f"step{step}.pt"


def available_steps(cfg: TrainConfig, root: Path | None = None) -> list[int]:
    """Steps whose checkpoint files exist in the cache for this configuration."""
    d = checkpoint_dir(cfg, root)
    if not d.is_dir():
        return []
    steps = []
    for p in d.glob("step*.pt"):
        try:
            steps.append(int(p.stem[4:]))
        except ValueError:
            continue
    return sorted(steps)


def load_checkpoint(
    cfg: TrainConfig, step: int, root: Path | None = None, device: str = "cpu"
) -> tuple[HookedTransformer, dict]:
    """Load one cached checkpoint as a weight-processed HookedTransformer.

    Weight processing (fold_ln, center_writing_weights, center_unembed) matches what
    ``HookedTransformer.from_pretrained`` does for hub models, so the logit lens
    means the same thing for every source. Returns the model and the raw-weights
    metadata (step, weights hash, accuracies).
    """
    path = checkpoint_path(cfg, step, root)
    if not path.exists():
        have = available_steps(cfg, root)
        raise FileNotFoundError(
            f"built-in checkpoint step {step} not found in {checkpoint_dir(cfg, root)}; "
            f"available steps: {have or 'none (train it first: ncat train-builtin)'}"
        )
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
        sd = blob["state_dict"]
    except Exception as exc:  # corrupt or truncated file: say which one
        raise ValueError(f"built-in checkpoint {path} cannot be read: {exc}") from exc
    meta_path = path.with_suffix(".json")
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {"step": step}
    meta["weights_hash"] = weights_hash(sd)
    model = HookedTransformer(
        builtin_model_config(cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.d_mlp),
        tokenizer=None,
        move_to_device=False,
    )
    model.load_and_process_state_dict(
        sd, fold_ln=True, center_writing_weights=True, center_unembed=True
    )
    model.to(device)
    model.eval()
    return model, meta
