"""What the exports read (``ncat export``: MIB circuit graphs, Neuronpedia uploads), and the
one way a model name and step are found in the catalog (the report reads it too)."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

from schema.store import scalar


@dataclass(frozen=True)
class Located:
    """One catalogued checkpoint under one config."""

    model: str
    model_id: int
    checkpoint_id: int
    step: int | None
    config_id: int
    config: dict


def locate(conn: psycopg.Connection, model: str, step: int | None = None,
           config_id: int | None = None, error: type[Exception] = ValueError) -> Located:
    """``model`` at ``step`` (default: its last measured checkpoint) under ``config_id``
    (default: the last written there); ``error`` names what is missing."""
    row = conn.execute("SELECT id FROM model WHERE name = %s", (model,)).fetchone()
    if row is None:
        known = [r[0] for r in conn.execute("SELECT name FROM model ORDER BY name")]
        raise error(f"model {model!r} is not in the catalog; it has {known}")
    model_id = row[0]
    ck = conn.execute(
        "SELECT c.id, c.step, lr.config_id FROM checkpoint c "
        "JOIN layer_result lr ON lr.checkpoint_id = c.id WHERE c.model_id = %s "
        + ("AND c.step = %s " if step is not None else "")
        + ("AND lr.config_id = %s " if config_id is not None else "")
        + "ORDER BY c.step DESC NULLS FIRST, lr.written_at DESC LIMIT 1",
        [model_id] + ([step] if step is not None else [])
        + ([config_id] if config_id is not None else [])).fetchone()
    if ck is None:
        raise error(f"{model} has no measured layers"
                    + (f" at step {step}" if step is not None else "")
                    + (f" under config {config_id}" if config_id is not None else ""))
    config = scalar(conn.execute("SELECT config FROM measure_config WHERE id = %s", (ck[2],)))
    return Located(model, model_id, ck[0], ck[1], ck[2], config)


def model_shape(conn: psycopg.Connection, at: Located) -> tuple[int, int, int]:
    """(n_layers, d_model, d_mlp) of the located model."""
    row = conn.execute("SELECT n_layers, d_model, d_mlp FROM model WHERE id = %s",
                       (at.model_id,)).fetchone()
    assert row is not None  # located: the model's row exists
    return int(row[0]), int(row[1]), int(row[2])


def circuit_points(conn: psycopg.Connection, at: Located, op: str,
                   protocol: str) -> list[tuple]:
    """(k, fraction, ratio of means, its SE, n prompts, whether it is one of MIB's
    sparsity levels) of the ranked circuit's normalised logit curve, by k."""
    return conn.execute(
        "SELECT k, fraction, ratio_of_means, ratio_of_means_se, n, mib FROM circuit_point "
        "WHERE checkpoint_id = %s AND config_id = %s AND op = %s AND protocol = %s "
        "AND circuit = 'ranked' AND metric = 'nl' ORDER BY k",
        (at.checkpoint_id, at.config_id, op, protocol)).fetchall()


def component_effects(conn: psycopg.Connection, at: Located, op: str) -> list[tuple]:
    """(layer, head (-1: the MLP), the largest |exact effect| over positions)."""
    return conn.execute(
        "SELECT layer, head, max(abs(effect_exact)) FROM component_effect "
        "WHERE checkpoint_id = %s AND config_id = %s AND op = %s "
        "GROUP BY layer, head ORDER BY layer, head",
        (at.checkpoint_id, at.config_id, op)).fetchall()


def n_heads(conn: psycopg.Connection, at: Located) -> int | None:
    """Heads per layer, as the checkpoint's component effects count them."""
    n = scalar(conn.execute("SELECT max(head) + 1 FROM component_effect WHERE "
                            "checkpoint_id = %s", (at.checkpoint_id,)))
    return None if n is None else int(n)


def export_neurons(conn: psycopg.Connection, at: Located, top: int) -> list[tuple]:
    """(layer, neuron, op, rank, rank_value, density, max_act, best label, best score,
    labelled) of every neuron-operator that carries a label or ranks in the top ``top`` of
    its layer, by layer, neuron and operator."""
    return conn.execute(
        "SELECT n.layer, n.neuron, n.op, n.rank, n.rank_value, n.density, n.max_act, "
        "h.label, n.best_score, coalesce(n.labelled, false) FROM neuron_op n "
        "LEFT JOIN heuristic h ON h.id = n.best_heuristic_id WHERE n.model_id = %s "
        "AND n.checkpoint_id = %s AND n.config_id = %s AND (n.rank < %s OR n.labelled) "
        "ORDER BY n.layer, n.neuron, n.op",
        (at.model_id, at.checkpoint_id, at.config_id, top)).fetchall()


def lens(conn: psycopg.Connection, at: Located, layer: int, neuron: int) -> tuple | None:
    """(top tokens, their values, bottom tokens, their values) of a neuron's logit lens."""
    return conn.execute(
        "SELECT top_tokens, top_values, bottom_tokens, bottom_values FROM neuron_lens "
        "WHERE model_id = %s AND checkpoint_id = %s AND config_id = %s AND layer = %s "
        "AND neuron = %s", (at.model_id, at.checkpoint_id, at.config_id, layer,
                            neuron)).fetchone()
