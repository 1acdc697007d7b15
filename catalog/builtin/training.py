"""Training the built-in model: data, evaluation, and a trainer whose checkpoints are the
same bits on every machine of one CPU vendor that can run it, whatever its thread count
(Intel and AMD differ even on the pinned AVX2 paths; docs/training.md).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from transformer_lens import HookedTransformer

from catalog.builtin.model import (
    TrainConfig,
    builtin_model_config,
    checkpoint_dir,
    checkpoint_path,
    default_cache_root,
)
from catalog.builtin.vocab import MAX_NUMBER, builtin_vocab
from catalog.config.settings import child_env
from catalog.core.arith import OPERATORS, apply_op, is_valid
from catalog.core.progress import progress_bar
from catalog.core.weights import weights_hash
from catalog.measuring.grids import final_logits

log = logging.getLogger(__name__)


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
    ga, gb = np.meshgrid(np.arange(cfg.operand_hi), np.arange(cfg.operand_hi), indexing="ij")
    a, b = ga.ravel(), gb.ravel()
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


def _lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    frac = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * 0.5 * (1 + np.cos(np.pi * min(1.0, frac)))


# The trainer runs in a child process whose numerical libraries are pinned to one code
# path. Measured on torch 2.13 (MKL 2024.2, oneDNN 3.12) on an AVX-512 machine: a run
# with 1 thread and one with 2 threads gave different weights, and so did the AVX-512 and
# AVX2 kernels; with these pins, 1 and 2 threads gave the same bits. These variables are
# read once when the libraries start, which is why a fresh process is needed.
PINNED_NUMERICS = {
    "MKL_CBWR": "AVX2,STRICT",  # MKL's conditional numerical reproducibility, strict mode
    "ATEN_CPU_CAPABILITY": "avx2",  # torch's own vectorised kernels
    "ONEDNN_MAX_CPU_ISA": "AVX2",  # oneDNN (mkldnn) kernels
}


def train(
    cfg: TrainConfig | None = None,
    root: Path | None = None,
    progress: bool = True,
) -> Path:
    """Train the built-in model, saving every checkpoint of the schedule; reuse a finished run.

    Returns the checkpoint folder. The run happens in a child process with pinned
    numerics (``PINNED_NUMERICS``), so the checkpoints are the same bits for any
    thread count and any x86-64 CPU with AVX2, given the same torch build; the seed
    fixes initialisation, the split and every batch. A second caller for the same
    folder waits for the first and then reuses its run.
    """
    cfg = cfg or TrainConfig()
    root = root or default_cache_root()
    out = checkpoint_dir(cfg, root)
    schedule = cfg.checkpoint_steps()
    if all(checkpoint_path(cfg, s, root).exists() for s in schedule):
        log.info("built-in checkpoints already cached in %s", out)
        return out
    with training_lock(out):
        if all(checkpoint_path(cfg, s, root).exists() for s in schedule):
            return out
        _train_in_child(cfg, root, progress)
    return out


@contextmanager
def training_lock(out: Path):
    """The run folder ``out``'s training lock (created with the folder), held until the
    block ends: one trainer or adopter of a run at a time, the others wait."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".training.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def adopt(cfg: TrainConfig, source: Path, root: Path | None = None) -> bool:
    """Take a finished run of ``cfg`` from another cache root instead of training it again.

    ``source`` is a cache root like ``root`` (``<NCAT_HOME>/builtin``), for example the
    user's when the tests keep their own home. The run is taken only when it is finished
    (every checkpoint of the schedule with its metrics, no training state left) and its
    settings file equals ``cfg``, and every checkpoint's weights hash equals the one its
    training recorded; each file is then hard-linked (copied across file systems) into
    ``root``, written atomically, under the run's training lock (a ``train`` of it started
    meanwhile waits, then finds it whole). Returns whether the run was taken; with False
    nothing was changed but the run's (empty) folder and lock file (``root`` may hold the
    run already), and ``train`` goes on as before. The
    checkpoints are the same bits wherever they were trained (``train``), so a taken run
    equals a trained one.
    """
    root = root or default_cache_root()
    schedule = cfg.checkpoint_steps()
    if all(checkpoint_path(cfg, s, root).exists() for s in schedule):
        return False
    src = checkpoint_dir(cfg, source)
    if src.resolve() == checkpoint_dir(cfg, root).resolve():
        return False
    out = checkpoint_dir(cfg, root)
    # under the training lock: a ``train`` of the same run started meanwhile (the test
    # command adopts in the background while tests start) waits and then finds it whole
    with training_lock(out):
        if all(checkpoint_path(cfg, s, root).exists() for s in schedule):
            return False
        return _adopt_locked(cfg, src, out, schedule)


def _adopt_locked(cfg: TrainConfig, src: Path, out: Path, schedule: list[int]) -> bool:
    """``adopt``'s checks and links, its caller holding the training lock of ``out``."""
    names = ["train_config.json"] + [f"step{s}{ext}" for s in schedule for ext in (".pt", ".json")]
    if (src / STATE_FILE).exists() or not all((src / n).exists() for n in names):
        return False
    try:
        if json.loads((src / "train_config.json").read_text()) != json.loads(
                json.dumps(asdict(cfg))):
            return False
        for s in schedule:
            blob = torch.load(src / f"step{s}.pt", map_location="cpu", weights_only=True)
            recorded = json.loads((src / f"step{s}.json").read_text()).get("weights_hash")
            if recorded != weights_hash(blob["state_dict"]):
                log.warning("not taking %s: step %d's weights differ from its record", src, s)
                return False
    except Exception as exc:  # noqa: BLE001 - an unreadable run is trained again
        log.warning("not taking %s: %s", src, exc)
        return False
    # the settings and metrics first: ``train`` counts a run whole once every .pt is there
    for name in sorted(names, key=lambda n: n.endswith(".pt")):
        tmp = out / f".{name}.adopt"
        tmp.unlink(missing_ok=True)
        try:
            os.link(src / name, tmp)
        except OSError:
            shutil.copy2(src / name, tmp)
        os.replace(tmp, out / name)
    log.info("built-in checkpoints %s taken from %s", cfg.key(), src)
    return True


def _train_in_child(cfg: TrainConfig, root: Path, progress: bool) -> None:
    spec = json.dumps({"config": asdict(cfg), "root": str(root), "progress": progress,
                       "parent": os.getpid()})
    # the child imports this package from the same place as we do
    src = str(Path(__file__).resolve().parents[2])
    env = child_env(None, **PINNED_NUMERICS)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    done = subprocess.run([sys.executable, "-m", "catalog.builtin", spec], env=env, check=False,
                          preexec_fn=_die_with_parent)
    if done.returncode != 0:
        raise RuntimeError(f"training the built-in model {cfg.key()} failed in its child "
                           f"process (exit code {done.returncode}); its messages are above")


def _die_with_parent() -> None:
    """In the child, before it starts: on Linux, ask the kernel to end it when its parent
    dies (the parent holds the training lock). Elsewhere the child's own watchdog
    (``catalog.builtin.__main__``) notices once its imports are done."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def train_here(cfg: TrainConfig, root: Path, progress: bool) -> None:
    """The training run itself, in this process (``train`` calls it in a pinned child)."""
    out = checkpoint_dir(cfg, root)
    schedule = cfg.checkpoint_steps()
    # Without deterministic algorithms the embedding gradient's multi-threaded
    # accumulation differs between runs from the first step on.
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        _train_loop(cfg, root, out, schedule, progress)
    finally:
        torch.use_deterministic_algorithms(previous)


def _train_loop(cfg: TrainConfig, root: Path | None, out: Path, schedule: list[int],
                progress: bool) -> None:
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

    state_path = out / STATE_FILE
    start, loss_val = _resume(state_path, cfg, root, model, opt, gen)
    bar = progress_bar(cfg.steps, "training built-in model", "step", enabled=progress,
                       initial=start)
    for step in range(start, cfg.steps + 1):
        if step in to_save and not (step == start and start > 0):
            _save_checkpoint(model, data, cfg, step, checkpoint_path(cfg, step, root))
            _save_state(state_path, cfg, step, model, opt, gen, loss_val)
            acc = json.loads(checkpoint_path(cfg, step, root).with_suffix(".json").read_text())
            # no loss before the first step (it read "loss=nan")
            bar.set_postfix(**({} if loss_val != loss_val else {"loss": f"{loss_val:.3f}"}), **{
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
    state_path.unlink(missing_ok=True)  # every checkpoint is saved: nothing to resume


# What a run killed part-way resumes from: the model, the optimizer and the batch
# generator as they were when the latest checkpoint was saved (before that step's update).
# Continuing from them gives the same bits as a run that was never interrupted.
STATE_FILE = "training_state.pt"


def _save_state(path: Path, cfg: TrainConfig, step: int, model, opt, gen, loss: float) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"config": asdict(cfg), "step": step, "model": model.state_dict(),
                "opt": opt.state_dict(), "gen": gen.get_state(), "loss": loss}, tmp)
    os.replace(tmp, path)  # a kill while writing leaves the previous state whole


def _resume(path: Path, cfg: TrainConfig, root: Path | None, model, opt, gen
            ) -> tuple[int, float]:
    """(first step to run, last loss): 0 for a fresh run, else the step of the saved state,
    whose checkpoints (and all earlier ones) are on disk."""
    if not path.exists():
        return 0, float("nan")
    try:
        st = torch.load(path, weights_only=False)
    except Exception as exc:  # noqa: BLE001 - an unreadable state means a fresh start
        log.warning("cannot read the training state %s (%s); training from step 0", path, exc)
        return 0, float("nan")
    step = int(st.get("step", 0))
    saved = all(checkpoint_path(cfg, s, root).exists() for s in cfg.checkpoint_steps()
                if s <= step)
    if st.get("config") != asdict(cfg) or not saved:
        log.warning("training state %s does not match this run; training from step 0", path)
        return 0, float("nan")
    model.load_state_dict(st["model"])
    opt.load_state_dict(st["opt"])
    gen.set_state(st["gen"])
    log.warning("resuming the built-in model's training at step %d of %d (checkpoints up to "
                "it are on disk)", step, cfg.steps)
    return step, float(st["loss"])


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
