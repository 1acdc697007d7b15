"""The spectrum columns of ``neuron_op`` (migrations 0023 and 0024; catalog.periodic.spectra): a
mixin of ``schema.tables.NeuronOp``, apart so that the table module stays short."""

from typing import Any

from sqlalchemy import Column, SmallInteger
from sqlmodel import Field, SQLModel


def _small() -> Any:
    return Field(default=None, sa_column=Column(SmallInteger))


class SpectrumColumns(SQLModel):
    # periodic structure (catalog.periodic.spectra, migration 0024), packed: {axis}_spec is the
    # period * 300 + its share in 299ths, {axis}_fitlin the fit R^2 * 181 + the linear
    # share (180ths each), spec_helix the helix R^2 in 2000ths * 16 + a bit per axis
    # whose period is significant; the view neuron_spectrum unpacks them
    spec_helix: int | None = _small()
    op1_spec: int | None = _small()
    op2_spec: int | None = _small()
    result_spec: int | None = _small()
    kv_spec: int | None = _small()
    op1_fitlin: int | None = _small()
    op2_fitlin: int | None = _small()
    result_fitlin: int | None = _small()
