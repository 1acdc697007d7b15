"""The built-in arithmetic model: the catalog's offline stand-in for Pythia checkpoints.

Real language models cannot be downloaded on every machine, yet every part of the
catalog (measurements, storage, training dynamics) needs a model with checkpoints
that really learned arithmetic. This module defines a small transformer with one
token per integer 0..999, the four operator tokens, ``=`` and a BOS token, and a
seeded, deterministic trainer on ``a op b =`` prompts. Checkpoints are saved at
log-spaced steps (0, 1, 2, 4, ..., like Pythia's early schedule) plus the final
step, cached on disk, and reused by every later call with the same settings.

The model is a plain TransformerLens ``HookedTransformer``, so every measurement
runs on it exactly as on a hub model.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from tokenizers import Regex, Tokenizer, pre_tokenizers
from tokenizers.models import WordLevel
from transformer_lens import HookedTransformer, HookedTransformerConfig
from transformers import PreTrainedTokenizerFast

from catalog.arith import OPERATORS, apply_op, is_valid
from catalog.grids import final_logits

log = logging.getLogger(__name__)

MAX_NUMBER = 999
SPECIAL_TOKENS = ["<bos>", "<pad>", "<unk>"]
SYMBOL_TOKENS = list(OPERATORS) + ["="]
BUILTIN_NAME = "builtin-arith"


def builtin_vocab() -> dict[str, int]:
    """Token string -> id for the built-in model: specials, operators, '=', then 0..999."""
    tokens = SPECIAL_TOKENS + SYMBOL_TOKENS + [str(n) for n in range(MAX_NUMBER + 1)]
    return {t: i for i, t in enumerate(tokens)}


def builtin_tokenizer() -> PreTrainedTokenizerFast:
    """A Hugging Face fast tokenizer with one token per integer 0..999.

    Numbers above 999 become ``<unk>``, so the single-token limit detected from it
    is 999, as for Llama 3.
    """
    vocab = builtin_vocab()
    tok = Tokenizer(WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(
        Regex(r"<bos>|<pad>|<unk>|\d+|[^\d\s]"), behavior="isolated"
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", pad_token="<pad>", unk_token="<unk>"
    )
    fast.add_bos_token = True  # read by catalog.tokens: the model expects BOS first
    return fast


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
        n_ctx=8,
        act_fn="gelu",
        normalization_type="LN",
        positional_embedding_type="standard",
        model_name=BUILTIN_NAME,
        default_prepend_bos=True,
        seed=None,
    )


# 2: deterministic algorithms (runs are bitwise reproducible across processes)
TRAINER_VERSION = 2


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
    """Catalog name of a built-in model: ``builtin-arith``, or ``builtin-arith@<key>`` for a
    variant trained with other settings (its cache folder name)."""
    return BUILTIN_NAME if cfg == TrainConfig() else f"{BUILTIN_NAME}@{cfg.key()}"


def config_from_name(name: str, root: Path | None = None) -> TrainConfig:
    """The TrainConfig that ``builtin``, ``builtin-arith`` or ``builtin-arith@<key>`` names.

    A variant's settings are read from ``train_config.json`` in its cache folder.
    """
    base, _, key = name.partition("@")
    if base not in ("builtin", BUILTIN_NAME):
        raise ValueError(f"{name!r} is not a built-in model name")
    if not key:
        return TrainConfig()
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
    home = os.environ.get("NCAT_HOME") or os.path.join(Path.home(), ".cache", "neuron-catalog")
    return Path(home) / "builtin"


# ---------------------------------------------------------------- data


@dataclass
class ArithmeticData:
    """All valid training prompts for the four operators, split into train and held-out."""

    tokens: dict[str, torch.Tensor]  # op -> (n, 5) int64 [BOS, a, op, b, =]
    answers: dict[str, torch.Tensor]  # op -> (n,) answer token id
    is_train: dict[str, torch.Tensor]  # op -> (n,) bool


def build_data(cfg: TrainConfig) -> ArithmeticData:
    """Every valid ``a op b =`` prompt with a, b in [0, operand_hi); seeded train/held-out split."""
    vocab = builtin_vocab()
    num_id = np.array([vocab[str(n)] for n in range(MAX_NUMBER + 1)])
    rng = np.random.default_rng(cfg.seed)
    a, b = np.meshgrid(np.arange(cfg.operand_hi), np.arange(cfg.operand_hi), indexing="ij")
    a, b = a.ravel(), b.ravel()
    tokens, answers, is_train = {}, {}, {}
    for op in OPERATORS:
        ok = is_valid(op, a, b, MAX_NUMBER)
        aa, bb = a[ok], b[ok]
        res = apply_op(op, aa, bb)
        seq = np.stack(
            [
                np.full_like(aa, vocab["<bos>"]),
                num_id[aa],
                np.full_like(aa, vocab[op]),
                num_id[bb],
                np.full_like(aa, vocab["="]),
            ],
            axis=1,
        )
        tokens[op] = torch.from_numpy(seq).long()
        answers[op] = torch.from_numpy(num_id[res]).long()
        is_train[op] = torch.from_numpy(rng.random(len(aa)) >= cfg.holdout_fraction)
    return ArithmeticData(tokens, answers, is_train)


def last_position_logits(model: HookedTransformer, tokens: torch.Tensor) -> torch.Tensor:
    """Logits at the last position only (skips the unembedding of earlier positions)."""
    resid = model(tokens, stop_at_layer=model.cfg.n_layers)[:, -1:]
    return final_logits(model, resid)[:, 0]


@torch.no_grad()
def evaluate(
    model: HookedTransformer, data: ArithmeticData, held_out: bool, limit: int | None = None
) -> dict[str, float]:
    """Accuracy per operator on held-out (or training) prompts, first ``limit`` of each."""
    accs = {}
    for op in OPERATORS:
        mask = ~data.is_train[op] if held_out else data.is_train[op]
        toks, ans = data.tokens[op][mask], data.answers[op][mask]
        if limit is not None:
            toks, ans = toks[:limit], ans[:limit]
        if len(toks) == 0:
            accs[op] = float("nan")
            continue
        pred = torch.cat([last_position_logits(model, t).argmax(-1) for t in toks.split(4096)])
        accs[op] = float((pred == ans).float().mean())
    return accs


# ---------------------------------------------------------------- training


def weights_hash(state_dict: dict[str, torch.Tensor]) -> str:
    """SHA-256 over parameter names, dtypes, shapes and raw bytes, in sorted name order."""
    h = hashlib.sha256()
    for name in sorted(state_dict):
        t = state_dict[name].detach().to("cpu").contiguous()
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


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


def _lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    frac = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * 0.5 * (1 + np.cos(np.pi * min(1.0, frac)))


def train(
    cfg: TrainConfig | None = None,
    root: Path | None = None,
    progress: bool = True,
) -> Path:
    """Train the built-in model, saving every checkpoint of the schedule; reuse a finished run.

    Returns the checkpoint folder. Deterministic for a given config on a given
    torch build: the seed fixes initialisation, the split and every batch.
    """

    cfg = cfg or TrainConfig()
    out = checkpoint_dir(cfg, root)
    schedule = cfg.checkpoint_steps()
    if all(checkpoint_path(cfg, s, root).exists() for s in schedule):
        log.info("built-in checkpoints already cached in %s", out)
        return out
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".training.lock", "w") as lock:
        # one trainer per folder: a second process (another demo, a test) waits, then
        # finds the finished run
        fcntl.flock(lock, fcntl.LOCK_EX)
        if all(checkpoint_path(cfg, s, root).exists() for s in schedule):
            return out
        _train(cfg, root, out, schedule, progress)
    return out


def _train(cfg: TrainConfig, root: Path | None, out: Path, schedule: list[int],
           progress: bool) -> None:
    # Bitwise reproducible on a given torch build: without this, the embedding gradient's
    # multi-threaded accumulation differs between processes from the first step on, and
    # this small model's late jump in accuracy then lands differently (held-out "-" was
    # 0.995 in one run and 0.894 in another).
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        _train_loop(cfg, root, out, schedule, progress)
    finally:
        torch.use_deterministic_algorithms(previous)


def _train_loop(cfg: TrainConfig, root: Path | None, out: Path, schedule: list[int],
                progress: bool) -> None:
    from tqdm.auto import tqdm

    (out / "train_config.json").write_text(json.dumps(asdict(cfg), indent=2, sort_keys=True))

    torch.manual_seed(cfg.seed)
    model = HookedTransformer(
        builtin_model_config(cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.d_mlp)
    )
    data = build_data(cfg)
    train_idx = {op: torch.nonzero(data.is_train[op])[:, 0] for op in OPERATORS}
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                            betas=(0.9, 0.98))
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    per_op = cfg.batch_size // len(OPERATORS)
    to_save = set(schedule)

    bar = tqdm(total=cfg.steps, desc="training built-in model", disable=not progress, unit="step")
    loss_val = float("nan")
    for step in range(cfg.steps + 1):
        if step in to_save:
            _save_checkpoint(model, data, cfg, step, checkpoint_path(cfg, step, root))
            acc = json.loads(checkpoint_path(cfg, step, root).with_suffix(".json").read_text())
            bar.set_postfix(loss=f"{loss_val:.3f}", **{
                f"acc{op}": f"{acc['heldout_accuracy'][op]:.2f}" for op in OPERATORS
            })
        if step == cfg.steps:
            break
        for g in opt.param_groups:
            g["lr"] = _lr_at(step, cfg)
        toks, ans = [], []
        for op in OPERATORS:
            pick = train_idx[op][torch.randint(len(train_idx[op]), (per_op,), generator=gen)]
            toks.append(data.tokens[op][pick])
            ans.append(data.answers[op][pick])
        logits = last_position_logits(model, torch.cat(toks))
        loss = torch.nn.functional.cross_entropy(logits, torch.cat(ans))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss_val = loss.item()
        bar.update(1)
        if step % 50 == 0:
            bar.set_postfix_str(f"loss={loss_val:.3f}", refresh=False)
    bar.close()


def _save_checkpoint(
    model: HookedTransformer, data: ArithmeticData, cfg: TrainConfig, step: int, path: Path
) -> None:
    was_training = model.training
    model.eval()
    metrics = {
        "step": step,
        "heldout_accuracy": evaluate(model, data, held_out=True, limit=cfg.eval_prompts_per_op),
        "train_accuracy": evaluate(model, data, held_out=False, limit=cfg.eval_prompts_per_op),
    }
    model.train(was_training)
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    metrics["weights_hash"] = weights_hash(sd)
    tmp = path.with_suffix(".tmp")
    torch.save({"state_dict": sd, "train_config": asdict(cfg), "step": step}, tmp)
    os.replace(tmp, path)  # atomic: a crash never leaves a half-written checkpoint
    path.with_suffix(".json").write_text(json.dumps(metrics, indent=2, sort_keys=True))


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
