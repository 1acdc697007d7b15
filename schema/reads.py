"""Reading the catalog back: which layers a checkpoint has stored, one neuron's stored
grid (full or sketch, K or KV map), one effect column of a checkpoint, its labels, and
the bytes a table holds. The explorer, the report and the summary's resume read here."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import psycopg
from psycopg import sql as psql

from catalog.core.maps import kv_map
from schema.sketch import (
    GridGeometry,
    StoredGrid,
    decode_cells,
)
from schema.store import scalar


def table_bytes(conn: psycopg.Connection, table: str) -> int:
    """Bytes on disk of a table with its indexes and TOAST, all partitions included."""
    row = conn.execute("SELECT coalesce(sum(pg_total_relation_size(relid)), 0)::bigint "
                       "FROM pg_partition_tree(%s::regclass)", (table,)).fetchone()
    return int(row[0]) if row else 0


def stored_layers(conn: psycopg.Connection, *, checkpoint_id: int, config_id: int) -> list[int]:
    return [r[0] for r in conn.execute(
        "SELECT layer FROM layer_result WHERE checkpoint_id = %s AND config_id = %s "
        "ORDER BY layer", (checkpoint_id, config_id)).fetchall()]


@dataclass
class Stored:
    """What the catalog already holds of one (model, step, config), found by name."""

    checkpoint_id: int
    n_layers: int
    layers: list[int]
    summary: bool

    def covers(self, layers: list[int] | None = None) -> bool:
        """True when every one of ``layers`` (default: all) is stored, and the checkpoint
        summary too where they are all the model's layers (only then is one computed)."""
        every = set(range(self.n_layers))
        want = every if layers is None else set(layers)
        return want <= set(self.layers) and (self.summary or want != every)


def find_stored(conn: psycopg.Connection, *, model_name: str, step: int | None,
                config_hash: str) -> Stored | None:
    """The stored layers of a checkpoint under a config, without loading any weights.

    ``model_name`` is the canonical name (``catalog.sources.canonical_name``); a step of
    None means the model's only weights. None when the checkpoint was never stored.
    """
    row = conn.execute(
        "SELECT c.id, m.n_layers, (SELECT id FROM measure_config WHERE config_hash = %s) "
        "FROM checkpoint c JOIN model m ON m.id = c.model_id "
        "WHERE m.name = %s AND c.step IS NOT DISTINCT FROM %s",
        (config_hash, model_name, step)).fetchone()
    if row is None:
        return None
    checkpoint_id, n_layers, config_id = row
    if config_id is None:
        return Stored(checkpoint_id, n_layers, [], False)
    summary = conn.execute("SELECT 1 FROM checkpoint_summary WHERE checkpoint_id = %s AND "
                           "config_id = %s", (checkpoint_id, config_id)).fetchone()
    return Stored(checkpoint_id, n_layers, stored_layers(
        conn, checkpoint_id=checkpoint_id, config_id=config_id), summary is not None)


def read_stored_grid(conn: psycopg.Connection, *, model_id: int, checkpoint_id: int, config_id: int,
              layer: int, neuron: int, op: str, kv: bool = False) -> StoredGrid:
    """One stored activation grid (full or sketch; schema.sketch), op1 on axis 0.

    With ``kv``, the KV map: each cell times the neuron's lens value of the cell's answer
    (for a sketch, each cell's block mean times that cell's lens value).
    """
    row = conn.execute(
        "SELECT g.q, g.codec, g.sketch, g.scale, g.vmin, l.side, l.valid, l.answer_index "
        "FROM neuron_grid g JOIN model m ON m.id = g.model_id "
        "JOIN grid_layout l ON l.config_id = g.config_id AND l.op = g.op "
        "AND l.number_limit = m.number_limit "
        "WHERE g.model_id = %s AND g.checkpoint_id = %s AND g.config_id = %s AND g.layer = %s "
        "AND g.neuron = %s AND g.op = %s",
        (model_id, checkpoint_id, config_id, layer, neuron, op)).fetchone()
    if row is None:
        raise KeyError(f"no grid for model {model_id}, checkpoint {checkpoint_id}, config "
                       f"{config_id}, layer {layer}, neuron {neuron}, op {op!r}")
    q, codec, sketch, scale, vmin, side, valid, answer_index = row
    geometry = GridGeometry.from_packed(side, valid)
    grid = decode_cells(q, codec, sketch, scale, vmin, geometry)
    if kv:
        lens = np.array(scalar(conn.execute(
            "SELECT numbers FROM neuron_lens WHERE model_id = %s AND checkpoint_id = %s "
            "AND config_id = %s AND layer = %s AND neuron = %s",
            (model_id, checkpoint_id, config_id, layer, neuron))),
            dtype=np.float32)
        flat = grid.values.reshape(-1)
        flat[geometry.valid] = kv_map(flat[geometry.valid],
                                      lens[np.frombuffer(answer_index, dtype=np.int32)])
        grid.row_means = grid.col_means = None  # those are of the K map
    return grid


def read_grid_values(conn: psycopg.Connection, *, model_id: int, checkpoint_id: int, config_id: int,
             layer: int, neuron: int, op: str, kv: bool = False) -> np.ndarray:
    """One activation grid as a (side, side) float32 array, op1 on axis 0, NaN where invalid
    (a sketch's cells hold their block's mean: ``read_stored_grid`` says which it is)."""
    return read_stored_grid(conn, model_id=model_id, checkpoint_id=checkpoint_id,
                            config_id=config_id, layer=layer, neuron=neuron, op=op,
                            kv=kv).values


def layer_effects(conn: psycopg.Connection, *, ids, column: str) -> list[tuple]:
    """(layer, neuron, op, value) of one effect column for a checkpoint under a config."""
    if column not in ("effect_exact", "effect_attr", "effect_attr_std", "rank_value",
                      "mean_act", "mean_kv"):
        raise ValueError(f"column must be effect_exact, effect_attr, effect_attr_std, "
                         f"rank_value, mean_act or mean_kv, got {column!r}")
    return conn.execute(
        f"SELECT layer, neuron, op, {column} FROM neuron_op WHERE model_id = %s "
        "AND checkpoint_id = %s AND config_id = %s",
        (ids.model_id, ids.checkpoint_id, ids.config_id)).fetchall()


def stored_labels(conn: psycopg.Connection, *, ids) -> list[tuple]:
    """(layer, neuron, op, score, bottom, family, target, params, base_rate, p_value) of
    every label (``implements``) of a checkpoint under a config, in a stable order."""
    return conn.execute(
        "SELECT s.layer, s.neuron, s.op, s.score, s.bottom, h.family, h.target, h.params, "
        "s.base_rate, s.p_value FROM neuron_score s JOIN heuristic h ON h.id = s.heuristic_id "
        "WHERE s.model_id = %s AND s.checkpoint_id = %s AND s.config_id = %s "
        "AND s.implements ORDER BY s.layer, s.neuron, s.op, h.key",
        (ids.model_id, ids.checkpoint_id, ids.config_id)).fetchall()


# ------------------------------------------------------------------ the planner's calibration


def vacuum_analyze(conn: psycopg.Connection) -> None:
    """VACUUM ANALYZE the database (autocommit connections only): sizes and statistics
    as a long-lived catalog would have them."""
    conn.execute("VACUUM ANALYZE")


def row_count(conn: psycopg.Connection, table: str) -> int:
    return int(scalar(conn.execute(
        psql.SQL("SELECT count(*) FROM {}").format(psql.Identifier(table)))))


def live_maps(conn: psycopg.Connection, layer: int | None = None) -> int:
    """(neuron, operator) rows that are not constant, of one layer or of all."""
    where = "" if layer is None else " WHERE layer = %s"
    return int(scalar(conn.execute(
        "SELECT count(*) FILTER (WHERE NOT coalesce(constant, false)) FROM neuron_op" + where,
        () if layer is None else (layer,))))


def grid_payloads(conn: psycopg.Connection, layer: int) -> list[tuple]:
    """(op, sketch, grids, payload bytes) of a layer's live grids, by tier."""
    return conn.execute(
        "SELECT g.op, g.sketch, count(*), sum(pg_column_size(g.q)) FROM neuron_grid g "
        "JOIN neuron_op n USING (model_id, checkpoint_id, config_id, layer, neuron, op) "
        "WHERE g.layer = %s AND NOT coalesce(n.constant, false) GROUP BY g.op, g.sketch",
        (layer,)).fetchall()
