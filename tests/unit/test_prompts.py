"""Grid validity, the single-token limit read off real tokenizers, prompts and pairs."""

import numpy as np
import pytest

from catalog.builtin import builtin_tokenizer
from catalog.config import ScienceConfig
from catalog.core.arith import apply_op, is_valid
from catalog.core.tokens import NumberTokens, detect_number_tokens, encode_number
from catalog.measuring.prompts import build_prompts, sample_pairs

from offline_models import number_tokenizer


def test_validity_rules_match_method():
    a = np.array([5, 5, 3, 10, 7, 0, 9])
    b = np.array([5, 6, 4, 0, 2, 1, 3])
    assert is_valid("+", a, b, 10).tolist() == [True, False, True, True, True, True, False]
    assert is_valid("-", a, b, 10).tolist() == [True, False, False, True, True, False, True]
    assert is_valid("*", a, b, 15).tolist() == [False, False, True, True, True, True, False]
    assert is_valid("/", a, b, 10).tolist() == [True, True, True, False, True, True, True]
    assert apply_op("/", np.array([7, 9, 0]), np.array([2, 3, 5])).tolist() == [3, 3, 0]
    with pytest.raises(ValueError, match="unknown operator '%'"):
        is_valid("%", a, b, 10)


def test_token_limit_detected_from_real_tokenizers():
    assert detect_number_tokens(builtin_tokenizer()).limit == 999
    pythia_like = detect_number_tokens(number_tokenizer(520))
    assert pythia_like.limit == 520 and not pythia_like.digit_level
    assert detect_number_tokens(number_tokenizer(37)).limit == 37
    # numbers past the limit split into several tokens
    assert len(encode_number(number_tokenizer(520), 521)) == 2


def test_each_tokenizer_is_probed_once_until_it_changes(monkeypatch):
    """The number probe encodes every number up to the limit; the loader, the run and
    every explained prompt ask for it, so a tokenizer object is probed once, and again
    only when its vocabulary grows."""
    from catalog.core import tokens

    calls = []
    real = tokens.encode_number
    monkeypatch.setattr(tokens, "encode_number", lambda tok, n: calls.append(n) or real(tok, n))
    tok = number_tokenizer(520)
    first = detect_number_tokens(tok)
    assert first.limit == 520 and len(calls) > 520
    calls.clear()
    assert detect_number_tokens(tok, prepend_bos=False) == NumberTokens(520, False, None,
                                                                       len(tok))
    assert calls == []
    other = number_tokenizer(37)  # another object: its own probe
    assert detect_number_tokens(other).limit == 37 and len(calls) > 37
    calls.clear()
    tok.add_tokens(["<|new|>"])
    assert detect_number_tokens(tok).vocab_size == first.vocab_size + 1 and len(calls) > 520


def test_each_number_is_encoded_once_per_tokenizer_until_it_changes(monkeypatch):
    """``encode_number`` keeps each tokenizer object's numbers: the same ids come back
    without asking the tokenizer again (every checkpoint's prompts ask for the same
    numbers), a list the caller may change without changing what is kept, and a
    tokenizer given new tokens is asked again."""
    from catalog.core import tokens

    tok = number_tokenizer(520)
    asked = []
    real = tokens.encode
    monkeypatch.setattr(tokens, "encode", lambda t, text: asked.append(text) or real(t, text))
    want = tokens._encode_number(tok, 521)
    asked.clear()
    first = encode_number(tok, 521)
    assert first == want and len(first) == 2 and asked
    asked.clear()
    first.append(-1)
    assert encode_number(tok, 521) == want and asked == []
    tok.add_tokens(["<|new|>"])
    assert encode_number(tok, 521) == want and asked


def test_prompt_counts_follow_the_limit():
    tok = number_tokenizer(15)
    cfg = ScienceConfig(operand_hi=10)
    table = build_prompts(tok, detect_number_tokens(tok, prepend_bos=False), cfg)
    counts = {op: len(table.op_index(op)) for op in cfg.operators}
    # a, b in 0..9, limit 15: six + cells have a + b >= 16; 48 * cells have a * b > 15
    assert counts == {"+": 94, "-": 55, "*": 52, "/": 90}
    i = table.op_index("/")[0]
    assert (table.a[i], table.b[i], table.result[i]) == (0, 1, 0)
    assert table.tokens[i].tolist() == tok("0/1=", add_special_tokens=False)["input_ids"]
    grid = table.to_grid(table.result[table.op_index("-")].astype(np.float32), "-")
    assert grid.shape == (10, 10) and np.isnan(grid[2, 3]) and grid[7, 3] == 4


def test_bos_and_few_shot_template():
    tok = builtin_tokenizer()
    cfg = ScienceConfig(operators=("+",), operand_hi=3, few_shot="1+1=2 ", template="{a}{op}{b}=")
    table = build_prompts(tok, detect_number_tokens(tok), cfg)
    ids = tok("1+1=2 2+1=", add_special_tokens=False)["input_ids"]
    last = [t for t in table.tokens if t[-4:].tolist() == ids[-4:]][0]
    assert last[0] == tok.bos_token_id and last[1:].tolist() == ids


def test_operand_range_beyond_limit_is_refused():
    tok = number_tokenizer(520)
    with pytest.raises(ValueError, match="single-token limit 520; use operand_hi <= 521"):
        build_prompts(tok, detect_number_tokens(tok), ScienceConfig(operand_hi=600))


def test_pairs_are_seeded_and_cross_operator():
    tok = builtin_tokenizer()
    table = build_prompts(tok, detect_number_tokens(tok), ScienceConfig(operand_hi=30))
    table.correct = np.ones(len(table), dtype=bool)
    table.correct[::7] = False
    clean, cf = sample_pairs(table, "+", 100, seed=3)
    assert len(clean) == 100 and len(set(clean)) == 100
    assert (table.op[clean] == 0).all()
    assert table.correct[clean].all() and table.correct[cf].all()
    assert (table.answer[clean] != table.answer[cf]).all()
    assert len(set(table.op[cf].tolist())) == 4  # counterfactuals come from all operators
    again = sample_pairs(table, "+", 100, seed=3)
    other = sample_pairs(table, "+", 100, seed=4)
    assert np.array_equal(again[0], clean) and np.array_equal(again[1], cf)
    assert not np.array_equal(other[1], cf)


def test_config_validation_names_the_field():
    for kwargs, msg in [
        ({"operators": ("+", "^")}, "unknown operator '\\^'"),
        ({"operand_lo": 5, "operand_hi": 5}, "operand_hi must exceed"),
        ({"template": "{a}{b}="}, "lacks {op}"),
        ({"pairs_per_op": 0}, "pairs_per_op must be >= 1"),
        ({"heuristic_variant": "mine"}, "heuristic_variant must be one of"),
        ({"score_floor": 1.5}, "score_floor must be in"),
        ({"scores_per_family": -1}, "scores_per_family must be >= 0"),
        ({"dtype": "float64"}, "dtype must be one of"),
    ]:
        with pytest.raises(ValueError, match=msg):
            ScienceConfig(**kwargs)
    a, b = ScienceConfig(operators=["+", "-"]), ScienceConfig(operators=("+", "-"))
    assert a.config_hash() == b.config_hash() != ScienceConfig().config_hash()
    assert ScienceConfig.from_dict(a.as_dict()) == a


def test_a_stored_config_keeps_the_rules_it_was_measured_with():
    """A config stored before labels, robust ranking, shots and the value family existed
    meant the paper's rules; reading it back must not switch it to today's defaults."""
    old = {k: v for k, v in ScienceConfig().as_dict().items()
           if k not in ("shots", "shot_separator", "exact", "rank_statistic", "rank_sign",
                        "label_rule", "significance_level", "families",
                        "scores_per_family", "dtype", "dedupe_heuristics", "null_strata")}
    old["batch_size"] = 4096  # configs before the execution split carried it
    cfg = ScienceConfig.from_dict(old)
    assert (cfg.label_rule, cfg.rank_statistic, cfg.rank_sign, cfg.exact, cfg.shots) == (
        "paper", "mean", "signed", "all", 0)
    assert "value" not in cfg.families
    assert (cfg.scores_per_family, cfg.dtype) == (0, "float32")  # every score was stored
    assert not cfg.dedupe_heuristics  # every heuristic was scored before 0.6.0
    new = ScienceConfig()
    assert new.scores_per_family == 1
    assert (new.label_rule, new.rank_statistic, new.rank_sign) == ("values", "trimmed", "abs")
    assert new.dedupe_heuristics
    assert "value" in new.families


def _roles_one_by_one(tokenizer, config, ops, a, b, offsets=True):
    """The roles as tokenize_prompts took them until 2026-12-03, prompt by prompt (the
    slow reference): the last token whose first character is before the role's end, or
    the length of the text up to the role's end tokenized alone."""
    from catalog.measuring.prompts import _spans

    out = []
    for op, x, y in zip(ops, a, b, strict=True):
        text, spans = _spans(config.template, int(x), op, int(y))
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=offsets)
        n, row = len(enc["input_ids"]), []
        for name in ("a", "op", "b"):
            end = spans[name][1]
            if offsets:
                starts = [s for s, _ in enc["offset_mapping"]]
                row.append(max(k for k in range(n) if starts[k] < end or k == 0))
            else:
                part = tokenizer(text[:end], add_special_tokens=False)["input_ids"]
                row.append(min(len(part), n) - 1)
        out.append(row + [n - 1])
    return np.array(out, dtype=np.int64)


class _NoOffsets:
    """A tokenizer that cannot give character offsets (as slow tokenizers cannot)."""

    def __init__(self, tok):
        self.tok = tok

    def __call__(self, text, add_special_tokens=True, return_offsets_mapping=False):
        if return_offsets_mapping:
            raise NotImplementedError("no offsets")
        return self.tok(text, add_special_tokens=add_special_tokens)


@pytest.mark.parametrize("template", ["bare", "spaced", "qa", "{a} {op_word} {b} ="])
def test_each_roles_token_equals_the_prompt_by_prompt_reference(template):
    """tokenize_prompts finds every prompt's role tokens at once: the same positions as
    the prompt-by-prompt reference, on one-token numbers, numbers split into pieces and
    digit by digit, every operator and every template kind, with offsets and without."""
    from catalog.measuring.prompts import tokenize_prompts

    rng = np.random.default_rng(len(template))
    cfg = ScienceConfig(template=template)
    ops = [str(o) for o in rng.choice(list("+-*/"), 300)]
    a, b = rng.integers(0, 2000, 300), rng.integers(1, 2000, 300)
    for tok in (builtin_tokenizer(), number_tokenizer(), number_tokenizer(9)):
        ids, roles = tokenize_prompts(tok, cfg, ops, a, b)
        want = _roles_one_by_one(tok, cfg, ops, a, b)
        np.testing.assert_array_equal(roles, want)
        assert len({len(x) for x in ids}) > 1 or tok.vocab_size > 1000
    slow = _NoOffsets(number_tokenizer(9))
    _, roles = tokenize_prompts(slow, cfg, ops[:40], a[:40], b[:40])
    np.testing.assert_array_equal(
        roles, _roles_one_by_one(slow, cfg, ops[:40], a[:40], b[:40], offsets=False))


def test_a_runs_checkpoints_tokenize_the_grid_once(monkeypatch):
    """prompts_for keeps the table it built last: the same tokenizer (another object of
    the same content), numbers and config get the same prompts without tokenizing again,
    each in a table of its own (one checkpoint's correctness is not another's); another
    vocabulary, another config or a tokenizer without a serializable backend build
    their own."""
    from catalog.measuring import prompts

    built = []
    real = prompts.build_prompts
    monkeypatch.setattr(prompts, "build_prompts",
                        lambda *args: built.append(args[2]) or real(*args))
    monkeypatch.setattr(prompts, "_LAST", [])
    cfg = ScienceConfig(operand_hi=12, shots=2, shot_separator="; ")
    tok = number_tokenizer(200)
    numbers = detect_number_tokens(tok)
    first = prompts.prompts_for(tok, numbers, cfg)
    first.correct = np.ones(len(first), dtype=bool)
    again = prompts.prompts_for(number_tokenizer(200), detect_number_tokens(tok), cfg)
    assert len(built) == 1 and again is not first and again.correct is None
    assert [t.tolist() for t in again.tokens] == [t.tolist() for t in first.tokens]
    np.testing.assert_array_equal(again.role_pos, first.role_pos)
    fresh = real(tok, numbers, cfg)
    assert [t.tolist() for t in fresh.tokens] == [t.tolist() for t in again.tokens]
    other = number_tokenizer(150)
    assert prompts.tokenizer_key(other) != prompts.tokenizer_key(tok)
    prompts.prompts_for(other, detect_number_tokens(other), cfg)
    prompts.prompts_for(tok, numbers, ScienceConfig(operand_hi=12, shots=3, shot_separator="; "))
    assert len(built) == 3
    slow = _NoOffsets(tok)
    assert prompts.tokenizer_key(slow) is None
    prompts.prompts_for(slow, numbers, cfg)
    prompts.prompts_for(slow, numbers, cfg)
    assert len(built) == 5
