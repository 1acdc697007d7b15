"""The built-in model's vocabulary: one token per integer 0..999, the operators, '=' and
specials, and a Hugging Face fast tokenizer over it."""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, pre_tokenizers
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast

from catalog.core.arith import OPERATORS

MAX_NUMBER = 999
SPECIAL_TOKENS = ["<bos>", "<pad>", "<unk>"]
SYMBOL_TOKENS = list(OPERATORS) + ["="]


def builtin_vocab() -> dict[str, int]:
    """Token string -> id for the built-in model: specials, operators, '=', then 0..999."""
    tokens = SPECIAL_TOKENS + SYMBOL_TOKENS + [str(n) for n in range(MAX_NUMBER + 1)]
    return {t: i for i, t in enumerate(tokens)}


def builtin_tokenizer() -> PreTrainedTokenizerFast:
    """A Hugging Face fast tokenizer with one token per integer 0..999.

    Numbers above 999 become ``<unk>``, so the single-token limit detected from it
    is 999, as for Llama 3.
    """
    vocab = builtin_vocab()
    tok = Tokenizer(WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(
        Regex(r"<bos>|<pad>|<unk>|\d+|[^\d\s]"), behavior="isolated"
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", pad_token="<pad>", unk_token="<unk>"
    )
    fast.add_bos_token = True  # type: ignore[misc]  # read by catalog.core.tokens: BOS comes first
    return fast
