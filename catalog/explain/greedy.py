"""What greedy decoding writes after a prompt (``written``), reusing the teacher-forced
pass's top tokens where greedy decoding would have seen the same tokens."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformer_lens import HookedTransformer

from catalog.builtin.model import BUILTIN_NAME


def _extends(tokenizer, token: int) -> bool:
    return tokenizer.decode([token])[:1].isdigit()


@torch.no_grad()
def written(model: HookedTransformer, tokenizer, p, top: Sequence[int]) -> str:
    """What greedy decoding writes after the prompt: its first token, then each next token
    while it extends the number (its text starts with a digit), at most the result's
    length plus two tokens; the built-in model writes one token (a whole number).
    ``top``: the teacher-forced pass's top token at each position of the prompt followed
    by the result's tokens; it is greedy decoding's as long as greedy decoding has written
    the result's tokens, and one forward per further token is run past that. ``p``: a
    ``catalog.explain.prompt.Prompt`` (its tokens and its result's tokens)."""
    at = len(p.tokens) - 1
    limit = 1 if model.cfg.model_name == BUILTIN_NAME else len(p.result_tokens) + 2
    out: list[int] = []
    while len(out) < limit:
        i = len(out)
        if at + i < len(top) and list(p.result_tokens[:i]) == out:
            t = int(top[at + i])  # the pass saw exactly these tokens before it
        else:
            seq = [int(x) for x in p.tokens] + out
            if len(seq) >= model.cfg.n_ctx:
                break
            toks = torch.as_tensor(seq, dtype=torch.long, device=model.W_U.device)[None]
            t = int(model(toks)[0, -1].argmax())
        if out and not _extends(tokenizer, t):
            break
        out.append(t)
        if not _extends(tokenizer, t):
            break
    return tokenizer.decode(out)
