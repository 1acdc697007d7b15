"""What ``ncat explain`` reads of a catalogued checkpoint: the labels of every neuron for
one operator (the heuristics as family, target and parameters, so the catalog can test
each against a prompt) and each neuron's typical activation."""

from __future__ import annotations

import psycopg

from schema.reads import find_stored
from schema.store import scalar


def catalogued_labels(conn: psycopg.Connection, *, model_name: str, step: int | None,
                      config_hash: str, op: str) -> tuple[list[tuple], dict] | None:
    """([(layer, neuron, family, target, params)], {(layer, neuron): mean activation}) of
    the labelled rows (``implements``) of ``op`` at the checkpoint under the config; None
    when the checkpoint is not catalogued under it."""
    have = find_stored(conn, model_name=model_name, step=step, config_hash=config_hash)
    if have is None or not have.layers:
        return None
    config_id = scalar(conn.execute("SELECT id FROM measure_config WHERE config_hash = %s",
                                    (config_hash,)))
    rows = conn.execute(
        "SELECT s.layer, s.neuron, h.family, h.target, h.params FROM neuron_score s "
        "JOIN heuristic h ON h.id = s.heuristic_id WHERE s.checkpoint_id = %s "
        "AND s.config_id = %s AND s.op = %s AND s.implements ORDER BY 1, 2, h.key",
        (have.checkpoint_id, config_id, op)).fetchall()
    typical = {(int(la), int(n)): float(v) for la, n, v in conn.execute(
        "SELECT layer, neuron, mean_act FROM neuron_op WHERE checkpoint_id = %s "
        "AND config_id = %s AND op = %s AND mean_act IS NOT NULL",
        (have.checkpoint_id, config_id, op))}
    return [tuple(r) for r in rows], typical
