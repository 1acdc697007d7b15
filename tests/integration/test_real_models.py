"""Cataloging real-model formats through the command line: a Pythia checkpoint by hub name
and step (offline cache), a local Hugging Face directory, and a GGUF file whose tokenizer
splits numbers into digits."""

import pytest

from jobs.cli import main
from schema import store

from offline_models import write_llama_gguf, write_local_model


def rows(url, sql):
    with store.connect(url) as conn:
        return conn.execute(sql).fetchall()


def test_pythia_steps_by_hub_name(db, pythia_hub, capsys):
    code = main(["catalog", pythia_hub, "--checkpoints", "1000,2000", "--layers", "4,5",
                 "--hi", "10", "--pairs", "5", "--quiet", "--database-url", db])
    assert code == 0, capsys.readouterr().err
    got = rows(db, "SELECT m.name, c.step, c.revision, count(DISTINCT lr.layer) FROM checkpoint c "
                   "JOIN model m ON m.id = c.model_id JOIN layer_result lr ON "
                   "lr.checkpoint_id = c.id GROUP BY 1, 2, 3 ORDER BY 2")
    assert got == [(pythia_hub, 1000, "step1000", 2), (pythia_hub, 2000, "step2000", 2)]
    hashes = rows(db, "SELECT DISTINCT weights_hash FROM checkpoint")
    assert len(hashes) == 2
    assert rows(db, "SELECT number_limit, n_layers FROM model") == [(520, 6)]


def test_local_directory_and_digit_level_gguf(db, tmp_path, capsys):
    local = write_local_model(tmp_path / "model", seed=5)
    gguf = write_llama_gguf(tmp_path / "tiny.gguf")
    for path in (local, gguf):
        code = main(["catalog", str(path), "--hi", "12", "--pairs", "5", "--quiet",
                     "--database-url", db])
        assert code == 0, capsys.readouterr().err
    models = dict(rows(db, "SELECT source, digit_level FROM model"))
    assert models == {"local": False, "gguf": True}
    # digit-level answers: the grid holds every valid cell, even multi-digit results
    n = rows(db, "SELECT l.n_cells FROM grid_layout l JOIN model m ON "
                 "m.number_limit = l.number_limit WHERE m.source = 'gguf' AND l.op = '+'")
    assert n == [(144,)]
    summaries = rows(db, "SELECT count(*) FROM checkpoint_summary")
    assert summaries == [(2,)]


@pytest.mark.parametrize("args, message", [
    (["catalog", "EleutherAI/pythia-14m", "--checkpoints", "1500"], "step 1500 does not exist"),
    (["catalog", "EleutherAI/pythia-14m", "--hi", "600"], "single-token limit 520"),
])
def test_real_model_mistakes_are_explained(db, pythia_hub, args, message, capsys):
    assert main(args + ["--database-url", db]) == 2
    assert message in capsys.readouterr().err
