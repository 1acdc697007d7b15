"""How a tokenizer writes numbers: the single-token limit and digit-level splitting.

The operand grid's validity rules depend on the largest number the tokenizer
encodes as ONE token (Llama 3: 999; Pythia / GPT-J: about 520). It must be read
off the tokenizer, never assumed; this module does that, and also recognises
digit-level tokenizers (Llama 2, Mistral, SmolLM) that split every number into
single digits, for which the answer token is the result's first token.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class NumberTokens:
    """Facts about how one tokenizer encodes non-negative integers.

    ``limit``: largest n such that every integer 0..n is one token (0 for digit-level
    tokenizers, whose only single-token numbers are 0..9). ``digit_level``: numbers
    of two or more digits always split. ``bos_id``: the id prepended to prompts, or
    None where the model uses no BOS.
    """

    limit: int
    digit_level: bool
    bos_id: int | None
    vocab_size: int

    def as_dict(self) -> dict:
        return {
            "limit": self.limit,
            "digit_level": self.digit_level,
            "bos_id": self.bos_id,
            "vocab_size": self.vocab_size,
        }


def encode(tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` without special tokens."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


# each tokenizer object's numbers encoded so far (with its size: a tokenizer given new
# tokens starts again); every checkpoint's explained prompts and steering ask for the
# same few hundred numbers again (0.7 s of a demo checkpoint on one core)
_NUMBERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def encode_number(tokenizer, n: int) -> list[int]:
    """Token ids of the number ``n`` as it appears inside a prompt, after ``=``.

    SentencePiece tokenizers (Llama 2) put a word-start marker before a bare "7";
    encoding "=7" and dropping the tokens of "=" gives the in-context tokens. Kept per
    tokenizer object (``_NUMBERS``) where it can be weakly referenced.
    """
    try:
        size, known = _NUMBERS.get(tokenizer, (None, None))
        now = len(tokenizer)
    except TypeError:  # not weakly referable, hashable or sized: encoded every time
        return _encode_number(tokenizer, n)
    if known is None or size != now:
        known = {}
        _NUMBERS[tokenizer] = (now, known)
    if n not in known:
        known[n] = tuple(_encode_number(tokenizer, n))
    return list(known[n])


def _encode_number(tokenizer, n: int) -> list[int]:
    prefix = encode(tokenizer, "=")
    ids = encode(tokenizer, f"={n}")
    if ids[: len(prefix)] == prefix and len(ids) > len(prefix):
        return ids[len(prefix):]
    return encode(tokenizer, str(n))


def detect_number_tokens(
    tokenizer, prepend_bos: bool = True, probe_up_to: int = 10_000
) -> NumberTokens:
    """Find the single-token limit by encoding 0, 1, 2, ... until one splits.

    A number counts as one token only if it encodes to exactly one id that decodes
    back to the same digits, so tokenizers that map unknown numbers to ``<unk>``
    are handled too. ``prepend_bos`` is the model's own convention (TransformerLens's
    ``cfg.default_prepend_bos``); BOS is used only where the tokenizer has one.
    """
    limit, digit_level = _probe(tokenizer, probe_up_to)
    if limit < 0:
        raise ValueError(
            "tokenizer cannot encode the number 0 as a single token; it is not usable "
            "for arithmetic prompts"
        )
    bos = tokenizer.bos_token_id if prepend_bos else None
    return NumberTokens(
        limit=limit, digit_level=digit_level, bos_id=bos, vocab_size=len(tokenizer)
    )


# each tokenizer object's probe (its size and the probe's bound with it: a tokenizer given
# new tokens is probed again); a model's loader, its run and every prompt explained ask
# again, and the probe encodes every number up to the limit (0.14 s for the built-in one)
_PROBED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _probe(tokenizer, probe_up_to: int) -> tuple[int, bool]:
    """(limit, digit_level) of ``detect_number_tokens``; -1: 0 is not one token."""
    key = (len(tokenizer), probe_up_to)
    try:
        known = _PROBED.get(tokenizer)
    except TypeError:  # not weakly referable or not hashable: probed every time
        known = None
    if known is not None and known[0] == key:
        return known[1]
    limit = -1
    for n in range(probe_up_to + 1):
        ids = encode_number(tokenizer, n)
        if len(ids) != 1 or tokenizer.decode(ids).strip() != str(n):
            break
        limit = n
    digit_level = 0 <= limit < 10 and len(encode_number(tokenizer, 10)) == 2
    try:
        _PROBED[tokenizer] = (key, (limit, digit_level))
    except TypeError:
        pass
    return limit, digit_level


def first_tokens(tokenizer, numbers: np.ndarray) -> np.ndarray:
    """Id of the first token of each number's decimal string (the answer token)."""
    uniq, inverse = np.unique(np.asarray(numbers, dtype=np.int64), return_inverse=True)
    firsts = np.array([encode_number(tokenizer, int(n))[0] for n in uniq], dtype=np.int64)
    return firsts[inverse]


def number_token_ids(tokenizer, limit: int) -> np.ndarray:
    """Token id of each single-token number 0..limit (the logit lens's number axis)."""
    return np.array([encode_number(tokenizer, n)[0] for n in range(limit + 1)], dtype=np.int64)


def continuing_ids(tokenizer) -> np.ndarray:
    """Ids of the tokens that would extend a number written just before them: those whose
    text starts with a digit. A prompt is answered correctly only if the token after the
    answer is not one of them (catalog.measuring.grids.run_grid)."""
    ids = np.arange(len(tokenizer))
    texts = tokenizer.batch_decode([[int(i)] for i in ids])
    return ids[np.array([t[:1].isdigit() for t in texts], dtype=bool)]
