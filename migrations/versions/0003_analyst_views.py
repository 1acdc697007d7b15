"""Analysts' views: neuron evolution, circuits, heuristic census, emergence, overlap.

Thresholds come from catalog_setting (match_threshold, default 0.6 as in the
heuristics paper; circuit_k, default 20 neurons per layer), so analysts change them
in one place and refresh. The heavy views are materialized; refresh_catalog_views()
refreshes them all.

Revision ID: 0003
Revises: 0002
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

SETTING = "(SELECT value FROM catalog_setting WHERE key = '{}')"
THRESHOLD = SETTING.format("match_threshold")
CIRCUIT_K = SETTING.format("circuit_k")

VIEWS = {
    # One row per (model, layer, neuron, operator, checkpoint step, config).
    "neuron_evolution": """
        CREATE VIEW neuron_evolution AS
        SELECT m.name AS model, c.step, n.layer, n.neuron, n.op, n.config_id,
               n.effect_exact, n.effect_attr, n.rank, n.max_act, n.density,
               h.label AS best_heuristic, h.family AS best_family, n.best_score,
               n.model_id, n.checkpoint_id
        FROM neuron_op n
        JOIN checkpoint c ON c.id = n.checkpoint_id
        JOIN model m ON m.id = n.model_id
        LEFT JOIN heuristic h ON h.id = n.best_heuristic_id""",
    # The top circuit_k neurons of every layer by patching effect.
    "circuit_neurons": f"""
        CREATE VIEW circuit_neurons AS
        SELECT m.name AS model, c.step, n.layer, n.neuron, n.op, n.config_id, n.rank,
               n.effect_exact, n.effect_attr, h.label AS best_heuristic, n.best_score,
               n.model_id, n.checkpoint_id
        FROM neuron_op n
        JOIN checkpoint c ON c.id = n.checkpoint_id
        JOIN model m ON m.id = n.model_id
        LEFT JOIN heuristic h ON h.id = n.best_heuristic_id
        WHERE n.rank < {CIRCUIT_K}""",
}

MATERIALIZED = {
    # How many circuit neurons match a heuristic of each family.
    "heuristic_census": f"""
        CREATE MATERIALIZED VIEW heuristic_census AS
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
        WHERE n.rank < {CIRCUIT_K} AND s.score >= {THRESHOLD}
        GROUP BY m.name, c.step, n.config_id, n.op, h.family, n.model_id, n.checkpoint_id""",
    # For each (neuron, operator, heuristic) that holds at the model's last stored
    # checkpoint: the first step from which its score stays >= the threshold.
    "heuristic_emergence": f"""
        CREATE MATERIALIZED VIEW heuristic_emergence AS
        WITH ck AS (
            SELECT c.model_id, lr.config_id, lr.layer, c.id AS checkpoint_id, c.step
            FROM layer_result lr JOIN checkpoint c ON c.id = lr.checkpoint_id
            WHERE c.step IS NOT NULL),
        pairs AS (
            SELECT DISTINCT s.model_id, s.config_id, s.layer, s.neuron, s.op, s.heuristic_id
            FROM neuron_score s WHERE s.score >= {THRESHOLD}),
        grid AS (
            SELECT p.*, ck.step, coalesce(s.score, 0) AS score
            FROM pairs p
            JOIN ck ON ck.model_id = p.model_id AND ck.config_id = p.config_id
                   AND ck.layer = p.layer
            LEFT JOIN neuron_score s ON s.model_id = p.model_id
                 AND s.checkpoint_id = ck.checkpoint_id AND s.config_id = p.config_id
                 AND s.layer = p.layer AND s.neuron = p.neuron AND s.op = p.op
                 AND s.heuristic_id = p.heuristic_id),
        agg AS (
            SELECT model_id, config_id, layer, neuron, op, heuristic_id,
                   max(step) FILTER (WHERE score < {THRESHOLD}) AS last_below,
                   max(step) AS last_step
            FROM grid GROUP BY model_id, config_id, layer, neuron, op, heuristic_id)
        SELECT m.name AS model, a.layer, a.neuron, a.op, a.config_id, h.label AS heuristic,
               h.family,
               (SELECT min(ck.step) FROM ck WHERE ck.model_id = a.model_id
                  AND ck.config_id = a.config_id AND ck.layer = a.layer
                  AND (a.last_below IS NULL OR ck.step > a.last_below)) AS emergence_step,
               a.model_id, a.heuristic_id
        FROM agg a
        JOIN model m ON m.id = a.model_id
        JOIN heuristic h ON h.id = a.heuristic_id
        WHERE a.last_below IS NULL OR a.last_below < a.last_step""",
    # Share of the last checkpoint's (heuristic, neuron) pairs in the circuit that
    # already match at each checkpoint (the heuristics paper's training-dynamics plot).
    "checkpoint_overlap": f"""
        CREATE MATERIALIZED VIEW checkpoint_overlap AS
        WITH ck AS (
            SELECT DISTINCT c.model_id, lr.config_id, c.id AS checkpoint_id, c.step
            FROM layer_result lr JOIN checkpoint c ON c.id = lr.checkpoint_id
            WHERE c.step IS NOT NULL),
        final AS (
            SELECT DISTINCT ON (model_id, config_id) model_id, config_id, checkpoint_id, step
            FROM ck ORDER BY model_id, config_id, step DESC),
        final_pairs AS (
            SELECT s.model_id, s.config_id, s.layer, s.neuron, s.op, s.heuristic_id
            FROM neuron_score s
            JOIN final f ON f.model_id = s.model_id AND f.config_id = s.config_id
                        AND f.checkpoint_id = s.checkpoint_id
            JOIN neuron_op n ON n.model_id = s.model_id AND n.checkpoint_id = s.checkpoint_id
                 AND n.config_id = s.config_id AND n.layer = s.layer AND n.neuron = s.neuron
                 AND n.op = s.op
            WHERE s.score >= {THRESHOLD} AND n.rank < {CIRCUIT_K})
        SELECT m.name AS model, ck.step, ck.config_id,
               (SELECT count(*) FROM final_pairs fp
                 WHERE fp.model_id = ck.model_id AND fp.config_id = ck.config_id) AS final_pairs,
               (SELECT count(*) FROM final_pairs fp
                 JOIN neuron_score s ON s.model_id = fp.model_id
                      AND s.checkpoint_id = ck.checkpoint_id AND s.config_id = fp.config_id
                      AND s.layer = fp.layer AND s.neuron = fp.neuron AND s.op = fp.op
                      AND s.heuristic_id = fp.heuristic_id AND s.score >= {THRESHOLD}
                 WHERE fp.model_id = ck.model_id AND fp.config_id = ck.config_id) AS present,
               ck.model_id, ck.checkpoint_id
        FROM ck JOIN model m ON m.id = ck.model_id""",
}

REFRESH = """
    CREATE FUNCTION refresh_catalog_views() RETURNS void LANGUAGE plpgsql AS $$
    BEGIN
      REFRESH MATERIALIZED VIEW heuristic_census;
      REFRESH MATERIALIZED VIEW heuristic_emergence;
      REFRESH MATERIALIZED VIEW checkpoint_overlap;
    END $$"""


def upgrade() -> None:
    for sql in VIEWS.values():
        op.execute(sql)
    for sql in MATERIALIZED.values():
        op.execute(sql)
    op.execute("CREATE INDEX ix_heuristic_census_model ON heuristic_census (model, step, op)")
    op.execute("CREATE INDEX ix_heuristic_emergence_model ON heuristic_emergence "
               "(model, layer, neuron, op)")
    op.execute(REFRESH)
    op.execute("GRANT SELECT ON neuron_evolution, circuit_neurons, heuristic_census, "
               "heuristic_emergence, checkpoint_overlap TO catalog_reader")


def downgrade() -> None:
    op.execute("DROP FUNCTION refresh_catalog_views()")
    for name in reversed(list(MATERIALIZED)):
        op.execute(f"DROP MATERIALIZED VIEW {name}")
    for name in reversed(list(VIEWS)):
        op.execute(f"DROP VIEW {name}")
