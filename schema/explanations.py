"""What ``ncat explain`` and the explorer's Prompt page read and write: the labels of every
neuron of a catalogued checkpoint for one operator (the heuristics as family, target and
parameters, so the catalog can test each against a prompt) and each neuron's typical
activation; explained prompts stored (``prompt_explanation``, migration 0029) and read
back, one or the same prompt across a model's checkpoints."""

from __future__ import annotations

import json
from typing import NamedTuple

import psycopg

from schema.reads import find_stored
from schema.store import json_safe, scalar


class CatalogLabels(NamedTuple):
    """What an explanation reads of a catalogued checkpoint for one operator: the label
    rows (layer, neuron, family, target, params, bottom) and, per (layer, neuron), the
    mean activation, the mean KV value (where stored) and the rank by effect (0 first)."""

    rows: list[tuple]
    typical: dict
    typical_kv: dict
    rank: dict


def catalogued_labels(conn: psycopg.Connection, *, model_name: str, step: int | None,
                      config_hash: str, op: str) -> CatalogLabels | None:
    """``labels_at`` of the checkpoint under the config; None when it is not catalogued
    under it."""
    have = find_stored(conn, model_name=model_name, step=step, config_hash=config_hash)
    if have is None or not have.layers:
        return None
    config_id = scalar(conn.execute("SELECT id FROM measure_config WHERE config_hash = %s",
                                    (config_hash,)))
    return labels_at(conn, checkpoint_id=have.checkpoint_id, config_id=config_id, op=op)


def catalogued_configs(conn: psycopg.Connection, *, model_name: str, step: int | None
                       ) -> list[tuple[int, str, dict, list[int]]]:
    """The configs a model was catalogued under (at ``step`` when given, else at any of
    its checkpoints), oldest first: (config id, its hash, the config as stored, the steps
    it holds, ascending). What ``ncat explain`` takes when it is given no config."""
    rows = conn.execute(
        "SELECT mc.id, mc.config_hash, mc.config, array_agg(DISTINCT c.step ORDER BY c.step) "
        "FROM measure_config mc JOIN layer_result lr ON lr.config_id = mc.id "
        "JOIN checkpoint c ON c.id = lr.checkpoint_id JOIN model m ON m.id = c.model_id "
        "WHERE m.name = %s AND (%s::bigint IS NULL OR c.step IS NOT DISTINCT FROM %s) "
        "GROUP BY mc.id ORDER BY mc.id", (model_name, step, step)).fetchall()
    return [(int(i), h, dict(c), [s for s in steps if s is not None]) for i, h, c, steps in rows]


def labels_at(conn: psycopg.Connection, *, checkpoint_id: int, config_id: int, op: str
              ) -> CatalogLabels:
    """The labels of ``op`` at a checkpoint under a config, named by their ids: the label
    rows with their side (``bottom``), every neuron's mean activation and mean KV value
    (the maps' typical values a label's side is checked against; NULL means are left out)
    and its rank by effect in its layer (what the paper's top set is drawn from)."""
    rows = conn.execute(
        "SELECT s.layer, s.neuron, h.family, h.target, h.params, s.bottom FROM neuron_score s "
        "JOIN heuristic h ON h.id = s.heuristic_id WHERE s.checkpoint_id = %s "
        "AND s.config_id = %s AND s.op = %s AND s.implements ORDER BY 1, 2, h.key",
        (checkpoint_id, config_id, op)).fetchall()
    typical: dict = {}
    typical_kv: dict = {}
    rank: dict = {}
    for la, n, act, kv, r in conn.execute(
            "SELECT layer, neuron, mean_act, mean_kv, rank FROM neuron_op WHERE "
            "checkpoint_id = %s AND config_id = %s AND op = %s",
            (checkpoint_id, config_id, op)):
        key = (int(la), int(n))
        if act is not None:
            typical[key] = float(act)
        if kv is not None:
            typical_kv[key] = float(kv)
        rank[key] = int(r)
    return CatalogLabels([tuple(r) for r in rows], typical, typical_kv, rank)


EXPLANATION_COLS = ("model_id", "checkpoint_id", "config_id", "prompt", "op", "a", "b",
                    "result", "predicted", "correct", "p_answer", "rank_answer", "target",
                    "share_holds", "share_labelled_other", "share_other_neurons",
                    "share_heads", "share_rest", "neurons_50", "neurons_80",
                    "heuristics_in_80", "labelled", "n_knocked", "p_knocked", "p_random",
                    "p_random_se", "explanation")
SHARES = {"share_holds": "labelled, heuristic holds",
          "share_labelled_other": "labelled, heuristic does not hold",
          "share_other_neurons": "other neurons", "share_heads": "heads",
          "share_rest": "embeddings and biases"}


def _finite(x):
    return None if x is None or x != x or x in (float("inf"), float("-inf")) else x


def write_explanation(conn: psycopg.Connection, *, model_id: int, checkpoint_id: int,
                      config_id: int, explanation: dict) -> None:
    """Upsert one explained prompt (``Explanation.to_dict()``) by checkpoint, config and
    prompt: a prompt explained again replaces its row."""
    e = explanation
    ko = e.get("knockout")
    values = [model_id, checkpoint_id, config_id, e["prompt"], e["op"], e["a"], e["b"],
              e["result"], e["predicted"], e["correct"], e["p_answer"], e["rank_answer"],
              e["target"], *(_finite(e["shares"].get(v)) for v in SHARES.values()),
              e["n_for"]["50%"], e["n_for"]["80%"], e["heuristics_in_80"], e["labelled"],
              len(ko["neurons"]) if ko else None, ko["p_knocked"] if ko else None,
              _finite(ko["p_random_mean"]) if ko else None,
              _finite(ko["p_random_se"]) if ko else None,
              json.dumps(json_safe(e))]
    keys = ("checkpoint_id", "config_id", "prompt")
    conn.execute(
        f"INSERT INTO prompt_explanation ({', '.join(EXPLANATION_COLS)}) VALUES "
        f"({', '.join(['%s'] * len(EXPLANATION_COLS))}) ON CONFLICT ({', '.join(keys)}) "
        "DO UPDATE SET " + ", ".join(f"{c} = EXCLUDED.{c}" for c in EXPLANATION_COLS
                                     if c not in keys) + ", written_at = now()", values)


def summary_explained(conn: psycopg.Connection, *, checkpoint_id: int, config_id: int
                      ) -> dict:
    """op -> the checkpoint summary's prompts explained (catalog.explain.grid's aggregate:
    the shares, what the label adds against its controls, the steering test); {} when
    the checkpoint has no summary under the config."""
    row = conn.execute(
        "SELECT prompt_explanations FROM checkpoint_summary WHERE checkpoint_id = %s "
        "AND config_id = %s", (checkpoint_id, config_id)).fetchone()
    return (row[0] or {}) if row else {}


def stored_explanation(conn: psycopg.Connection, *, checkpoint_id: int, config_id: int,
                       prompt: str) -> dict | None:
    """The stored explanation of ``prompt`` (as written: "21+17="), None if never stored."""
    row = conn.execute(
        "SELECT explanation FROM prompt_explanation WHERE checkpoint_id = %s AND "
        "config_id = %s AND prompt = %s", (checkpoint_id, config_id, prompt)).fetchone()
    return None if row is None else row[0]


def across_checkpoints(conn: psycopg.Connection, *, model_id: int, config_id: int,
                       prompt: str) -> list[dict]:
    """The prompt's stored explanations at each of the model's checkpoints under the
    config, by step: step, correct, p_answer, target, the shares, neurons for 80%, the
    knockout and its control."""
    cols = ("step", "correct", "p_answer", "target", *SHARES, "neurons_80", "p_knocked",
            "p_random", "p_random_se")
    rows = conn.execute(
        f"SELECT c.step, e.{', e.'.join(cols[1:])} FROM prompt_explanation e "
        "JOIN checkpoint c ON c.id = e.checkpoint_id WHERE e.model_id = %s AND "
        "e.config_id = %s AND e.prompt = %s ORDER BY c.step NULLS LAST",
        (model_id, config_id, prompt)).fetchall()
    return [dict(zip(cols, r, strict=True)) for r in rows]
