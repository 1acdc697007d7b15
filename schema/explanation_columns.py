"""The columns of ``prompt_explanation`` past its key (migration 0029; catalog.explain.prompt):
a mixin of ``schema.tables.PromptExplanation``, apart so that the table module stays short.
The shares are of T, the answer's logit minus the competing numbers' mean; the knockout's
p_random is the mean over its random draws."""

from typing import Any

from sqlalchemy import Boolean, Column, Integer, String, Text
from sqlalchemy.dialects.postgresql import DOUBLE_PRECISION, JSONB
from sqlmodel import Field, SQLModel


def _required(type_) -> Any:
    return Field(sa_column=Column(type_, nullable=False))


def _optional(type_) -> Any:
    return Field(default=None, sa_column=Column(type_))


class ExplanationColumns(SQLModel):
    op: str = _required(String(1))
    a: int = _required(Integer)
    b: int = _required(Integer)
    result: int = _required(Integer)
    predicted: str = _required(Text)
    correct: bool = _required(Boolean)
    p_answer: float = _required(DOUBLE_PRECISION)
    rank_answer: int = _required(Integer)
    target: float = _required(DOUBLE_PRECISION)
    share_holds: float | None = _optional(DOUBLE_PRECISION)
    share_labelled_other: float | None = _optional(DOUBLE_PRECISION)
    share_other_neurons: float | None = _optional(DOUBLE_PRECISION)
    share_heads: float | None = _optional(DOUBLE_PRECISION)
    share_rest: float | None = _optional(DOUBLE_PRECISION)
    neurons_50: int | None = _optional(Integer)
    neurons_80: int | None = _optional(Integer)
    heuristics_in_80: int | None = _optional(Integer)
    labelled: bool = _required(Boolean)
    n_knocked: int | None = _optional(Integer)
    p_knocked: float | None = _optional(DOUBLE_PRECISION)
    p_random: float | None = _optional(DOUBLE_PRECISION)
    p_random_se: float | None = _optional(DOUBLE_PRECISION)
    explanation: dict = _required(JSONB)
