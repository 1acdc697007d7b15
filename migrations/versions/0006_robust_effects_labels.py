"""Robust effects, tiered patching, the label rule, summaries of layer subsets.

- neuron_op: the log-space effect's mean, median and 10%-trimmed mean, the share of
  pairs the neuron moves, the signed statistic neurons are ranked by (``rank_value``),
  whether those come from exact patching (``is_exact``), the constant-map flag, and for
  the best heuristic its bottom flag and whether it is a label (``labelled``).
- neuron_score: ``implements``, the config's label rule applied (score >= threshold and,
  under the default rule, p-value <= level / heuristics scored).
- layer_result: ``patching``, per operator the pairs used, the neurons patched exactly and
  the Spearman rank agreement between attribution and exact effects on them.
- checkpoint_summary: which layers the summary covers, and per operator the correct
  prompts, the pairs used and the correct prompts left out because a shot solves them.
- Views: labels come from ``implements`` (rows written before this revision fall back
  to score >= match_threshold); emergence and overlap also cover models without steps;
  the views carry ``best_bottom``, ``labelled``, ``rank_value`` and ``is_exact``.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

SETTING = "(SELECT value FROM catalog_setting WHERE key = '{}')"
THRESHOLD = SETTING.format("match_threshold")
CIRCUIT_K = SETTING.format("circuit_k")
# A label: the stored verdict, or for rows written before it existed the raw rule.
LABEL = f"coalesce(s.implements, s.score >= {THRESHOLD})"

VIEWS = {
    "neuron_evolution": """
        CREATE VIEW neuron_evolution AS
        SELECT m.name AS model, c.step, n.layer, n.neuron, n.op, n.config_id,
               n.effect_exact, n.effect_attr, n.rank, n.max_act, n.density,
               h.label AS best_heuristic, h.family AS best_family, n.best_score,
               n.model_id, n.checkpoint_id, n.rank_value, n.effect_trimmed, n.effect_median,
               n.moved_share, n.is_exact, n.constant, n.best_bottom, n.labelled
        FROM neuron_op n
        JOIN checkpoint c ON c.id = n.checkpoint_id
        JOIN model m ON m.id = n.model_id
        LEFT JOIN heuristic h ON h.id = n.best_heuristic_id""",
    "circuit_neurons": f"""
        CREATE VIEW circuit_neurons AS
        SELECT m.name AS model, c.step, n.layer, n.neuron, n.op, n.config_id, n.rank,
               n.effect_exact, n.effect_attr, h.label AS best_heuristic, n.best_score,
               n.model_id, n.checkpoint_id, n.rank_value, n.is_exact, n.best_bottom,
               n.labelled
        FROM neuron_op n
        JOIN checkpoint c ON c.id = n.checkpoint_id
        JOIN model m ON m.id = n.model_id
        LEFT JOIN heuristic h ON h.id = n.best_heuristic_id
        WHERE n.rank < {CIRCUIT_K}""",
}

MATERIALIZED = {
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
        WHERE n.rank < {CIRCUIT_K} AND {LABEL}
        GROUP BY m.name, c.step, n.config_id, n.op, h.family, n.model_id, n.checkpoint_id""",
    # For each (neuron, operator, heuristic) labelled at the model's last stored checkpoint:
    # the first step from which it stays labelled. Checkpoints are numbered from the last
    # (rn = 1; a model without steps has one checkpoint, numbered 1); a pair's labelled
    # checkpoints, numbered the same way (k), form an unbroken run back from the last one
    # exactly while rn = k.
    "heuristic_emergence": f"""
        CREATE MATERIALIZED VIEW heuristic_emergence AS
        WITH ck AS (
            SELECT c.model_id, lr.config_id, lr.layer, c.id AS checkpoint_id, c.step,
                   row_number() OVER (PARTITION BY c.model_id, lr.config_id, lr.layer
                                      ORDER BY c.step DESC NULLS FIRST) AS rn
            FROM layer_result lr JOIN checkpoint c ON c.id = lr.checkpoint_id),
        held AS (
            SELECT s.model_id, s.config_id, s.layer, s.neuron, s.op, s.heuristic_id,
                   ck.step, ck.rn,
                   row_number() OVER (PARTITION BY s.model_id, s.config_id, s.layer,
                                      s.neuron, s.op, s.heuristic_id ORDER BY ck.rn) AS k
            FROM neuron_score s
            JOIN ck ON ck.checkpoint_id = s.checkpoint_id AND ck.config_id = s.config_id
                   AND ck.layer = s.layer
            WHERE {LABEL}),
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
        CREATE MATERIALIZED VIEW checkpoint_overlap AS
        WITH ck AS (
            SELECT DISTINCT c.model_id, lr.config_id, c.id AS checkpoint_id, c.step
            FROM layer_result lr JOIN checkpoint c ON c.id = lr.checkpoint_id),
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
            WHERE {LABEL} AND n.rank < {CIRCUIT_K}),
        totals AS (
            SELECT model_id, config_id, count(*) AS n FROM final_pairs
            GROUP BY model_id, config_id),
        present AS (
            SELECT s.model_id, s.config_id, s.checkpoint_id, count(*) AS n
            FROM final_pairs fp
            JOIN neuron_score s ON s.model_id = fp.model_id AND s.config_id = fp.config_id
                 AND s.layer = fp.layer AND s.neuron = fp.neuron AND s.op = fp.op
                 AND s.heuristic_id = fp.heuristic_id
            WHERE {LABEL}
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

NEURON_OP_COLUMNS = (
    ("effect_log", sa.REAL()), ("effect_median", sa.REAL()), ("effect_trimmed", sa.REAL()),
    ("moved_share", sa.REAL()), ("rank_value", sa.REAL()), ("is_exact", sa.Boolean()),
    ("constant", sa.Boolean()), ("best_bottom", sa.Boolean()), ("labelled", sa.Boolean()),
)
SUMMARY_COLUMNS = (("layers", ARRAY(sa.Integer())), ("n_correct", JSONB()),
                   ("n_pairs", JSONB()), ("n_excluded", JSONB()))


def _drop_views() -> None:
    op.execute("DROP FUNCTION refresh_catalog_views()")
    for name in ("checkpoint_overlap", "heuristic_emergence", "heuristic_census"):
        op.execute(f"DROP MATERIALIZED VIEW {name}")
    for name in ("circuit_neurons", "neuron_evolution"):
        op.execute(f"DROP VIEW {name}")


def _create_views(views: dict, materialized: dict) -> None:
    for sql in views.values():
        op.execute(sql)
    for sql in materialized.values():
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
    op.execute("GRANT SELECT ON neuron_evolution, circuit_neurons, heuristic_census, "
               "heuristic_emergence, checkpoint_overlap TO catalog_reader")


def upgrade() -> None:
    _drop_views()
    for name, type_ in NEURON_OP_COLUMNS:
        op.add_column("neuron_op", sa.Column(name, type_, nullable=True))
    op.add_column("neuron_score", sa.Column("implements", sa.Boolean(), nullable=True))
    op.add_column("layer_result", sa.Column("patching", JSONB(), nullable=True))
    for name, type_ in SUMMARY_COLUMNS:
        op.add_column("checkpoint_summary", sa.Column(name, type_, nullable=True))
    _create_views(VIEWS, MATERIALIZED)


def downgrade() -> None:
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "views_0003", Path(__file__).with_name("0003_analyst_views.py"))
    assert spec is not None and spec.loader is not None
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    _drop_views()
    for name, _ in SUMMARY_COLUMNS:
        op.drop_column("checkpoint_summary", name)
    op.drop_column("layer_result", "patching")
    op.drop_column("neuron_score", "implements")
    for name, _ in reversed(NEURON_OP_COLUMNS):
        op.drop_column("neuron_op", name)
    _create_views(old.VIEWS, old.MATERIALIZED)
