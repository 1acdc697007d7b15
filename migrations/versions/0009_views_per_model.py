"""The analysts' derived views refresh per model, not the whole catalog per job.

``heuristic_census``, ``heuristic_emergence`` and ``checkpoint_overlap`` were materialized
views: every finished job refreshed all three over the whole catalog, so the refresh
grew with the catalog, not with the job. They become tables of the same names and
columns, and ``refresh_catalog_views(p_model)`` replaces only one model's rows
(DELETE + INSERT of the same queries restricted to that model, under a per-model
transaction lock so two workers never interleave); ``refresh_catalog_views()`` (NULL)
still rebuilds everything. A model's rows are a function of that model's rows only
(census per checkpoint; emergence and overlap across the model's checkpoints), so the
result equals a full refresh (tested).

Revision ID: 0009
Revises: 0008
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

SETTING = "(SELECT value FROM catalog_setting WHERE key = '{}')"
THRESHOLD = SETTING.format("match_threshold")
CIRCUIT_K = SETTING.format("circuit_k")
LABEL = f"coalesce(s.implements, s.score >= {THRESHOLD})"
MINE = "(p_model IS NULL OR {}.model_id = p_model)"  # restricts a scan to one model

DERIVED = {
    "heuristic_census": f"""
        SELECT m.name AS model, c.step, n.config_id, n.op, h.family,
               count(DISTINCT (n.layer, n.neuron)) AS circuit_neurons,
               n.model_id, n.checkpoint_id
        FROM neuron_op n
        JOIN neuron_score s ON s.model_id = n.model_id AND s.checkpoint_id = n.checkpoint_id
             AND s.config_id = n.config_id AND s.layer = n.layer AND s.neuron = n.neuron
             AND s.op = n.op
        JOIN heuristic h ON h.id = s.heuristic_id
        JOIN checkpoint c ON c.id = n.checkpoint_id
        JOIN model m ON m.id = n.model_id
        WHERE n.rank < {CIRCUIT_K} AND {LABEL} AND {MINE.format('n')} AND {MINE.format('s')}
        GROUP BY m.name, c.step, n.config_id, n.op, h.family, n.model_id, n.checkpoint_id""",
    "heuristic_emergence": f"""
        WITH ck AS (
            SELECT c.model_id, lr.config_id, lr.layer, c.id AS checkpoint_id, c.step,
                   row_number() OVER (PARTITION BY c.model_id, lr.config_id, lr.layer
                                      ORDER BY c.step DESC NULLS FIRST) AS rn
            FROM layer_result lr JOIN checkpoint c ON c.id = lr.checkpoint_id
            WHERE {MINE.format('c')}),
        held AS (
            SELECT s.model_id, s.config_id, s.layer, s.neuron, s.op, s.heuristic_id,
                   ck.step, ck.rn,
                   row_number() OVER (PARTITION BY s.model_id, s.config_id, s.layer,
                                      s.neuron, s.op, s.heuristic_id ORDER BY ck.rn) AS k
            FROM neuron_score s
            JOIN ck ON ck.checkpoint_id = s.checkpoint_id AND ck.config_id = s.config_id
                   AND ck.layer = s.layer
            WHERE {LABEL} AND {MINE.format('s')}),
        runs AS (
            SELECT model_id, config_id, layer, neuron, op, heuristic_id,
                   min(step) AS emergence_step, count(*) AS checkpoints_held
            FROM held WHERE rn = k
            GROUP BY model_id, config_id, layer, neuron, op, heuristic_id)
        SELECT m.name AS model, r.layer, r.neuron, r.op, r.config_id, h.label AS heuristic,
               h.family, r.emergence_step, r.checkpoints_held, r.model_id, r.heuristic_id
        FROM runs r
        JOIN model m ON m.id = r.model_id
        JOIN heuristic h ON h.id = r.heuristic_id""",
    "checkpoint_overlap": f"""
        WITH ck AS (
            SELECT DISTINCT c.model_id, lr.config_id, c.id AS checkpoint_id, c.step
            FROM layer_result lr JOIN checkpoint c ON c.id = lr.checkpoint_id
            WHERE {MINE.format('c')}),
        final AS (
            SELECT DISTINCT ON (model_id, config_id) model_id, config_id, checkpoint_id
            FROM ck ORDER BY model_id, config_id, step DESC NULLS FIRST),
        final_pairs AS (
            SELECT s.model_id, s.config_id, s.layer, s.neuron, s.op, s.heuristic_id
            FROM neuron_score s
            JOIN final f ON f.model_id = s.model_id AND f.config_id = s.config_id
                        AND f.checkpoint_id = s.checkpoint_id
            JOIN neuron_op n ON n.model_id = s.model_id AND n.checkpoint_id = s.checkpoint_id
                 AND n.config_id = s.config_id AND n.layer = s.layer AND n.neuron = s.neuron
                 AND n.op = s.op
            WHERE {LABEL} AND n.rank < {CIRCUIT_K} AND {MINE.format('s')}
                  AND {MINE.format('n')}),
        totals AS (
            SELECT model_id, config_id, count(*) AS n FROM final_pairs
            GROUP BY model_id, config_id),
        present AS (
            SELECT s.model_id, s.config_id, s.checkpoint_id, count(*) AS n
            FROM final_pairs fp
            JOIN neuron_score s ON s.model_id = fp.model_id AND s.config_id = fp.config_id
                 AND s.layer = fp.layer AND s.neuron = fp.neuron AND s.op = fp.op
                 AND s.heuristic_id = fp.heuristic_id
            WHERE {LABEL} AND {MINE.format('s')}
            GROUP BY s.model_id, s.config_id, s.checkpoint_id)
        SELECT m.name AS model, ck.step, ck.config_id, t.n AS final_pairs,
               coalesce(p.n, 0) AS present,
               coalesce(p.n, 0)::real / nullif(t.n, 0) AS share,
               ck.model_id, ck.checkpoint_id
        FROM ck
        JOIN totals t ON t.model_id = ck.model_id AND t.config_id = ck.config_id
        LEFT JOIN present p ON p.model_id = ck.model_id AND p.config_id = ck.config_id
                           AND p.checkpoint_id = ck.checkpoint_id
        JOIN model m ON m.id = ck.model_id""",
}

INDEXES = (
    "CREATE INDEX ix_heuristic_census_model ON heuristic_census (model, step, op)",
    "CREATE INDEX ix_heuristic_census_model_id ON heuristic_census (model_id)",
    "CREATE INDEX ix_heuristic_emergence_model ON heuristic_emergence "
    "(model, layer, neuron, op)",
    "CREATE INDEX ix_heuristic_emergence_model_id ON heuristic_emergence (model_id)",
    "CREATE INDEX ix_checkpoint_overlap_model_id ON checkpoint_overlap (model_id)",
)


def upgrade() -> None:
    op.execute("DROP FUNCTION refresh_catalog_views()")
    for name in DERIVED:
        # the same columns and types, and the rows the view held
        op.execute(f"CREATE TABLE {name}_new AS SELECT * FROM {name}")
        op.execute(f"DROP MATERIALIZED VIEW {name}")
        op.execute(f"ALTER TABLE {name}_new RENAME TO {name}")
    for sql in INDEXES:
        op.execute(sql)
    body = "\n".join(
        f"      DELETE FROM {name} WHERE p_model IS NULL OR model_id = p_model;\n"
        f"      INSERT INTO {name} {sql};" for name, sql in DERIVED.items())
    op.execute(f"""
    CREATE FUNCTION refresh_catalog_views(p_model integer DEFAULT NULL) RETURNS void
    LANGUAGE plpgsql AS $$
    BEGIN
      -- one refresher per model at a time (all models: every refresher waits)
      PERFORM pg_advisory_xact_lock(20260009, coalesce(p_model, 0));
{body}
    END $$""")
    op.execute("GRANT SELECT ON heuristic_census, heuristic_emergence, checkpoint_overlap "
               "TO catalog_reader")


def downgrade() -> None:
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "views_0006", Path(__file__).with_name("0006_robust_effects_labels.py"))
    assert spec is not None and spec.loader is not None
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    op.execute("DROP FUNCTION refresh_catalog_views(integer)")
    for name in DERIVED:
        op.execute(f"DROP TABLE {name}")
    for sql in old.MATERIALIZED.values():
        op.execute(sql)
    op.execute("CREATE INDEX ix_heuristic_census_model ON heuristic_census (model, step, op)")
    op.execute("CREATE INDEX ix_heuristic_emergence_model ON heuristic_emergence "
               "(model, layer, neuron, op)")
    op.execute("""
    CREATE FUNCTION refresh_catalog_views() RETURNS void LANGUAGE plpgsql AS $$
    BEGIN
      REFRESH MATERIALIZED VIEW heuristic_census;
      REFRESH MATERIALIZED VIEW heuristic_emergence;
      REFRESH MATERIALIZED VIEW checkpoint_overlap;
    END $$""")
    op.execute("GRANT SELECT ON heuristic_census, heuristic_emergence, checkpoint_overlap "
               "TO catalog_reader")
