"""Every refusal of bad input that needs no model comes before any heavy import (issue 79):
flags, operand and checkpoint ranges, layers, prompts, database URLs, model paths that do
not exist, devices. All run through ``ncat``'s ``main`` in one fresh interpreter, which
after each refusal reports whether torch, TransformerLens or transformers was imported;
the last case passes every cheap check and must import torch to be refused (the control
that the probe sees an import when one happens). Timed by hand in docs/tests.md, never
here."""

import json
import os
import subprocess
import sys
import textwrap

HEAVY = ("torch", "transformer_lens", "transformers")

# (argv, what the one-line refusal must say)
CASES = [
    (["measure", "builtin", "--hi", "-1"], "operand range [0, -1)"),
    (["measure", "builtin", "--ops", "+%"], "%"),
    (["measure", "builtin", "--layers", "a"], "--layers must be comma-separated"),
    (["measure", "builtin", "--families", "range,squares"], "'squares' unknown"),
    (["measure", "builtin", "--checkpoint", "-3"], "--checkpoint must be a training step"),
    (["measure", "builtin", "--device", "tpu9"], "'tpu9' is not a torch device"),
    (["measure", "./no-such-model"], "path './no-such-model' does not exist"),
    (["catalog", "builtin", "--checkpoints", "5:1"], "checkpoint range must be start:stop:step"),
    (["catalog", "builtin", "--checkpoints", "9:1:1"], "is empty"),
    (["catalog", "/no/such/model.gguf"], "does not exist"),
    (["catalog", "builtin", "--database-url", "mysql://u@h/db"], "not PostgreSQL"),
    (["enqueue", "./no-such.gguf"], "does not exist"),
    (["enqueue", "builtin", "--checkpoints=-1,5"], "checkpoint steps must be >= 0"),
    (["enqueue", "builtin", "--database-url", ":::"], "cannot be read as a database URL"),
    (["migrate", "--database-url", "postgresql://u@localhost:notaport/db"],
     "--database-url cannot be read as a database URL"),
    (["explain", "builtin", "2+"], "'2+' is not an arithmetic prompt"),
    (["explain", "builtin", "7%3="], "is not an arithmetic prompt"),
    (["explain", "builtin", "500+1="], "must be in the config's range"),
    (["explain", "builtin", "--prompts-file", "/no/such/file"], "no such file"),
    (["explain", "./no-such-model", "1+2="], "does not exist"),
    (["plan", "./x.gguf"], "does not exist"),
    (["plan", "builtin", "--lo", "50", "--hi", "50"], "operand range"),
    (["checkpoints", "/no/such/dir"], "does not exist"),
    (["report", "builtin", "--database-url", "sqlite:///x.db"], "not PostgreSQL"),
    (["export", "v", "--out", "x.csv", "--database-url", "mysql://u@h/d?password=hush"],
     "names the 'mysql' backend"),
    (["train-builtin", "--seeds", "x"], "--seeds must be"),
    (["train-builtin", "--steps", "0"], "--steps must be at least 1"),
]
# passes every cheap check; refused only when the built-in model is inspected (no
# checkpoints in an empty home), which imports torch
CONTROL = (["measure", "builtin", "--hi", "10"], "train it first")

PROBE = textwrap.dedent("""
    import contextlib, io, json, sys
    from jobs.cli import main
    out = []
    for argv in json.loads(sys.argv[1]):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                rc = main(argv)
            except SystemExit as exc:
                rc = exc.code
        out.append({"rc": rc, "err": err.getvalue(),
                    "heavy": [m for m in sys.argv[2:] if m in sys.modules]})
    print(json.dumps(out))
""")


def test_every_refusal_comes_before_torch_is_imported(tmp_path):
    env = {**os.environ, "NCAT_HOME": str(tmp_path / "home")}
    env.pop("DATABASE_URL", None)
    argvs = [argv for argv, _ in CASES] + [CONTROL[0]]
    run = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argvs), *HEAVY], env=env,
                         capture_output=True, text=True, timeout=300, check=True)
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(got) == len(argvs)
    for (argv, says), r in zip(CASES, got[:-1], strict=True):
        assert r["rc"] == 2, (argv, r)
        lines = [x for x in r["err"].splitlines() if x.startswith("error:")]
        assert len(lines) == 1 and says in lines[0], (argv, r["err"])
        assert "Traceback" not in r["err"] and "hush" not in r["err"], (argv, r["err"])
        assert r["heavy"] == [], (argv, r["heavy"])  # refused before any heavy import
    control = got[-1]
    assert control["rc"] == 2 and CONTROL[1] in control["err"], control
    assert "torch" in control["heavy"], control  # the probe sees an import that happens


def test_a_bad_database_url_in_the_environment_is_refused_without_showing_it(tmp_path):
    """DATABASE_URL is checked as --database-url is, before any heavy import; the refusal
    names the setting, never the URL (its query string may hold a password)."""
    env = {**os.environ, "NCAT_HOME": str(tmp_path / "home"),
           "DATABASE_URL": "postgresql://u@localhost:notaport/db?password=hush"}
    run = subprocess.run([sys.executable, "-c", PROBE, json.dumps([["status"], ["migrate"]]),
                          *HEAVY], env=env, capture_output=True, text=True, timeout=120,
                         check=True)
    for r in json.loads(run.stdout.strip().splitlines()[-1]):
        assert r["rc"] == 2 and r["heavy"] == [], r
        assert "error: DATABASE_URL cannot be read as a database URL" in r["err"], r
        assert "hush" not in r["err"], r
