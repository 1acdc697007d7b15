"""Counterparts of neurons across runs in the catalog (``neuron_counterpart``, migration
0042): written by ``ncat counterparts`` (jobs.counterparts), read by the explorer's neuron
page. Matching one pair of checkpoints under one config again replaces the rows of the layers
matched, in one transaction."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import numpy as np
import pandas as pd
import psycopg
from sqlalchemy import REAL, Boolean, Column, Index, Integer, SmallInteger, Text
from sqlmodel import Field, SQLModel

from schema.columns import _fk, _now, _ts


class NeuronCounterpart(SQLModel, table=True):
    """One neuron of a checkpoint matched in another (migration 0042)."""

    __tablename__ = "neuron_counterpart"
    __table_args__ = (Index("neuron_counterpart_to_idx", "to_checkpoint_id", "config_id",
                            "best_layer", "best_neuron"),)
    from_checkpoint_id: int = _fk("checkpoint", primary_key=True)
    to_checkpoint_id: int = _fk("checkpoint", primary_key=True)
    config_id: int = _fk("measure_config", primary_key=True)
    layer: int = Field(sa_column=Column(SmallInteger, primary_key=True))
    neuron: int = Field(sa_column=Column(Integer, primary_key=True))
    best_layer: int = Field(sa_column=Column(SmallInteger, nullable=False))
    best_neuron: int = Field(sa_column=Column(Integer, nullable=False))
    best_similarity: float = Field(sa_column=Column(REAL, nullable=False))
    one_to_one_layer: int | None = Field(default=None, sa_column=Column(SmallInteger))
    one_to_one_neuron: int | None = Field(default=None, sa_column=Column(Integer))
    one_to_one_similarity: float | None = Field(default=None, sa_column=Column(REAL))
    null_threshold: float = Field(sa_column=Column(REAL, nullable=False))
    level: float = Field(sa_column=Column(REAL, nullable=False))
    has_counterpart: bool = Field(sa_column=Column(Boolean, nullable=False))
    null_models: str = Field(sa_column=Column(Text, nullable=False))
    n_cells: int = Field(sa_column=Column(Integer, nullable=False))
    written_at: datetime = Field(default_factory=_now, sa_column=_ts())


COLUMNS = ("from_checkpoint_id", "to_checkpoint_id", "config_id", "layer", "neuron",
           "best_layer", "best_neuron", "best_similarity", "one_to_one_layer",
           "one_to_one_neuron", "one_to_one_similarity", "null_threshold", "level",
           "has_counterpart", "null_models", "n_cells")


@dataclass
class CounterpartRows:
    """One pair's match, a row per neuron of ``from`` (``neurons``: (layer, index) each;
    ``best`` and ``one_to_one``: (layer, index) in ``to``, -1 where there is none)."""

    neurons: np.ndarray
    best: np.ndarray
    best_similarity: np.ndarray
    one_to_one: np.ndarray
    one_to_one_similarity: np.ndarray
    has: np.ndarray
    threshold: float
    level: float
    null_models: str
    n_cells: int


def write_counterparts(conn: psycopg.Connection, *, from_checkpoint_id: int,
                       to_checkpoint_id: int, config_id: int, rows: CounterpartRows) -> int:
    """Replace the pair's rows of the layers matched (one transaction: a pair matched a few
    layers at a time keeps the others); returns how many were written."""
    def opt(x) -> float | None:
        return None if x != x else float(x)

    with conn.transaction():
        conn.execute("DELETE FROM neuron_counterpart WHERE from_checkpoint_id = %s AND "
                     "to_checkpoint_id = %s AND config_id = %s AND layer = ANY(%s)",
                     (from_checkpoint_id, to_checkpoint_id, config_id,
                      sorted({int(x) for x in rows.neurons[:, 0]})))
        with conn.cursor().copy(f"COPY neuron_counterpart ({', '.join(COLUMNS)}) "
                                "FROM STDIN") as copy:
            for i, (layer, neuron) in enumerate(rows.neurons.tolist()):
                one = rows.one_to_one[i].tolist()
                has_one = one[0] >= 0
                copy.write_row((
                    from_checkpoint_id, to_checkpoint_id, config_id, layer, neuron,
                    *rows.best[i].tolist(), float(rows.best_similarity[i]),
                    one[0] if has_one else None, one[1] if has_one else None,
                    opt(rows.one_to_one_similarity[i]) if has_one else None,
                    float(rows.threshold), float(rows.level), bool(rows.has[i]),
                    rows.null_models, int(rows.n_cells)))
    return len(rows.neurons)


def counterparts_of(conn, *, checkpoint_id: int, config_id: int, layer: int,
                    neuron: int) -> pd.DataFrame:
    """A neuron's stored counterparts in every checkpoint it was matched in, best
    similarity first (``conn``: a SQLAlchemy connection, as the explorer's): the other
    checkpoint (model, step, ids), its best match and one-to-one partner with their
    similarities, the null's threshold and whether the best passes it."""
    from schema.explorer_reads import frame

    return frame(
        conn,
        "SELECT other_model, other_step, other_model_id, to_checkpoint_id, best_layer, "
        "best_neuron, best_similarity, one_to_one_layer, one_to_one_neuron, "
        "one_to_one_similarity, null_threshold, level, has_counterpart, null_models "
        "FROM neuron_counterparts WHERE from_checkpoint_id = :c AND config_id = :g "
        "AND layer = :l AND neuron = :n ORDER BY best_similarity DESC, other_model, "
        "other_step", c=checkpoint_id, g=config_id, l=layer, n=neuron)


# the report's figures per matched checkpoint: counts over the neurons of ``from`` matched
# there, and per family (a neuron carries a family where any of its operators' labels of
# that family holds) how many of its neurons have a counterpart, how many of those have
# one that carries the family too, and how common the family is among the other
# checkpoint's neurons (the base rate a counterpart drawn at random would meet)
REPORT_SQL = """
WITH pairs AS (
    SELECT * FROM neuron_counterparts
    WHERE from_checkpoint_id = %(c)s AND config_id = %(g)s),
fam AS (  -- the labels of this checkpoint and of those it was matched in, no others
    SELECT DISTINCT s.checkpoint_id, s.layer, s.neuron, h.family
    FROM neuron_score s JOIN heuristic h ON h.id = s.heuristic_id
    WHERE s.config_id = %(g)s AND s.implements AND (s.checkpoint_id = %(c)s
          OR s.checkpoint_id IN (SELECT to_checkpoint_id FROM pairs))),
size AS (
    SELECT checkpoint_id, count(DISTINCT (layer, neuron)) AS n FROM neuron_op
    WHERE config_id = %(g)s AND checkpoint_id IN (SELECT to_checkpoint_id FROM pairs)
    GROUP BY checkpoint_id)
SELECT p.to_checkpoint_id, f.family, count(*) AS labelled,
       count(*) FILTER (WHERE p.has_counterpart) AS with_counterpart,
       count(*) FILTER (WHERE p.has_counterpart AND EXISTS (
           SELECT 1 FROM fam t WHERE t.checkpoint_id = p.to_checkpoint_id
           AND t.layer = p.best_layer AND t.neuron = p.best_neuron
           AND t.family = f.family)) AS same_family,
       (SELECT count(*) FROM fam t WHERE t.checkpoint_id = p.to_checkpoint_id
        AND t.family = f.family) AS other_carriers,
       (SELECT n FROM size WHERE size.checkpoint_id = p.to_checkpoint_id) AS other_neurons
FROM pairs p JOIN fam f ON f.checkpoint_id = p.from_checkpoint_id AND f.layer = p.layer
     AND f.neuron = p.neuron
GROUP BY p.to_checkpoint_id, f.family ORDER BY p.to_checkpoint_id, f.family"""


def report_counterparts(conn: psycopg.Connection, *, checkpoint_id: int,
                        config_id: int) -> list[dict]:
    """The report's section: per checkpoint this one's neurons were matched in (``ncat
    counterparts``), the neurons matched, how many have a counterpart beyond the null, a
    one-to-one partner beyond it, the same index; the null (threshold, level, models);
    and per family the counts of ``REPORT_SQL``."""
    out = []
    for row in conn.execute(
            "SELECT to_checkpoint_id, other_model, other_step, count(*), "
            "count(*) FILTER (WHERE has_counterpart), "
            "count(*) FILTER (WHERE one_to_one_similarity > null_threshold), "
            "count(*) FILTER (WHERE same_index), min(null_threshold), min(level), "
            "min(null_models), min(n_cells), array_agg(DISTINCT layer ORDER BY layer) "
            "FROM neuron_counterparts WHERE from_checkpoint_id = %s AND config_id = %s "
            "GROUP BY to_checkpoint_id, other_model, other_step "
            "ORDER BY other_model, other_step", (checkpoint_id, config_id)):
        (to, model, step, n, has, one, same, threshold, level, null_models, cells,
         layers) = row
        out.append({"to_checkpoint_id": to, "model": model, "step": step, "n": n,
                    "has": has, "one_to_one": one, "same_index": same,
                    "threshold": float(threshold), "level": float(level),
                    "null_models": null_models, "n_cells": cells, "layers": list(layers),
                    "families": {}})
    by_id = {r["to_checkpoint_id"]: r for r in out}
    for to, family, labelled, with_cp, same, carriers, other_n in conn.execute(
            REPORT_SQL, {"c": checkpoint_id, "g": config_id}):
        by_id[to]["families"][family] = {
            "labelled": labelled, "with_counterpart": with_cp, "same_family": same,
            "base_rate": carriers / other_n if other_n else None}
    return out
