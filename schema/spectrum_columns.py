"""The spectrum columns of ``neuron_op`` (migration 0023; catalog.spectra): a mixin of
``schema.tables.NeuronOp``, apart so that the table module stays short."""

from sqlalchemy import Column, SmallInteger
from sqlmodel import Field, SQLModel


class SpectrumColumns(SQLModel):
    # periodic structure (catalog.spectra, migration 0023): periods, and shares and R^2 in
    # ten-thousandths; spec_periodic has a bit per axis whose period is significant
    spec_periodic: int | None = Field(default=None, sa_column=Column(SmallInteger))
    op1_period: int | None = Field(default=None, sa_column=Column(SmallInteger))
    op2_period: int | None = Field(default=None, sa_column=Column(SmallInteger))
    result_period: int | None = Field(default=None, sa_column=Column(SmallInteger))
    kv_period: int | None = Field(default=None, sa_column=Column(SmallInteger))
    op1_share: int | None = Field(default=None, sa_column=Column(SmallInteger))
    op2_share: int | None = Field(default=None, sa_column=Column(SmallInteger))
    result_share: int | None = Field(default=None, sa_column=Column(SmallInteger))
    kv_share: int | None = Field(default=None, sa_column=Column(SmallInteger))
    op1_fit: int | None = Field(default=None, sa_column=Column(SmallInteger))
    op2_fit: int | None = Field(default=None, sa_column=Column(SmallInteger))
    result_fit: int | None = Field(default=None, sa_column=Column(SmallInteger))
    op1_linear: int | None = Field(default=None, sa_column=Column(SmallInteger))
    op2_linear: int | None = Field(default=None, sa_column=Column(SmallInteger))
    result_linear: int | None = Field(default=None, sa_column=Column(SmallInteger))
    helix_r2: int | None = Field(default=None, sa_column=Column(SmallInteger))
