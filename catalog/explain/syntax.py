"""A prompt's arithmetic, read and checked against a config without importing torch: the
CLI, the explorer and the workers refuse a malformed prompt before anything heavy loads
(catalog.explain.prompt re-exports these)."""

from __future__ import annotations

import re

from catalog.config import ScienceConfig

PROMPT = re.compile(r"^\s*(\d+)\s*([-+*/])\s*(\d+)\s*=?\s*$")


class PromptError(ValueError):
    """A prompt the catalog cannot explain under the config (the message says why)."""


def parse(text: str, config: ScienceConfig) -> tuple[int, str, int]:
    """(a, op, b) of "a op b =" (the "=" optional), checked against the config."""
    m = PROMPT.match(text)
    if m is None:
        raise PromptError(f"{text!r} is not an arithmetic prompt: write it as "
                          "'a op b =' with non-negative integers and one of + - * /, "
                          "e.g. '21+17='")
    a, op, b = int(m[1]), m[2], int(m[3])
    if op not in config.operators:
        raise PromptError(f"operator {op!r} is not measured by this config (operators "
                          f"{''.join(config.operators)})")
    lo, hi = config.operand_lo, config.operand_hi
    if not (lo <= a < hi and lo <= b < hi):
        raise PromptError(f"operands {a} and {b} must be in the config's range [{lo}, {hi})")
    return a, op, b
