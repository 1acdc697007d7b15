"""Writing measurements to PostgreSQL; the connection helpers every module uses.

The bulk writer takes one layer's measurements as plain arrays (``LayerRows``; jobs
converts what ``catalog.measure`` returns) and writes them in ONE transaction: COPY
into temporary staging tables, then ``INSERT ... SELECT ... ON CONFLICT DO UPDATE``
into the partitioned tables, plus the ``layer_result`` marker. Writing the same layer
twice leaves the same rows; a failure anywhere rolls the whole layer back, so no
partial layer is ever visible. Plain functions with keyword-only arguments, over a
psycopg connection.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

import numpy as np
import psycopg

from catalog.config.vocab import FIT_COLS, FIT_OP_COLS
from catalog.periodic.spectra import SPECTRUM_COLS
from schema.database import connect_args
from schema.quantize import quantize_rows
from schema.rows import HeuristicLike, LayerRows
from schema.sketch import CODEC_ZSTD, GridGeometry, encode_full, encode_sketches

NEURON_OP_COLS = ("max_act", "mean_act", "mean_kv", "density", "effect_exact", "effect_exact_std",
                  "effect_attr", "effect_attr_std", "rank", "effect_log", "effect_median",
                  "effect_trimmed", "moved_share", "rank_value", "is_exact", "constant",
                  *SPECTRUM_COLS, *FIT_COLS, *FIT_OP_COLS)


KEY = ("model_id", "checkpoint_id", "config_id", "layer", "neuron")


def json_safe(x):
    """A JSON-safe copy: NaN and infinities become null (JSON has neither; PostgreSQL's
    jsonb refuses them), numpy scalars plain numbers, keys strings."""
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [json_safe(v) for v in x]
    if isinstance(x, float | np.floating):
        return None if not math.isfinite(float(x)) else float(x)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x


def connect(url: str, **kwargs) -> psycopg.Connection:
    """psycopg connection from a SQLAlchemy-style or plain PostgreSQL URL (connect_timeout:
    ``schema.database.connect_args`` unless ``kwargs`` set one)."""
    return psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"),
                           **{**connect_args(url), **kwargs})


def drop_database(url: str) -> None:
    """Drop the database of ``url`` (connections to it are closed), if it exists."""
    from sqlalchemy.engine import make_url

    u = make_url(url)
    admin = u.set(database="postgres").render_as_string(hide_password=False)
    with connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{u.database}" WITH (FORCE)')


def scalar(cursor: psycopg.Cursor):
    """The first column of a query's one row; LookupError when there is none."""
    row = cursor.fetchone()
    if row is None:
        raise LookupError("the query returned no row")
    return row[0]


def upsert_model(conn: psycopg.Connection, *, info: dict) -> int:
    """Insert or update a model by name; returns its id."""
    cols = ("name", "source", "n_layers", "d_model", "d_mlp", "d_vocab", "act_fn", "gated_mlp",
            "number_limit", "digit_level")
    return scalar(conn.execute(
        f"INSERT INTO model ({', '.join(cols)}) VALUES ({', '.join(['%s'] * len(cols))}) "
        f"ON CONFLICT (name) DO UPDATE SET {', '.join(f'{c} = EXCLUDED.{c}' for c in cols[1:])} "
        "RETURNING id", [info[c] for c in cols]))


def upsert_checkpoint(conn: psycopg.Connection, *, model_id: int, step: int | None,
                      revision: str | None, weights_hash: str,
                      transformers_nats: float | None = None) -> int:
    """Insert or update a checkpoint (safe when several processes register it at once),
    then flag every checkpoint of the model whose weights equal an EARLIER step's:
    ``duplicate_of_step`` is the first step with the same weights hash.
    ``transformers_nats``: the load's difference from transformers (None: not compared;
    a later load that did not compare keeps the value stored)."""
    checkpoint_id = scalar(conn.execute(
        "INSERT INTO checkpoint (model_id, step, revision, weights_hash, transformers_nats) "
        "VALUES (%s, %s, %s, %s, %s) ON CONFLICT ON CONSTRAINT uq_checkpoint_model_step "
        "DO UPDATE SET revision = EXCLUDED.revision, weights_hash = EXCLUDED.weights_hash, "
        "transformers_nats = coalesce(EXCLUDED.transformers_nats, "
        "checkpoint.transformers_nats) RETURNING id",
        (model_id, step, revision, weights_hash, transformers_nats)))
    conn.execute(
        "UPDATE checkpoint c SET duplicate_of_step = (SELECT min(d.step) FROM checkpoint d "
        "WHERE d.model_id = c.model_id AND d.weights_hash = c.weights_hash AND d.step < c.step) "
        "WHERE c.model_id = %s", (model_id,))
    return checkpoint_id


def upsert_config(conn: psycopg.Connection, *, config: dict, config_hash: str,
                  catalog_version: str) -> int:
    """Insert a measurement config (idempotent by hash); returns its id."""
    return scalar(conn.execute(
        "INSERT INTO measure_config (config_hash, config, operators, operand_lo, operand_hi, "
        "template, pairs_per_op, seed, heuristic_variant, catalog_version) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
        "ON CONFLICT (config_hash) DO UPDATE SET config_hash = EXCLUDED.config_hash "
        "RETURNING id",
        (config_hash, json.dumps(config), "".join(config["operators"]), config["operand_lo"],
         config["operand_hi"], config["few_shot"] + config["template"], config["pairs_per_op"],
         config["seed"], config["heuristic_variant"], catalog_version)))


def upsert_grid_layout(conn: psycopg.Connection, *, config_id: int, number_limit: int, op: str,
                       lo: int, side: int, valid: np.ndarray, answer_index: np.ndarray) -> None:
    """Store which cells of op's side x side grid are valid (row-major, a then b), and
    where each valid cell's answer sits on the lens's number axis."""
    valid = np.asarray(valid, dtype=bool).reshape(side * side)
    conn.execute(
        "INSERT INTO grid_layout (config_id, number_limit, op, lo, side, n_cells, valid, "
        "answer_index) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
        (config_id, number_limit, op, lo, side, int(valid.sum()),
         np.packbits(valid).tobytes(), np.asarray(answer_index, dtype=np.int32).tobytes()))


def upsert_heuristics(conn: psycopg.Connection, *,
                      rows: Sequence[HeuristicLike]) -> dict[str, int]:
    """Insert heuristics by key (existing ones kept); returns key -> id for all of them."""
    if not rows:
        return {}
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO heuristic (key, family, target, params, label) "
            "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (key) DO NOTHING",
            [(r.key, r.family, r.target, json.dumps(list(r.params)), r.label) for r in rows])
    got = conn.execute("SELECT key, id FROM heuristic WHERE key = ANY(%s)",
                       ([r.key for r in rows],)).fetchall()
    return dict(got)


def _f(x) -> float | None:
    x = float(x)
    return None if np.isnan(x) else x


def real_array(values) -> str:
    """A ``real[]`` value as COPY's text format reads it, written in one join: each value
    rounded to float32, then its float64 ``repr`` (the shortest text that reads back as
    that float64, so PostgreSQL's float4 parse gives back the same bits; it reads 'nan',
    'inf' and '-inf' as they are). psycopg adapts a list element by element in Python:
    with the 1,000-number lens of each neuron adapted that way, a built-in layer's write
    took 1.55x as long (``bench/writer.py``)."""
    return "{" + ",".join(map(repr, np.asarray(values, dtype=np.float32).tolist())) + "}"


def _copy(cur, table: str, cols: tuple[str, ...], rows) -> None:
    quoted = ", ".join('"' + c + '"' for c in cols)
    with cur.copy(f"COPY {table} ({quoted}) FROM STDIN") as cp:
        for row in rows:
            cp.write_row(row)


STAGING = {"neuron_op": "s_op", "neuron_grid": "s_grid", "neuron_lens": "s_lens",
           "neuron_score": "s_score"}


def copy_layer_rows(conn: psycopg.Connection, cur, *, key: tuple, rows: LayerRows,
                    into: dict[str, str]) -> None:
    """COPY one layer's rows into the tables named by ``into`` (target table -> table)."""
    ops, d_mlp = rows.ops, rows.d_mlp
    m = rows.matches
    ids = upsert_heuristics(conn, rows=list({h.key: h for h in m.heuristics}.values()))
    keys = [h.key for h in m.heuristics]
    best = _best_per_neuron_op(rows, ids)
    op_cols = KEY + ("op",) + NEURON_OP_COLS + ("op_accuracy", "best_heuristic_id", "best_score",
                                                "best_bottom", "labelled")
    stats = rows.stats

    def value(c, n, o):
        if c not in stats and (c in SPECTRUM_COLS or c in FIT_COLS or c in FIT_OP_COLS):
            return None  # not measured (spectra off, or labels before 0.10.0)
        if c in FIT_OP_COLS:
            return str(stats[c][n, o]) or None
        if c in SPECTRUM_COLS:  # smallints; -1: not measured
            v = stats[c][n, o]
            return None if v < 0 else int(v)
        v = stats[c][n, o]
        if c == "rank":
            return int(v)
        if v.dtype == bool:
            return bool(v)
        return _f(v)

    none = (None, None, None, None)
    _copy(cur, into["neuron_op"], op_cols, (
        key + (n, op) + tuple(value(c, n, o) for c in NEURON_OP_COLS)
        + (float(rows.op_accuracy[o]),) + best.get((n, o), none)
        for o, op in enumerate(ops) for n in range(d_mlp)))
    _copy(cur, into["neuron_grid"], KEY + ("op", "q", "scale", "vmin", "codec", "sketch"),
          grid_rows(rows, key))
    _copy(cur, into["neuron_lens"], KEY + ("numbers", "top_tokens", "top_values",
                                           "bottom_tokens", "bottom_values"), (
        key + (n, real_array(rows.lens_numbers[n]), rows.lens_top_tokens[n],
               real_array(rows.lens_top_values[n]), rows.lens_bottom_tokens[n],
               real_array(rows.lens_bottom_values[n]))
        for n in range(d_mlp)))
    _copy(cur, into["neuron_score"],
          KEY + ("op", "heuristic_id", "score", "bottom", "base_rate", "p_value", "implements",
                 "testable"), (
        key + (int(n), ops[o], ids[keys[h]], float(s), bool(b), _f(r), _f(p), bool(i), bool(t))
        for n, o, h, s, b, r, p, i, t in zip(m.neuron, m.op, m.heuristic, m.score, m.bottom,
                                             m.base_rate, m.p_value, m.implements, m.testable,
                                             strict=True)))


def full_grid_mask(rows: LayerRows) -> np.ndarray:
    """(d_mlp, n_ops) True where the grid is stored in full: rank < full_top, and every
    grid of an operator whose side fits one sketch block per cell (the sketch would be
    the grid itself plus its means)."""
    full = np.ones((rows.d_mlp, len(rows.ops)), dtype=bool)
    if rows.full_top is None:
        return full
    for o in range(len(rows.ops)):
        if rows.layouts is None or rows.layouts[o].block > 1:
            full[:, o] = np.asarray(rows.stats["rank"])[:, o] < rows.full_top
    return full


def grid_rows(rows: LayerRows, key: tuple) -> list[tuple]:
    """neuron_grid rows of a layer: zstd-compressed full grids where ``full_grid_mask``
    says so, sketches elsewhere (schema.sketch)."""
    full = full_grid_mask(rows)
    if not full.all() and rows.layouts is None:
        raise ValueError("sketches need the grid layouts (LayerRows.layouts)")
    out: list[tuple] = []
    ops = rows.ops
    for o in range(len(ops)):
        grids = rows.grids[o]
        q, scale, vmin = quantize_rows(grids)
        payload: dict[int, tuple[bytes, int]] = {}
        keep = np.nonzero(full[:, o])[0]
        layout = rows.layouts[o] if rows.layouts is not None else None
        payload.update(zip(keep.tolist(), encode_full(q[keep], layout), strict=True))
        rest = np.nonzero(~full[:, o])[0]
        if len(rest):
            assert layout is not None
            sketches = encode_sketches(grids[rest], scale[rest], vmin[rest], layout)
            payload.update((int(n), (data, CODEC_ZSTD))
                           for n, data in zip(rest, sketches, strict=True))
        for n in range(rows.d_mlp):
            data, codec = payload[n]
            out.append(key + (n, ops[o], data, float(scale[n]), float(vmin[n]), codec,
                              not bool(full[n, o])))
    return out


def write_full_grids(conn: psycopg.Connection, *, model_id: int, checkpoint_id: int,
                     config_id: int, layer: int, neurons: Sequence[int], ops: Sequence[str],
                     grids: Sequence[np.ndarray],
                     layouts: Sequence[GridGeometry] | None = None) -> int:
    """Replace the stored grids of ``neurons`` of one layer with full-resolution grids
    (``grids``: per operator, (len(neurons), n_cells); ``layouts``: per operator, the
    grid's geometry, which lets the codes be predicted before compression); returns the
    rows updated. Only rows that exist are updated: a full grid never creates a neuron
    the layer lacks."""
    rows: list[tuple] = []
    for o, (op, g) in enumerate(zip(ops, grids, strict=True)):
        q, scale, vmin = quantize_rows(g)
        coded = encode_full(q, None if layouts is None else layouts[o])
        rows.extend((data, float(scale[i]), float(vmin[i]), codec, model_id,
                     checkpoint_id, config_id, layer, int(n), op)
                    for i, (n, (data, codec)) in enumerate(zip(neurons, coded, strict=True)))
    updated = 0
    with conn.transaction(), conn.cursor() as cur:
        for row in rows:
            cur.execute(
                "UPDATE neuron_grid SET q = %s, scale = %s, vmin = %s, codec = %s, "
                "sketch = false WHERE model_id = %s AND checkpoint_id = %s AND config_id = %s "
                "AND layer = %s AND neuron = %s AND op = %s", row)
            updated += cur.rowcount
    return updated


def write_layer(conn: psycopg.Connection, *, model_id: int, checkpoint_id: int, config_id: int,
                rows: LayerRows, worker: str | None = None, seconds: float | None = None) -> dict:
    """Write one layer's rows in one transaction; returns row counts.

    Idempotent: the layer's previous score rows are replaced, other rows upserted.
    """
    layer, d_mlp = rows.layer, rows.d_mlp
    key = (model_id, checkpoint_id, config_id, layer)
    with conn.transaction(), conn.cursor() as cur:
        for table, staging in STAGING.items():
            cur.execute(f"CREATE TEMP TABLE {staging} (LIKE {table}) ON COMMIT DROP")
        copy_layer_rows(conn, cur, key=key, rows=rows, into=STAGING)
        for table, extra in (("neuron_op", ("op",)), ("neuron_grid", ("op",)),
                             ("neuron_lens", ())):
            pk = KEY + extra
            cols = [r[0] for r in cur.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
                "ORDER BY ordinal_position", (table,)).fetchall()]
            update = ", ".join(f'"{c}" = EXCLUDED."{c}"' for c in cols if c not in pk)
            cur.execute(f"INSERT INTO {table} SELECT * FROM {STAGING[table]} "
                        f"ON CONFLICT ({', '.join(pk)}) DO UPDATE SET {update}")
        cur.execute("DELETE FROM neuron_score WHERE model_id = %s AND checkpoint_id = %s "
                    "AND config_id = %s AND layer = %s", key)
        cur.execute("INSERT INTO neuron_score SELECT * FROM s_score")
        cur.execute(
            "INSERT INTO layer_result (checkpoint_id, config_id, layer, n_neurons, n_scores, "
            "worker, seconds, patching, label_control) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) "
            "ON CONFLICT (checkpoint_id, config_id, layer) DO UPDATE SET "
            "n_neurons = EXCLUDED.n_neurons, n_scores = EXCLUDED.n_scores, "
            "worker = EXCLUDED.worker, seconds = EXCLUDED.seconds, "
            "patching = EXCLUDED.patching, label_control = EXCLUDED.label_control, "
            "written_at = now()",
            (checkpoint_id, config_id, layer, d_mlp, len(rows.matches.score), worker, seconds,
             None if rows.patching is None else json.dumps(rows.patching),
             None if rows.label_control is None else json.dumps(rows.label_control)))
    return {"neuron_op": d_mlp * len(rows.ops), "neuron_grid": d_mlp * len(rows.ops),
            "neuron_lens": d_mlp, "neuron_score": len(rows.matches.score)}


def _best_per_neuron_op(rows: LayerRows, ids: dict[str, int]):
    """(neuron, op index) -> (heuristic id, score, bottom, labelled) of its best heuristic:
    where it has labels the most specific one (the smallest set, then the higher score;
    a "result = 8" detector is shown as that, not as "result in [0, 10)"), or with
    ``rows.best_label == "score"`` the highest-scoring one; else its highest score among
    the heuristics the grid can test (``Matches.testable``), then among the rest."""
    specific = getattr(rows, "best_label", "specific") == "specific"
    best: dict[tuple[int, int], tuple] = {}
    order: dict[tuple[int, int], tuple] = {}
    m = rows.matches
    for n, o, h, s, b, i, br, t in zip(m.neuron, m.op, m.heuristic, m.score, m.bottom,
                                       m.implements, m.base_rate, m.testable, strict=True):
        k = (int(n), int(o))
        size = -float(np.nan_to_num(br, nan=1.0)) if specific else 0.0
        # unlabelled: a set the grid can test before one too small to (a residue class of
        # two or three cells scores 1 on anything)
        rank = (2, size, float(s)) if i else (int(bool(t)), float(s), 0.0)
        if k not in order or rank > order[k]:
            order[k] = rank
            best[k] = (ids[m.heuristics[h].key], float(s), bool(b), bool(i))
    return best


def write_summary(conn: psycopg.Connection, *, checkpoint_id: int, config_id: int,
                  summary: dict) -> None:
    """Upsert a checkpoint summary (accuracy, faithfulness, knockouts, heuristic counts)."""
    cols = ("accuracy", "faithfulness", "heuristic_knockouts", "prompt_knockouts",
            "n_heuristic_neurons", "n_correct", "n_pairs", "n_excluded", "residual_lens",
            "enrichment", "aliases", "prompt_explanations")
    conn.execute(
        f"INSERT INTO checkpoint_summary (checkpoint_id, config_id, layers, {', '.join(cols)}) "
        f"VALUES (%s, %s, %s, {', '.join(['%s'] * len(cols))}) "
        f"ON CONFLICT (checkpoint_id, config_id) DO UPDATE SET layers = EXCLUDED.layers, "
        f"{', '.join(f'{c} = EXCLUDED.{c}' for c in cols)}, written_at = now()",
        [checkpoint_id, config_id, summary.get("layers")]
        + [json.dumps(summary.get(c)) for c in cols])
    write_circuits(conn, checkpoint_id=checkpoint_id, config_id=config_id,
                   components=summary.get("components") or [],
                   curves=summary.get("curves") or [])


_POINT_COLS = ("circuit", "metric", "k", "fraction", "mib", "paper", "mean_ratio",
               "mean_ratio_se", "ratio_of_means", "ratio_of_means_se", "median_ratio", "n",
               "n_small", "n_clipped", "max_influence", "influence_bound")


_CURVE_COLS = ("late_from", "late_source", "pruned", "whole", "heads", "n_heads_kept",
               "n_prompts", "n_unique", "seeds", "context", "population", "ranking",
               "baselines", "areas")


_COMPONENT_COLS = ("layer", "head", "position", "n_pairs", "effect_exact", "effect_exact_std",
                   "effect_attr", "effect_attr_std", "effect_log", "effect_median",
                   "effect_trimmed", "moved_share", "rank_value", "is_exact")


def write_circuits(conn: psycopg.Connection, *, checkpoint_id: int, config_id: int,
                   components: list[dict], curves: list[dict]) -> None:
    """Replace a checkpoint's component effects and faithfulness curves under a config
    (component_effect, circuit_summary, circuit_point; migration 0019). ``curves`` are
    ``CurveResult.as_dict()``s; NaN must already be None."""
    key = (checkpoint_id, config_id)
    for table in ("component_effect", "circuit_point", "circuit_summary"):
        conn.execute(f"DELETE FROM {table} WHERE checkpoint_id = %s AND config_id = %s", key)
    if not components and not curves:
        return
    model_id = scalar(conn.execute("SELECT model_id FROM checkpoint WHERE id = %s",
                                   (checkpoint_id,)))
    base = ("model_id", "checkpoint_id", "config_id", "op")
    with conn.cursor() as cur:
        if components:
            cur.executemany(
                f"INSERT INTO component_effect ({', '.join(base + _COMPONENT_COLS)}) VALUES "
                f"({', '.join(['%s'] * (len(base) + len(_COMPONENT_COLS)))})",
                [(model_id, checkpoint_id, config_id, r["op"])
                 + tuple(r[c] for c in _COMPONENT_COLS) for r in components])
        json_cols = {"heads", "baselines", "areas"}
        for c in curves:
            cur.execute(
                f"INSERT INTO circuit_summary ({', '.join(base + ('protocol',) + _CURVE_COLS)})"
                f" VALUES ({', '.join(['%s'] * (len(base) + 1 + len(_CURVE_COLS)))})",
                (model_id, checkpoint_id, config_id, c["op"], c["protocol"])
                + tuple(json.dumps(c[k]) if k in json_cols else c[k] for k in _CURVE_COLS))
            cur.executemany(
                f"INSERT INTO circuit_point ({', '.join(base + ('protocol',) + _POINT_COLS)}) "
                f"VALUES ({', '.join(['%s'] * (len(base) + 1 + len(_POINT_COLS)))})",
                [(model_id, checkpoint_id, config_id, c["op"], c["protocol"])
                 + tuple(pt.get(k) for k in _POINT_COLS) for pt in c["points"]])


# table -> its columns analyzed ('': all): the lens is read by key, and sampling its arrays
# took 5 s of the server's CPU per summary on the demo's catalog (its keys: 36 ms)
ANALYZED = {t: "" for t in ("neuron_op", "neuron_score", "heuristic", "checkpoint",
            "layer_result", "model", "measure_config", "checkpoint_summary", "circuit_summary",
            "circuit_point", "final_circuit_point", "component_effect")} | {
    "neuron_lens": "(model_id, checkpoint_id, config_id, layer, neuron)"}


def refresh_views(conn: psycopg.Connection, model_id: int | None = None,
                  checkpoint_id: int | None = None, config_id: int | None = None) -> str:
    """Bring the analysts' derived tables (census, emergence, overlap, label histogram)
    up to date after a bulk load; returns what was done.

    With a checkpoint (and its config), only that checkpoint's newly written layers are
    folded in (``refresh_checkpoint_views``, migration 0011): work that does not grow
    with the model's other checkpoints. With only a model, that model is rebuilt; with
    nothing, every model. Statistics are updated first (``ANALYZED``, the summary's tables
    too): without them PostgreSQL plans joins over freshly written rows as if the tables
    were empty (the circuit-curve query took 13 s on a fresh demo catalog, 8 ms with)."""
    conn.execute("ANALYZE " + ", ".join(f"{t} {cols}".strip() for t, cols in ANALYZED.items()))
    if checkpoint_id is not None:
        if model_id is None or config_id is None:
            raise ValueError("folding in a checkpoint needs its model_id and config_id")
        return str(scalar(conn.execute("SELECT refresh_checkpoint_views(%s, %s, %s)",
                                       (model_id, checkpoint_id, config_id))))
    conn.execute("SELECT refresh_catalog_views(%s)", (model_id,))
    return "rebuilt"
