"""Training dynamics in the store (migration 0031): the final circuit's curves at earlier
checkpoints, and what finding the final circuit needs."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

from schema.store import _POINT_COLS, scalar

_FINAL_COLS = ("final_checkpoint_id",) + _POINT_COLS


@dataclass
class FinalSource:
    """The final checkpoint of a model under a config: the largest step whose paper
    circuit is stored, and that circuit's plan per operator (circuit_summary's row)."""

    checkpoint_id: int
    step: int | None
    plans: dict[str, dict]  # op -> heads, pruned, whole, late_from, late_source, ranking


def final_source(conn: psycopg.Connection, *, model_id: int, config_id: int) -> FinalSource | None:
    """The final checkpoint's paper circuits, or None when no checkpoint of the model has
    one under the config."""
    last = conn.execute(
        "SELECT s.checkpoint_id, c.step FROM circuit_summary s "
        "JOIN checkpoint c ON c.id = s.checkpoint_id "
        "WHERE s.model_id = %s AND s.config_id = %s AND s.protocol = 'paper' "
        "ORDER BY c.step DESC NULLS LAST LIMIT 1", (model_id, config_id)).fetchone()
    if last is None:
        return None
    return FinalSource(last[0], last[1], circuit_plans(conn, checkpoint_id=last[0],
                                                       config_id=config_id))


def circuit_plans(conn: psycopg.Connection, *, checkpoint_id: int, config_id: int,
                  protocol: str = "paper") -> dict[str, dict]:
    """op -> how the checkpoint's circuits of ``protocol`` were built (circuit_summary's
    heads, pruned, whole, late_from, late_source and ranking); empty when none is stored."""
    rows = conn.execute(
        "SELECT op, heads, pruned, whole, late_from, late_source, ranking "
        "FROM circuit_summary WHERE checkpoint_id = %s AND config_id = %s AND protocol = %s "
        "ORDER BY op", (checkpoint_id, config_id, protocol)).fetchall()
    return {op: {"heads": heads, "pruned": list(pruned), "whole": list(whole),
                 "late_from": late_from, "late_source": late_source, "ranking": ranking}
            for op, heads, pruned, whole, late_from, late_source, ranking in rows}


def write_final_curves(conn: psycopg.Connection, *, checkpoint_id: int, config_id: int,
                       final_checkpoint_id: int, curves: list[dict]) -> None:
    """Replace a checkpoint's final-circuit points under a config. ``curves``:
    ``CurveResult.as_dict()``s of protocol ``final`` (NaN already None)."""
    conn.execute("DELETE FROM final_circuit_point WHERE checkpoint_id = %s AND config_id = %s",
                 (checkpoint_id, config_id))
    if not curves:
        return
    model_id = scalar(conn.execute("SELECT model_id FROM checkpoint WHERE id = %s",
                                   (checkpoint_id,)))
    base = ("model_id", "checkpoint_id", "config_id", "op")
    with conn.cursor() as cur:
        for c in curves:
            cur.executemany(
                f"INSERT INTO final_circuit_point ({', '.join(base + _FINAL_COLS)}) "
                f"VALUES ({', '.join(['%s'] * (len(base) + len(_FINAL_COLS)))})",
                [(model_id, checkpoint_id, config_id, c["op"], final_checkpoint_id)
                 + tuple(pt.get(k) for k in _POINT_COLS) for pt in c["points"]])


def lacking_final(conn: psycopg.Connection, *, model_id: int, config_id: int,
                  final_checkpoint_id: int) -> list[tuple[int, int | None]]:
    """(checkpoint id, step) of the model's checkpoints with a paper circuit under the
    config, before the final one, whose final-circuit curves are missing or were measured
    against another final checkpoint; by step, latest first. A checkpoint whose own paper
    curves have no point (no prompt it answers right: nothing to measure a circuit on, so
    the final circuit's curves there are empty too) is not listed: it was, after every
    later summary, loaded and prepared again for nothing."""
    return [tuple(r) for r in conn.execute(
        "SELECT DISTINCT s.checkpoint_id, c.step FROM circuit_summary s "
        "JOIN checkpoint c ON c.id = s.checkpoint_id "
        "WHERE s.model_id = %s AND s.config_id = %s AND s.protocol = 'paper' "
        "  AND s.checkpoint_id <> %s "
        "  AND c.step < (SELECT step FROM checkpoint WHERE id = %s) "
        "  AND EXISTS (SELECT 1 FROM circuit_point p WHERE p.model_id = s.model_id "
        "              AND p.checkpoint_id = s.checkpoint_id "
        "              AND p.config_id = s.config_id AND p.protocol = 'paper') "
        "  AND NOT EXISTS (SELECT 1 FROM final_circuit_point f "
        "                  WHERE f.checkpoint_id = s.checkpoint_id AND f.config_id = s.config_id "
        "                    AND f.final_checkpoint_id = %s) "
        "ORDER BY c.step DESC",
        (model_id, config_id, final_checkpoint_id, final_checkpoint_id,
         final_checkpoint_id)).fetchall()]


def circuit_configs(conn: psycopg.Connection, *, model: str,
                    config_id: int | None = None) -> list[tuple[int, int]]:
    """(model id, config id) under which a model (by name) has paper circuits."""
    return [tuple(r) for r in conn.execute(
        "SELECT DISTINCT s.model_id, s.config_id FROM circuit_summary s "
        "JOIN model m ON m.id = s.model_id WHERE m.name = %s AND s.protocol = 'paper' "
        "AND (%s::int IS NULL OR s.config_id = %s) ORDER BY 2",
        (model, config_id, config_id)).fetchall()]


def model_and_config(conn: psycopg.Connection, *, model_id: int,
                     config_id: int) -> tuple[str, dict]:
    """A model's name and a config's stored settings."""
    name = scalar(conn.execute("SELECT name FROM model WHERE id = %s", (model_id,)))
    config = scalar(conn.execute("SELECT config FROM measure_config WHERE id = %s",
                                 (config_id,)))
    return name, config


@dataclass
class TrainingData:
    """What the report's and the explorer's training figures read, for one model group (the
    model and its seeds, migration 0031) under one config."""

    group: str
    config_id: int
    # heuristic_share rows: model, seed, step, op, family, labelled_top, n_top,
    # labelled_all, n_all
    shares: list[tuple]
    # final_circuit_faithfulness rows (metric nl): model, seed, step, op, k, fraction, own,
    # own_se, final, final_se, random, random_se, n, final_step
    final: list[tuple]
    # model, seed, step, op, accuracy
    accuracy: list[tuple]

    @property
    def seeds(self) -> list[int]:
        return sorted({r[1] for r in self.shares} | {r[1] for r in self.final})


def gather_training(conn: psycopg.Connection, *, model: str,
                    config_id: int | None = None) -> TrainingData | None:
    """The training figures' rows for ``model``'s group (its name without a ``-seedN`` /
    ``@seedN`` suffix) under ``config_id`` (default: the config with the most summarized
    checkpoints in the group); None when the group has no summary."""
    group_sql = "regexp_replace(m.name, '[-@]seed[0-9]+$', '')"
    group = scalar(conn.execute(f"SELECT {group_sql} FROM (SELECT %s::text AS name) m",
                                (model,)))
    if config_id is None:
        row = conn.execute(
            "SELECT s.config_id FROM checkpoint_summary s JOIN checkpoint c "
            "ON c.id = s.checkpoint_id JOIN model m ON m.id = c.model_id "
            f"WHERE {group_sql} = %s GROUP BY s.config_id ORDER BY count(*) DESC, "
            "s.config_id DESC LIMIT 1", (group,)).fetchone()
        if row is None:
            return None
        config_id = int(row[0])
    shares = conn.execute(
        "SELECT model, seed, step, op, family, labelled_top, n_top, labelled_all, n_all "
        "FROM heuristic_share WHERE model_group = %s AND config_id = %s "
        "ORDER BY seed, op, family, step", (group, config_id)).fetchall()
    final = conn.execute(
        "SELECT model, coalesce(substring(model from '[-@]seed([0-9]+)$')::int, 0) AS seed, "
        "step, op, k, fraction, own, own_se, final, final_se, random, random_se, n, "
        "final_step FROM final_circuit_faithfulness "
        "WHERE regexp_replace(model, '[-@]seed[0-9]+$', '') = %s AND config_id = %s "
        "AND metric = 'nl' ORDER BY seed, op, k, step", (group, config_id)).fetchall()
    accuracy = conn.execute(
        "SELECT m.name, coalesce(substring(m.name from '[-@]seed([0-9]+)$')::int, 0), c.step, "
        "a.key, a.value::real FROM checkpoint_summary s "
        "JOIN checkpoint c ON c.id = s.checkpoint_id JOIN model m ON m.id = c.model_id "
        "CROSS JOIN LATERAL jsonb_each_text(s.accuracy) a "
        f"WHERE {group_sql} = %s AND s.config_id = %s ORDER BY 2, 4, 3",
        (group, config_id)).fetchall()
    if not shares and not final:
        return None
    return TrainingData(group, config_id, [tuple(r) for r in shares],
                        [tuple(r) for r in final], [tuple(r) for r in accuracy])
