"""The explanation columns of ``neuron_op`` (migration 0025; catalog.labels.operand_fit): a mixin
of ``schema.tables.NeuronOp``, apart so that the table module stays short. For each map
the value rule labels, the held-out R^2 of the operands' additive fit (with the prompt's
token layout), of the result, of both, and of the best other operator's result with the
operands (and which operator that is), for the K map and the KV map."""

from sqlalchemy import CHAR, REAL, Column
from sqlmodel import Field, SQLModel


class FitColumns(SQLModel):
    fit_operands: float | None = Field(default=None, sa_column=Column(REAL))
    fit_result: float | None = Field(default=None, sa_column=Column(REAL))
    fit_joint: float | None = Field(default=None, sa_column=Column(REAL))
    fit_other: float | None = Field(default=None, sa_column=Column(REAL))
    kv_fit_operands: float | None = Field(default=None, sa_column=Column(REAL))
    kv_fit_result: float | None = Field(default=None, sa_column=Column(REAL))
    kv_fit_joint: float | None = Field(default=None, sa_column=Column(REAL))
    kv_fit_other: float | None = Field(default=None, sa_column=Column(REAL))
    fit_other_op: str | None = Field(default=None, sa_column=Column(CHAR(1)))
    kv_fit_other_op: str | None = Field(default=None, sa_column=Column(CHAR(1)))
