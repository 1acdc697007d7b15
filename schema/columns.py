"""Column helpers shared by the table modules (``schema.tables``, ``schema.job_tables``)."""

from datetime import UTC, datetime

from sqlalchemy import Column, DateTime, ForeignKey, Integer, text
from sqlmodel import Field


def _now() -> datetime:
    return datetime.now(UTC)


def _fk(table: str, primary_key: bool = False, index: bool = False):
    """An integer column referencing ``table.id`` (rows go when their parent goes)."""
    return Field(sa_column=Column(Integer, ForeignKey(f"{table}.id", ondelete="CASCADE"),
                                  nullable=False, primary_key=primary_key, index=index))


def _ts(**kw) -> Column:
    return Column(DateTime(timezone=True), nullable=False, server_default=text("now()"), **kw)
