"""The longest prompt, computed without tokenizing every prompt (what enqueue checks
against a model's n_ctx), equals the longest prompt build_prompts makes."""

import pytest

from catalog import builtin
from catalog.config import ScienceConfig
from catalog.core.tokens import detect_number_tokens
from catalog.measuring.prompts import build_prompts, check_context, longest_prompt

from offline_models import write_llama_gguf

CONFIGS = [
    ScienceConfig(operand_hi=30),
    ScienceConfig(operand_lo=5, operand_hi=120, operators=("-", "/")),
    ScienceConfig(operand_hi=40, template="spaced", shots=3),
    ScienceConfig(operand_hi=25, template="qa", shots=2, few_shot="Solve:\n", seed=4),
]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    from transformers import AutoTokenizer

    path = write_llama_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    digits = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return {"built-in": builtin.builtin_tokenizer(), "digit-level": digits}


# the built-in vocabulary has no letters, so it takes the bare template only
CASES = [("built-in", c) for c in CONFIGS if c.template == "{a}{op}{b}="] + [
    ("digit-level", c) for c in CONFIGS]


@pytest.mark.parametrize("which, config", CASES, ids=[f"{w}-{i}" for i, (w, _) in
                                                      enumerate(CASES)])
def test_longest_prompt_equals_the_longest_built(tokenizers, which, config):
    tokenizer = tokenizers[which]
    numbers = detect_number_tokens(tokenizer, prepend_bos=True)
    table = build_prompts(tokenizer, numbers, config)
    assert longest_prompt(tokenizer, numbers, config) == max(len(t) for t in table.tokens)


def test_check_context_names_the_length_the_limit_and_the_shots():
    check_context(8, 8, ScienceConfig(), "m")  # fits: nothing raised
    check_context(900, None, ScienceConfig(), "m")  # unknown context: not judged here
    with pytest.raises(ValueError, match=r"longest prompt is 9 tokens but m reads at most 8 "
                                         r"positions.*2 solved example\(s\) \(--shots\)"):
        check_context(9, 8, ScienceConfig(shots=2), "m")
