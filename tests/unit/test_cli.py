"""The command line without services: errors, and what the worker's parent imports."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]


def test_worker_parent_process_never_imports_torch():
    """CUDA can only be initialised by code that imports torch: the Celery parent must not."""
    code = ("import sys, jobs.cli, jobs.celery_app, jobs.tasks; "
            "print('torch' in sys.modules, 'catalog.run.measurement' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "REDIS_URL": "redis://127.0.0.1:1/0"}, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_status_cancel_and_retry_load_no_model_code():
    """`ncat status`, `cancel`, `retry` and the explorer's job list start in well under a
    second: they must not import torch or transformer_lens (seconds to load)."""
    code = ("import sys, jobs.cli, jobs.enqueue, schema.store, schema.engine; "
            "print('torch' in sys.modules, 'transformer_lens' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "REDIS_URL": "redis://127.0.0.1:1/0"}, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_worker_settings_suit_long_gpu_tasks(monkeypatch):
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("NCAT_VISIBILITY_TIMEOUT", "7200")
    from jobs.celery_app import make_app

    conf = make_app().conf
    assert conf.task_acks_late and conf.task_reject_on_worker_lost
    assert conf.worker_prefetch_multiplier == 1 and conf.worker_concurrency == 1
    assert conf.broker_transport_options["visibility_timeout"] == 7200


def test_importing_the_celery_app_starts_nothing():
    """Importing the app and its tasks resolves no broker (no port probe, no embedded
    Redis started): only reading the app's configuration does, with the settings then."""
    code = ("import jobs.broker as b\n"
            "def boom(*a, **k):\n    raise RuntimeError('broker resolved')\n"
            "b.resolve_redis_url = b.start_embedded_redis = boom\n"
            "import jobs.celery_app as c, jobs.tasks\n"
            "print('imported')\n"
            "try:\n    c.app.conf.broker_url\nexcept RuntimeError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, env={k: v for k, v in os.environ.items()
                                         if k != "REDIS_URL"}, check=True)
    assert out.stdout.split("\n")[:2] == ["imported", "broker resolved"], out.stdout


@pytest.mark.serial  # an import time against the allowance
def test_a_new_pool_process_has_time_to_import_the_science():
    """Celery's default allowance for a new pool process (4 s) is shorter than the
    imports it does at start (torch, TransformerLens, the catalog; 7-17 s measured under
    load), so every replacement for a killed child was killed in turn. The allowance must
    cover those imports, measured here in a fresh interpreter, several times over."""
    import subprocess
    import sys
    import time

    from jobs.celery_app import make_app

    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import jobs.tasks as t; t._import_the_science()"],
                   check=True, env={**os.environ, "REDIS_URL": "redis://127.0.0.1:1/0"})
    took = time.perf_counter() - t0
    allowance = make_app().conf.worker_proc_alive_timeout
    print(f"pool process imports: {took:.1f} s; allowance {allowance:.0f} s")
    assert allowance >= max(60.0, 5 * took)


def test_bad_arguments_exit_with_a_message(capsys):
    # bad input: exit code 2 and a one-line message naming the flag, for every command
    assert main(["measure", "builtin", "--layers", "one"]) == 2
    assert "--layers must be comma-separated integers" in capsys.readouterr().err
    assert main(["measure", "builtin", "--layers", ""]) == 2
    assert "--layers is empty" in capsys.readouterr().err
    assert main(["measure", "builtin", "--lo", "50", "--hi", "50"]) == 2
    assert "operand range" in capsys.readouterr().err
    assert main(["measure", "builtin", "--hi", "ten"]) == 2
    assert "--hi: invalid literal" in capsys.readouterr().err
    assert main(["measure", "builtin", "--ops", "+%"]) == 2
    assert "--ops: unknown operator(s) '%'" in capsys.readouterr().err
    assert main(["checkpoints", "no-such-model-anywhere"]) == 2
    assert "unknown model" in capsys.readouterr().err


def test_an_argument_a_command_does_not_take_is_refused_by_that_command(capsys):
    """Exit 2 with the command's own usage (argparse's default is ncat's list of commands)
    and, for an unknown option close to one the command takes, that option; on every
    command."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, command in sub.choices.items():
        given = ["1" if a.type is int else "builtin" for a in command._actions
                 if not a.option_strings and a.required and a.nargs not in ("*", "?")]
        given += [x for a in command._actions if a.option_strings and a.required
                  for x in (a.option_strings[0], "out.csv")]
        with pytest.raises(SystemExit) as done:
            main([name, *given, "--no-such-flag-here"])
        assert done.value.code == 2, name
        err = capsys.readouterr().err
        assert f"usage: ncat {name}" in err and "usage: ncat [-h]" not in err, (name, err)
        assert (f"ncat {name}: error: unrecognized arguments: --no-such-flag-here "
                f"(ncat {name} has no --no-such-flag-here;") in err, err
    cases = [(["measure", "builtin", "--hii", "50"], "--hii: did you mean --hi?"),
             (["status", "--jsn"], "--jsn: did you mean --json?"),
             (["measure", "builtin", "--step", "5000"], "ncat measure has no --step;"),
             (["report", "builtin", "--oops=1"], "ncat report has no --oops;")]
    for argv, hint in cases:
        with pytest.raises(SystemExit) as done:
            main(argv)
        assert done.value.code == 2
        err = capsys.readouterr().err
        assert f"unrecognized arguments: {' '.join(argv[2 if argv[1] == 'builtin' else 1:])}" \
            in err and hint in err, err


def test_every_command_has_help():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert {"demo", "train-builtin", "checkpoints", "measure", "migrate", "catalog", "enqueue",
            "worker", "status", "cancel", "retry", "export", "explore"} <= set(sub.choices)
    helps = {a.dest: a.help for a in sub._choices_actions}
    for name, p in sub.choices.items():
        assert helps.get(name, "").strip(), f"ncat {name} has no help line"
        for action in p._actions:
            if action.dest != "help":
                what = action.option_strings or action.dest
                assert (action.help or "").strip(), f"ncat {name} {what} has no help text"


def test_every_commands_help_prints(capsys):
    """`ncat COMMAND --help` formats every help text (argparse %-formats them: a stray %
    in a config field's help crashed it)."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name in sub.choices:
        with pytest.raises(SystemExit) as done:
            parser.parse_args([name, "--help"])
        assert done.value.code == 0, name
        assert f"usage: ncat {name}" in capsys.readouterr().out, name
    assert "10%-trimmed" in (sub.choices["catalog"].format_help())


def test_readme_cli_reference_matches_the_parser():
    from jobs.cli_reference import DOC, reference, section

    assert section(DOC.read_text()) == reference().strip(), (
        "docs/cli.md is stale: run python -m jobs.cli_reference --write")


def test_a_bad_environment_variable_is_one_line_naming_it_and_exit_2(monkeypatch, capsys):
    """A variable the settings cannot take was a 25-line pydantic traceback, exit 1, from
    whichever command read the settings first (a bad NCAT_EXPLORER_PORT stopped `ncat
    status` too). Every command now refuses it before any work, naming each variable and
    its value, never a URL's or password's value."""
    monkeypatch.setenv("NCAT_EXPLORER_PORT", "eighty")
    for argv in (["explore"], ["status"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err == ("error: bad environment variable: NCAT_EXPLORER_PORT='eighty': input "
                       "should be a valid integer, unable to parse string as an integer"), err
    monkeypatch.setenv("NCAT_HEARTBEAT_SECONDS", "0")
    monkeypatch.setenv("REDIS_URL", "redis://:s3cret@localhost:6379/0")
    monkeypatch.setenv("NCAT_QUEUE", "")
    assert main(["status"]) == 2
    err = capsys.readouterr().err
    assert "bad environment variables:" in err and "NCAT_HEARTBEAT_SECONDS='0'" in err
    assert "NCAT_QUEUE=''" in err and "s3cret" not in err and "Traceback" not in err
    # the explorer's own start (`ncat demo` passes its settings) says the same
    from jobs.cli.serving import _port

    with pytest.raises(SystemExit, match="NCAT_EXPLORER_PORT='eighty'"):
        _port(build_parser().parse_args(["explore"]))


def test_a_server_that_accepts_and_never_answers_is_unreachable_not_a_hang(monkeypatch,
                                                                          capsys):
    """A database URL whose port another server holds (Redis on 6379 waits for a newline
    that PostgreSQL's startup packet never sends) kept `ncat status` waiting for ever (over
    2 minutes when tried). Every connection now has libpq's connect_timeout (10 s unless
    the URL sets its own): exit 3, one line. A listener that accepts and never writes
    stands for such a port here, the timeout shortened to 1 s."""
    import socket
    import time

    from schema import database

    assert database.connect_args("postgresql://u@h/db") == {"connect_timeout": 10}
    assert database.connect_args("postgresql://u@h/db?connect_timeout=3") == {}
    assert database.connect_args("postgresql+psycopg://u:p@h:5/db?sslmode=require") == {
        "connect_timeout": 10}
    monkeypatch.setattr(database, "CONNECT_TIMEOUT_S", 1)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"postgresql://analyst@127.0.0.1:{silent.getsockname()[1]}/catalog"
        t0 = time.monotonic()
        assert main(["status", "--database-url", url]) == 3
        assert time.monotonic() - t0 < 30
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "timeout expired" in err, err


def test_an_unreachable_database_is_one_line_with_the_url_and_no_password(capsys):
    from jobs.cli import UNREACHABLE, main

    # (SQLAlchemy's driver suffix given: the URL is shown as psql takes it, without it)
    url = "postgresql+psycopg://analyst:s3cret@127.0.0.1:1/catalog"
    for argv in (["status", "--database-url", url], ["retry", "1", "--database-url", url]):
        assert main(argv) == UNREACHABLE
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err
        assert "postgresql://analyst:***@127.0.0.1:1/catalog" in err and "s3cret" not in err
        assert "+psycopg" not in err
        assert "Is PostgreSQL running there?" in err


def test_exact_effects_in_a_half_precision_dtype_are_warned_about(capsys):
    """bfloat16 and float16 exact effects are rounding noise on a real model
    (docs/real-models.md): a request for them gets a warning naming the dtype and the way
    out; float32, or no exact patching, gets none."""
    from dataclasses import replace

    from catalog.config import ScienceConfig
    from jobs.cli.common import science_from

    base = ScienceConfig()
    assert base.precision_caveat() is None
    assert replace(base, dtype="bfloat16", exact="none").precision_caveat() is None
    assert replace(base, dtype="bfloat16", patching=("attribution",)).precision_caveat() is None
    assert "float16" in replace(base, dtype="float16", exact="top:8").precision_caveat()
    parser = build_parser()
    args = parser.parse_args(["measure", "builtin", "--dtype", "bfloat16"])
    assert science_from(args).dtype == "bfloat16"
    err = capsys.readouterr().err
    assert err.startswith("warning: exact patching in bfloat16") and "--dtype float32" in err
    science_from(parser.parse_args(["measure", "builtin"]))
    science_from(parser.parse_args(["measure", "builtin", "--dtype", "bfloat16",
                                    "--exact", "none"]))
    assert capsys.readouterr().err == ""


def test_small_confusions_of_the_output_are_gone(capsys):
    """Issue 32.11: the shot separator's default (a newline) is shown as '\\n', not as a
    blank; a checkpoint without a training step is "final weights", not "step None"."""
    from schema.jobs import at_checkpoint

    with pytest.raises(SystemExit):
        main(["measure", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "text after each solved example (default '\\n')" in help_text
    assert at_checkpoint("qwen2.5-coder-0.5b", None) == "qwen2.5-coder-0.5b (final weights)"
    assert at_checkpoint("qwen2.5-coder-0.5b", float("nan")).endswith("(final weights)")
    assert at_checkpoint("builtin-arith", 3000) == "builtin-arith step 3000"
    assert at_checkpoint("builtin-arith", 3000.0) == "builtin-arith step 3000"


def test_report_resolves_names_as_every_other_command():
    """`ncat report builtin` reads the model `ncat catalog builtin` stored (builtin-arith,
    or a variant's name); a name no source knows here is looked up as given."""
    from jobs.cli.serving import stored_name

    assert stored_name("builtin") == "builtin-arith"
    assert stored_name("builtin-arith") == "builtin-arith"
    assert stored_name("someone/measured-elsewhere") == "someone/measured-elsewhere"


def test_the_suite_never_writes_to_the_users_home():
    """Every test, and every process a test starts, reads NCAT_HOME from the environment
    the suite sets (tests/conftest.py): a folder of the checkout, not the user's
    ~/.cache/neuron-catalog, where a user's trained models, logs and servers live."""
    from catalog.config.settings import Settings, get_settings

    user_home = Settings.model_fields["ncat_home"].default_factory()
    assert get_settings().ncat_home != user_home
    assert Path(os.environ["NCAT_HOME"]) == get_settings().ncat_home
    out = subprocess.run([sys.executable, "-c", "from catalog.config.settings import get_settings;"
                          "print(get_settings().ncat_home)"], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    assert Path(out.stdout.strip()) == get_settings().ncat_home


@pytest.mark.parametrize("flags,says", [
    (["--hi", "1000000000"], "single-token limit"),
    (["--hi", "2000"], "single-token limit"),
    (["--shots", "50"], "n_ctx"),
], ids=["hi 1e9", "hi 2000", "shots 50"])
def test_measure_refuses_by_the_cheap_limits_before_any_estimate_or_write(
        tiny_builtin, monkeypatch, capsys, flags, says):
    """`measure` checks the token limit and the context length first, as `catalog` and
    `enqueue` do: an operand range of a billion built the memory estimate's grid before
    (115 s, then a MemoryError traceback), and the others were refused with a misleading
    memory message after a spectra-null cache file was written."""
    from catalog.builtin import model_name

    from tiny_model import TINY

    _, root = tiny_builtin
    monkeypatch.setenv("NCAT_HOME", str(root.parent))
    # a budget nothing fits: a memory estimate made before the limits would refuse first
    monkeypatch.setenv("NCAT_MEMORY_BUDGET", "1M")
    before = sorted(str(p) for p in root.parent.rglob("*"))
    assert main(["measure", model_name(TINY), *flags, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err and "GiB" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert sorted(str(p) for p in root.parent.rglob("*")) == before  # nothing written


SECRET = "S3CRET-PW-x"
# a password as a URL may carry it: its user part, its query string, and unencoded (an
# '@' in it: libpq would take its tail for the host, and print it in its errors)
URL_FORMS = {
    "user part": (f"postgresql://ncat:{SECRET}@127.0.0.1:1/ncat", 3),
    "query string": (f"postgresql://ncat@127.0.0.1:1/ncat?sslmode=disable&password={SECRET}",
                     3),
    "unencoded @": (f"postgresql://ncat:{SECRET}@TAIL-x@127.0.0.1:1/ncat", 2),
}


URL_COMMANDS = [
    ["report", "builtin"], ["export", "neuron_evolution", "--out", "x.csv"],
    ["catalog", "builtin", "--hi", "12"], ["enqueue", "builtin", "--hi", "12"],
    ["plan", "builtin", "--hi", "12"], ["status"], ["cancel", "1"], ["retry", "1"],
]


# `migrate` waits 30 s for a server that is starting before it says none answers: here
# with the URL refused before any connection; tests/integration/test_export_cli.py runs it
# against a live server with the password in the user part and in the query string
@pytest.mark.parametrize("args, form", [
    *[(a, f) for a in URL_COMMANDS for f in URL_FORMS], (["migrate"], "unencoded @"),
], ids=lambda x: x[0] if isinstance(x, list) else x)
def test_no_command_prints_the_database_password(args, form, tmp_path):
    """Every command that takes --database-url, its server down, with the password in
    each place a URL can hold one: exit 3 with a message that names the server and never
    the password, or, for a URL whose password end is a guess, exit 2 before any
    connection, saying to percent-encode (`ncat migrate`'s and `ncat status`'s output
    against a live server are tested in tests/integration/test_export_cli.py)."""
    url, code = URL_FORMS[form]
    env = {**os.environ, "REDIS_URL": "redis://127.0.0.1:1/0", "NCAT_HOME": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-m", "jobs.cli", *args, "--database-url", url], cwd=tmp_path,
        env=env, capture_output=True, text=True, timeout=120)
    said = out.stdout + out.stderr
    assert out.returncode == code, (out.returncode, out.stdout[-500:], out.stderr[-500:])
    assert SECRET not in said and "TAIL" not in said, said[-800:]
    if code == 3:
        assert "127.0.0.1:1" in out.stderr  # it says which server it could not reach
    if code == 2:
        assert "percent-encoded" in out.stderr and "Traceback" not in out.stderr


def test_printed_urls_are_psql_ready_and_printed_commands_run_without_the_venv(
        tmp_path, monkeypatch):
    """The demo prints its database as psql takes it (no SQLAlchemy driver suffix, no
    password) and its follow-up commands as this shell can run them: ``ncat`` only when
    that name on the PATH is this program."""
    from jobs.cli.common import ncat_command
    from schema.database import psql_url

    assert psql_url("postgresql+psycopg://me:s3cret@db.example:5433/ncat") == \
        "postgresql://me:***@db.example:5433/ncat"
    assert psql_url("postgresql://postgres@localhost:5432/ncat") == \
        "postgresql://postgres@localhost:5432/ncat"
    assert "s3cret" not in psql_url("not a url s3cret")
    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    script = venv / "ncat"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(script), "demo"])
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # the venv not activated
    assert ncat_command() == ".venv/bin/ncat"
    monkeypatch.setenv("PATH", f"{venv}:/usr/bin:/bin")  # activated
    assert ncat_command() == "ncat"
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "ncat").write_text("#!/bin/sh\n")  # nmap's netcat, say
    (other / "ncat").chmod(0o755)
    monkeypatch.setenv("PATH", f"{other}:/usr/bin:/bin")
    assert ncat_command() == ".venv/bin/ncat"
    monkeypatch.setattr(sys, "argv", ["/x/jobs/cli/__main__.py"])
    assert ncat_command() == f"{sys.executable} -m jobs.cli"


def test_version_names_the_project_and_the_catalog_version(capsys):
    """`ncat --version`: the installed project's version and the catalog version that
    config hashes carry, exit 0."""
    from importlib.metadata import version

    from catalog.config import CATALOG_VERSION
    from jobs.cli import main

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"ncat {version('neuron-catalog')} (catalog {CATALOG_VERSION},")


# commands that print a table or a status line, and commands that show progress
PRINTS_RESULTS = {"migrate", "report", "export", "train-builtin", "fetch", "checkpoints",
                  "measure", "catalog", "explain", "counterparts", "enqueue", "plan",
                  "status", "cancel", "retry"}
SHOWS_PROGRESS = {"demo", "train-builtin", "final-circuit", "fetch", "measure", "catalog",
                  "explain", "counterparts", "enqueue", "plan"}


def test_every_command_that_prints_a_result_has_json_and_every_one_with_progress_quiet():
    """Issue 81: `--json` on every command that prints a table or status, `--quiet` on
    every command that shows progress (the lists above name them; a new command that
    prints either must join them). The commands left out serve (explore, worker, stop)."""
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    flags = {name: {a.dest for a in sp._actions} for name, sp in sub.choices.items()}
    assert set(flags) >= PRINTS_RESULTS | SHOWS_PROGRESS
    assert {n for n in PRINTS_RESULTS if "json" not in flags[n]} == set()
    assert {n for n in SHOWS_PROGRESS if "quiet" not in flags[n]} == set()
    assert set(flags) - PRINTS_RESULTS - SHOWS_PROGRESS == {"explore", "worker", "stop"}


def test_json_output_is_plain_json():
    """The --json writer: dataclasses and named tuples as objects, numpy values as
    numbers, NaN as null, dates in ISO 8601."""
    import datetime
    import json
    from dataclasses import dataclass
    from typing import NamedTuple

    import numpy as np

    from jobs.cli.common import plain

    @dataclass
    class D:
        x: float
        when: datetime.datetime

    class N(NamedTuple):
        a: int
        b: np.ndarray

    got = plain({"d": D(float("nan"), datetime.datetime(2026, 12, 6, 13, 0)),
                 "n": N(1, np.arange(3)), "f": np.float32(0.5), 3: (1, 2)})
    assert json.loads(json.dumps(got)) == {"d": {"x": None, "when": "2026-12-06T13:00:00"},
                                           "n": {"a": 1, "b": [0, 1, 2]}, "f": 0.5,
                                           "3": [1, 2]}
