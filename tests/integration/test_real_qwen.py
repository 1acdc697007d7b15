"""The real Qwen2.5-Coder-0.5B-Instruct, fetched once (491 MB) and reused from the cache.

Opt-in (minutes on 2 CPU cores): ``bash scripts/test.sh -m real_model``. It checks that
the GGUF model through TransformerLens equals transformers on a few prompts, then
catalogs a small configuration and renders the report.
"""

import pytest
import torch

from catalog.config.settings import get_settings
from catalog.sources import registry
from jobs.cli import main
from schema import store

pytestmark = pytest.mark.real_model
MODEL = "qwen2.5-coder-0.5b"
# docs/real-models.md's commands, run here as written (with this test's database and
# output folder); tests/unit/test_readme.py keeps the two lists equal.
COMMANDS = [
    "ncat fetch qwen2.5-coder-0.5b",
    "ncat catalog qwen2.5-coder-0.5b --ops + --hi 10 --shots 3 --layers 22,23 --exact top:8 "
    "--pairs 20",
    "ncat report qwen2.5-coder-0.5b --out report",
]


@pytest.fixture(scope="module")
def qwen_path():
    return registry.fetch(MODEL, get_settings().ncat_home)  # cached after the first run


def test_qwen_through_transformer_lens_equals_transformers(qwen_path):
    from transformers import AutoModelForCausalLM

    from catalog.sources import load_model

    lm = load_model(MODEL)
    assert (lm.model.cfg.n_layers, lm.model.cfg.d_mlp) == (24, 4864)
    assert lm.model.cfg.n_key_value_heads == 2 and lm.info.digit_level
    hf = AutoModelForCausalLM.from_pretrained(str(qwen_path.parent), gguf_file=qwen_path.name,
                                              dtype=torch.float32).eval()
    for text in ["12+7=", "3+4=7\n2+2=4\n1+6=7\n3+5=", "Q: How much is 8 plus 9? A: "]:
        ids = torch.tensor([lm.tokenizer(text, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            want = hf(ids).logits.log_softmax(-1)
            got = lm.model(ids).log_softmax(-1)
        assert (got - want).abs().max() < 1e-3, (text, float((got - want).abs().max()))
        assert int(got[0, -1].argmax()) == int(want[0, -1].argmax())


def test_catalog_a_small_configuration_of_qwen(qwen_path, db, tmp_path):
    import shlex

    fetch, catalog, report = (shlex.split(c)[1:] for c in COMMANDS)
    assert main(fetch + ["--quiet"]) == 0
    assert main(catalog + ["--quiet", "--database-url", db]) == 0
    with store.connect(db) as conn:
        acc, layers, pairs = conn.execute(
            "SELECT s.accuracy, s.layers, s.n_pairs FROM checkpoint_summary s JOIN checkpoint "
            "c ON c.id = s.checkpoint_id JOIN model m ON m.id = c.model_id "
            "WHERE m.name = %s AND c.step IS NULL", (MODEL,)).fetchone()
        exact = conn.execute("SELECT layer, count(*) FILTER (WHERE is_exact) FROM neuron_op "
                             "GROUP BY layer ORDER BY layer").fetchall()
    assert acc["+"] >= 0.9, acc
    assert layers == [22, 23] and pairs["+"] == 20
    assert exact == [(22, 8), (23, 8)]
    assert main(report[:-1] + [str(tmp_path), "--database-url", db]) == 0
    md = (tmp_path / "report.md").read_text()
    assert "qwen2.5-coder-0.5b" in md and "| + |" in md
    assert (tmp_path / "report.html").stat().st_size > 1_000_000
