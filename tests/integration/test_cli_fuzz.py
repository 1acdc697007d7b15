"""Every science flag, given random and edge values, through `measure`, `catalog`,
`enqueue` and `plan`: the command accepts the request or refuses it with exit 2 and a
message that opens with what was wrong; never a traceback, never an exception out of
``main``, and nothing written (files under NCAT_HOME, rows in the catalog) before a
refusal (issue 49).

A memory budget nothing fits (NCAT_MEMORY_BUDGET=1M) turns every valid request of
`measure` and `catalog` into a refusal too, after the cheap checks: so a valid value
exercises the order of the checks and no case measures anything. `plan` calibrates on a
valid request (minutes): it gets the values the config itself refuses and the requests
the tokenizer and the context refuse. Redis is unreachable: an accepted `enqueue` stops
with exit 3 before storing anything (or, had it stored its jobs, says they were not sent:
exit 4).
"""

import random

from catalog.config import ScienceConfig
from catalog.config.flags import from_args, specs
from jobs.cli import main
from schema import store

from tiny_model import TINY

EDGES = {
    "int": ["0", "-1", "1", "3", "2147483648", "99999999999999999999", "1e3", "x", ""],
    "float": ["0", "-1", "0.5", "nan", "inf", "-inf", "1e308", "x", ""],
    "bool": ["on", "off", "maybe", ""],
    "operators": ["+", "/", "", "%", "+-*/+", "a"],
    "methods": ["both", "exact", "attribution", "bogus", ",", ""],
    "words": ["bogus", "", ",", "a,,b"],
    "floats": ["0.5", "0.1,0.9", "nan", "-1,2", "x", ""],
    "str": ["bogus", "", " ", "\n", "\x00"],
}
TABLES = ("job", "model", "checkpoint", "measure_config", "neuron_op")


def _cases() -> list[tuple[str, str, str]]:
    """(command, flag, value): every field with three of its kind's values (its choices
    among them), each on one command in turn; a fixed seed keeps the run repeatable."""
    rng = random.Random(49)
    commands = ["measure", "catalog", "enqueue"]
    out = []
    for i, spec in enumerate(specs(ScienceConfig)):
        pool = list(EDGES[spec.kind]) + [str(c) for c in spec.choices or ()]
        pool.append("".join(rng.choice("0123456789-.,+*/eax ") for _ in range(rng.randint(1, 6))))
        for j, value in enumerate(rng.sample(pool, min(3, len(pool)))):
            out.append((commands[(i + j) % len(commands)], spec.flag, value))
    return out


def _config_refuses(flag: str, value: str) -> bool:
    spec = next(s for s in specs(ScienceConfig) if s.flag == flag)
    if spec.choices and value not in [str(c) for c in spec.choices]:
        return True
    try:
        from_args(ScienceConfig, type("A", (), {spec.name: value})())
    except ValueError:
        return True
    return False


def _state(home, url) -> tuple:
    with store.connect(url) as conn:
        rows = tuple(conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES)
    return tuple(sorted(str(p) for p in home.rglob("*"))), rows


def _run(argv: list[str], capsys) -> tuple[int, str]:
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse: a value outside a flag's choices
        rc = exc.code
    return rc, capsys.readouterr().err


def test_no_flag_value_gets_a_traceback_or_a_write_before_its_refusal(
        db, tiny_builtin, monkeypatch, capsys):
    from catalog.builtin import model_name

    _, root = tiny_builtin
    home = root.parent
    monkeypatch.setenv("NCAT_HOME", str(home))
    monkeypatch.setenv("NCAT_MEMORY_BUDGET", "1M")
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    model = model_name(TINY)
    cases = _cases()
    # plan: the config's own refusals, and the tokenizer's and the context's
    plan = [("plan", f, v) for _, f, v in cases if _config_refuses(f, v)][:12]
    plan += [("plan", "--hi", "2000"), ("plan", "--shots", "50")]
    outcomes: dict[int, int] = {}
    for command, flag, value in cases + plan:
        argv = [command, model, flag, value, "--quiet", "--database-url", db]
        if command == "measure":
            argv = argv[:-2]
        if command == "plan":
            argv.remove("--quiet")
        before = _state(home, db)
        rc, err = _run(argv, capsys)
        outcomes[rc] = outcomes.get(rc, 0) + 1
        what = (command, flag, repr(value), rc, err[-800:])
        assert "Traceback" not in err, what
        assert rc in (0, 2, 3, 4), what
        if rc in (2, 3):  # refused, or the broker unreachable: nothing stored either way
            # a refusal says what was wrong on a line of its own (warnings may come
            # first, the memory refusal adds its table of needs, argparse its usage)
            assert any(line.startswith(("error:", "usage:")) for line in err.splitlines()), what
            assert _state(home, db) == before, what
        if rc == 3:
            assert "job broker" in err, what  # the database is up: only Redis is missing
    # the fuzz reached both sides: refusals, and requests that passed every check of
    # the flags (refused only by the memory budget, or queued)
    assert outcomes.get(2, 0) > 20, outcomes
    assert outcomes.get(3, 0) + outcomes.get(4, 0) > 0, outcomes
