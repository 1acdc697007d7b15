"""The image's files, installed alone, start: what `pip install .` in the Dockerfile
installs, built here without Docker (the Dockerfile's copies laid out as its WORKDIR, a
wheel of them, the wheel installed alone into a folder). Every module of the project's
packages is in it and imports from there; `ncat migrate` migrates an empty database from
the installed package (it once looked for alembic.ini in site-packages and stopped, and
the worker and explorer, which wait on it, never started), and `ncat catalog` stores a
checkpoint through it, against the real PostgreSQL."""

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from catalog.builtin import model_name
from schema import store

ROOT = Path(__file__).resolve().parents[2]


def _image_context(dest: Path) -> Path:
    """The files the Dockerfile copies into its WORKDIR, laid out as the image has them."""
    app = dest / "app"
    app.mkdir()
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if not line.startswith("COPY "):
            continue
        *sources, target = shlex.split(line)[1:]
        for src in sources:
            to = app / (src if target.endswith("/") or target == "./" else target)
            if (ROOT / src).is_dir():
                shutil.copytree(ROOT / src, to, ignore=shutil.ignore_patterns(
                    "__pycache__", "*.pyc"))
            else:
                to.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / src, to)
    return app


def test_the_image_installs_every_module_migrates_and_catalogs(tmp_path, empty_db,
                                                                  tiny_builtin):
    """Module doc; the image once lacked reports/, which the explorer imports."""
    app = _image_context(tmp_path)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path / "dist"), str(app)], check=True,
                   capture_output=True, timeout=600)
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    import tomllib
    import zipfile

    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"]["find"]["include"]
    packages = sorted(p.rstrip("*") for p in include)
    modules = sorted(str(p.relative_to(ROOT)) for pkg in packages
                     for p in (ROOT / pkg).rglob("*.py") if "__pycache__" not in p.parts)
    in_wheel = set(zipfile.ZipFile(wheel).namelist())
    assert [m for m in modules if m not in in_wheel] == []
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                    str(site), str(wheel)], check=True, capture_output=True, timeout=600)
    # each module imported from the installed copy, not from this checkout (scripts that
    # run on import, Streamlit's page file and the __main__ entry points, are not imported)
    # (nor are Alembic's scripts, which only Alembic loads: `ncat migrate` runs them below)
    names = [m[:-3].replace("/", ".").removesuffix(".__init__") for m in modules
             if not m.endswith(("__main__.py", "ui/app.py"))
             and not m.startswith("migrations/")]
    assert "migrations/script.py.mako" in in_wheel
    code = ("import importlib, sys\n"
            f"site = {str(site)!r}\n"
            "bad = []\n"
            f"for name in {names!r}:\n"
            "    mod = importlib.import_module(name)\n"
            "    if not mod.__file__.startswith(site):\n"
            "        bad.append((name, mod.__file__))\n"
            "print(len(bad), bad[:3])\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(site)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("0 "), done.stdout
    # the installed copy alone, run from a folder that is not a checkout: migrate an empty
    # database to head, then catalog the tiny built-in model's last checkpoint
    cfg, root = tiny_builtin
    env = {**os.environ, "PYTHONPATH": str(site), "NCAT_HOME": str(root.parent)}
    env.pop("DATABASE_URL", None)

    def ncat(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "jobs.cli", *argv], cwd=tmp_path,
                              capture_output=True, text=True, timeout=600, env=env)

    done = ncat("migrate", "--database-url", empty_db)
    assert done.returncode == 0, done.stderr[-3000:]
    from schema.engine import current_revision, head_revision

    assert current_revision(empty_db) == head_revision()
    done = ncat("catalog", model_name(cfg), "--ops", "+", "--hi", "12", "--pairs", "6",
                "--faithfulness-prompts", "30", "--quiet", "--database-url", empty_db)
    assert done.returncode == 0, done.stderr[-3000:]
    with store.connect(empty_db) as conn:
        n_layers, d_mlp = conn.execute("SELECT n_layers, d_mlp FROM model WHERE name = %s",
                                       (model_name(cfg),)).fetchone()
        assert store.scalar(conn.execute("SELECT count(*) FROM layer_result")) == n_layers
        assert store.scalar(conn.execute("SELECT count(*) FROM neuron_op")) == n_layers * d_mlp
        assert store.scalar(conn.execute("SELECT count(*) FROM checkpoint_summary")) == 1
