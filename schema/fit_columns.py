"""The explanation columns of ``neuron_op`` (migrations 0025 and 0035;
catalog.labels.operand_fit): a mixin of ``schema.tables.NeuronOp``, apart so that the
table module stays short. For each map the value rule labels, the held-out R^2 of the
operands' additive fit (with the prompt's token layout), of the result, of both (the own
result as it predicts best), and of the best rival with the operands (another operator's
result or an interaction of the operands, ``catalog.labels.rivals``; its name), for the
K map and the KV map."""

from sqlalchemy import REAL, TEXT, Column
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
    fit_other_op: str | None = Field(default=None, sa_column=Column(TEXT))
    kv_fit_other_op: str | None = Field(default=None, sa_column=Column(TEXT))
