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
    # checkpoint: the first step from which its score stays >= the threshold. Checkpoints
    # are numbered from the last (rn = 1); a pair's holding checkpoints, numbered the same
    # way (k), form an unbroken run back from the last one exactly while rn = k.
    "heuristic_emergence": f"""
        CREATE MATERIALIZED VIEW heuristic_emergence AS
        WITH ck AS (
            SELECT c.model_id, lr.config_id, lr.layer, c.id AS checkpoint_id, c.step,
                   row_number() OVER (PARTITION BY c.model_id, lr.config_id, lr.layer
                                      ORDER BY c.step DESC) AS rn
            FROM layer_result lr JOIN checkpoint c ON c.id = lr.checkpoint_id
            WHERE c.step IS NOT NULL),
        held AS (
            SELECT s.model_id, s.config_id, s.layer, s.neuron, s.op, s.heuristic_id,
                   ck.step, ck.rn,
                   row_number() OVER (PARTITION BY s.model_id, s.config_id, s.layer,
                                      s.neuron, s.op, s.heuristic_id ORDER BY ck.rn) AS k
            FROM neuron_score s
            JOIN ck ON ck.checkpoint_id = s.checkpoint_id AND ck.config_id = s.config_id
                   AND ck.layer = s.layer
            WHERE s.score >= {THRESHOLD}),
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
    # Share of the last checkpoint's (heuristic, neuron) pairs in the circuit that
    # already match at each checkpoint (the heuristics paper's training-dynamics plot).
    "checkpoint_overlap": f"""
        CREATE MATERIALIZED VIEW checkpoint_overlap AS
        WITH ck AS (
            SELECT DISTINCT c.model_id, lr.config_id, c.id AS checkpoint_id, c.step
            FROM layer_result lr JOIN checkpoint c ON c.id = lr.checkpoint_id
            WHERE c.step IS NOT NULL),
        final AS (
            SELECT DISTINCT ON (model_id, config_id) model_id, config_id, checkpoint_id
            FROM ck ORDER BY model_id, config_id, step DESC),
        final_pairs AS (
            SELECT s.model_id, s.config_id, s.layer, s.neuron, s.op, s.heuristic_id
            FROM neuron_score s
            JOIN final f ON f.model_id = s.model_id AND f.config_id = s.config_id
                        AND f.checkpoint_id = s.checkpoint_id
            JOIN neuron_op n ON n.model_id = s.model_id AND n.checkpoint_id = s.checkpoint_id
                 AND n.config_id = s.config_id AND n.layer = s.layer AND n.neuron = s.neuron
                 AND n.op = s.op
            WHERE s.score >= {THRESHOLD} AND n.rank < {CIRCUIT_K}),
        totals AS (
            SELECT model_id, config_id, count(*) AS n FROM final_pairs
            GROUP BY model_id, config_id),
        present AS (
            SELECT s.model_id, s.config_id, s.checkpoint_id, count(*) AS n
            FROM final_pairs fp
            JOIN neuron_score s ON s.model_id = fp.model_id AND s.config_id = fp.config_id
                 AND s.layer = fp.layer AND s.neuron = fp.neuron AND s.op = fp.op
                 AND s.heuristic_id = fp.heuristic_id
            WHERE s.score >= {THRESHOLD}
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
