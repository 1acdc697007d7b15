"""The job tables (``job``, ``job_layer``, ``reconcile_event``, ``explain_request``,
``catalog_identity``): what
the queue's durable state is made of (docs/jobs.md), apart so that ``schema.tables`` stays short; it
re-exports them, so that importing it registers every table."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    SmallInteger,
    String,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, OID, UUID
from sqlmodel import Field, SQLModel

from schema.columns import _fk, _now, _ts


class Job(SQLModel, table=True):
    """One (model, checkpoint, config, layers) to catalog; its progress is durable here.

    status: queued -> running -> summarizing -> done, or failed / cancelled. The checkpoint
    row (with its weights hash) is linked once a worker has loaded the weights.
    """

    __tablename__ = "job"
    id: int | None = Field(default=None, primary_key=True)
    job_key: str = Field(sa_column=Column(String(64), nullable=False, unique=True))
    model_name: str = Field(sa_column=Column(Text, nullable=False))
    step: int | None = Field(default=None, sa_column=Column(BigInteger, nullable=True))
    config_id: int = _fk("measure_config")
    layers: list[int] = Field(sa_column=Column(ARRAY(Integer), nullable=False))
    device: str = Field(sa_column=Column(String(32), nullable=False))
    force: bool = False
    status: str = Field(sa_column=Column(String(16), nullable=False, index=True))
    checkpoint_id: int | None = Field(default=None, sa_column=Column(
        Integer, ForeignKey("checkpoint.id", ondelete="SET NULL"), nullable=True))
    error: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    failed_layer: int | None = None
    created_at: datetime = Field(default_factory=_now, sa_column=_ts())
    updated_at: datetime = Field(default_factory=_now, sa_column=_ts())
    finished_at: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True),
                                                                        nullable=True))
    # a full-grid job (migration 0008): only these neurons' grids of its one layer are
    # computed and stored in full; NULL for a measurement job
    grid_neurons: list[int] | None = Field(default=None, sa_column=Column(ARRAY(Integer),
                                                                          nullable=True))


class JobLayer(SQLModel, table=True):
    """Per-layer progress of a job: who computed it, when, and how it ended."""

    __tablename__ = "job_layer"
    job_id: int = Field(sa_column=Column(Integer, ForeignKey("job.id", ondelete="CASCADE"),
                                         primary_key=True))
    layer: int = Field(sa_column=Column(SmallInteger, primary_key=True))
    status: str = Field(sa_column=Column(String(16), nullable=False))
    worker: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    attempts: int = 0
    started_at: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True),
                                                                       nullable=True))
    finished_at: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True),
                                                                        nullable=True))
    error: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    # a working worker's last sign of life; when a message for the layer last went out;
    # resends: its losses (a start that died; 0007); sends: re-sends while queued (0027)
    heartbeat_at: datetime | None = Field(default=None, sa_column=Column(
        DateTime(timezone=True), nullable=True))
    sent_at: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True),
                                                                    nullable=True))
    resends: int = Field(default=0, sa_column=Column(Integer, nullable=False, server_default="0"))
    sends: int = Field(default=0, sa_column=Column(Integer, nullable=False, server_default="0"))
    # what each of those losses was: 'process died', 'database unreachable', ... (0037)
    loss_kinds: list[str] = Field(default_factory=list, sa_column=Column(
        ARRAY(Text), nullable=False, server_default="{}"))


class CatalogIdentity(SQLModel, table=True):
    """The catalog's identity (one row, migration 0037; schema.identity): every queue
    message names it, so a worker never runs or drops another catalog's message."""

    __tablename__ = "catalog_identity"
    one: bool = Field(default=True, sa_column=Column(Boolean, primary_key=True,
                                                     server_default=text("true")))
    id: uuid.UUID = Field(sa_column=Column(UUID(as_uuid=True), nullable=False))
    db_oid: int = Field(sa_column=Column(OID, nullable=False))
    minted_at: datetime = Field(default_factory=_now, sa_column=_ts())


class ReconcileEvent(SQLModel, table=True):
    """What the reconciler did to a job: re-sent a layer, resumed its summary, failed it."""

    __tablename__ = "reconcile_event"
    __table_args__ = (Index("ix_reconcile_event_job", "job_id", "at"),)
    id: int | None = Field(default=None, sa_column=Column(BigInteger, primary_key=True))
    at: datetime = Field(default_factory=_now, sa_column=_ts())
    job_id: int = Field(sa_column=Column(Integer, ForeignKey("job.id", ondelete="CASCADE"),
                                         nullable=False))
    layer: int | None = Field(default=None, sa_column=Column(SmallInteger, nullable=True))
    action: str = Field(sa_column=Column(String(32), nullable=False))
    detail: dict | None = Field(default=None, sa_column=Column(JSONB))


class ExplainRequestRow(SQLModel, table=True):
    """A prompt a worker explains for the Prompt page (migration 0030;
    schema.explain_requests): queued -> running -> done or failed; one request of a
    prompt open at a time."""

    __tablename__ = "explain_request"
    __table_args__ = (
        Index("explain_request_open_idx", "checkpoint_id", "config_id", "prompt", unique=True,
              postgresql_where=text("status IN ('queued', 'running')")),
        Index("explain_request_prompt_idx", "checkpoint_id", "config_id", "prompt", "id"),
    )
    id: int | None = Field(default=None, primary_key=True)
    model_id: int = _fk("model")
    checkpoint_id: int = _fk("checkpoint")
    config_id: int = _fk("measure_config")
    prompt: str = Field(sa_column=Column(Text, nullable=False))
    seeds: int = Field(sa_column=Column(Integer, nullable=False))
    status: str = Field(default="queued", sa_column=Column(String(8), nullable=False,
                                                           server_default="queued"))
    error: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    worker: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    starts: int = Field(default=0, sa_column=Column(Integer, nullable=False, server_default="0"))
    created_at: datetime = Field(default_factory=_now, sa_column=_ts())
    started_at: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True),
                                                                       nullable=True))
    finished_at: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True),
                                                                        nullable=True))
