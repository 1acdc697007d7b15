"""Training dynamics (issue 48): the final circuit across training, heuristic shares per step.

- table ``final_circuit_point``: at each catalogued checkpoint, the faithfulness of the
  FINAL checkpoint's paper circuit (its ranking, heads and pruned layers; column
  ``final_checkpoint_id``) measured on this checkpoint's model and prompts, at the same
  sizes as its own circuit (``circuit`` = ``ranked``), and its random control under the
  same plan (``random``); the columns of ``circuit_point`` (catalog.circuits.final).
- view ``final_circuit_faithfulness``: per model, step, config, operator, metric and k,
  the checkpoint's own circuit, the final circuit and the random control side by side
  (the ratio of means and its bootstrap standard error, the number of prompt draws). At
  the final checkpoint the final circuit IS its own circuit: its row repeats the own
  curve, so every line of the chart ends at the same point.
- view ``heuristic_share``: per model, step, config, operator and heuristic family (and
  ``any``), the labelled count and share of the top set and of every measured neuron,
  pooled over the measured layers, with Wilson 95% intervals (from
  ``checkpoint_summary.enrichment``); ``model_group`` and ``seed`` split a name ending in
  ``-seed<N>`` or ``@seed<N>`` (PolyPythias, the built-in model's seeds) so seeds of one
  model group together (seed 0 for a name without one).

Revision ID: 0031
Revises: 0030
"""

from alembic import op

revision = "0031"
down_revision = "0030"
branch_labels = None
depends_on = None

READER = "catalog_reader"

FINAL_VIEW = """
    CREATE VIEW final_circuit_faithfulness AS
    WITH last AS (
        SELECT DISTINCT ON (s.model_id, s.config_id, s.op)
               s.model_id, s.config_id, s.op, s.checkpoint_id
        FROM circuit_summary s JOIN checkpoint c ON c.id = s.checkpoint_id
        WHERE s.protocol = 'paper'
        ORDER BY s.model_id, s.config_id, s.op, c.step DESC NULLS LAST
    ), rows AS (
        SELECT f.model_id, f.checkpoint_id, f.config_id, f.op, f.metric, f.k, f.fraction,
               f.final_checkpoint_id, f.ratio_of_means AS final, f.ratio_of_means_se AS final_se,
               r.ratio_of_means AS random, r.ratio_of_means_se AS random_se,
               f.n, f.n_small
        FROM final_circuit_point f
        LEFT JOIN final_circuit_point r ON r.model_id = f.model_id
             AND r.checkpoint_id = f.checkpoint_id AND r.config_id = f.config_id
             AND r.op = f.op AND r.metric = f.metric AND r.k = f.k AND r.circuit = 'random'
        WHERE f.circuit = 'ranked'
        UNION ALL
        SELECT p.model_id, p.checkpoint_id, p.config_id, p.op, p.metric, p.k, p.fraction,
               p.checkpoint_id, p.ratio_of_means, p.ratio_of_means_se,
               r.ratio_of_means, r.ratio_of_means_se, p.n, p.n_small
        FROM circuit_point p
        JOIN last l ON l.model_id = p.model_id AND l.checkpoint_id = p.checkpoint_id
             AND l.config_id = p.config_id AND l.op = p.op
        LEFT JOIN circuit_point r ON r.model_id = p.model_id
             AND r.checkpoint_id = p.checkpoint_id AND r.config_id = p.config_id
             AND r.op = p.op AND r.protocol = 'paper' AND r.circuit = 'random'
             AND r.metric = p.metric AND r.k = p.k
        WHERE p.protocol = 'paper' AND p.circuit = 'ranked'
    )
    SELECT m.name AS model, c.step, x.config_id, x.op, x.metric, x.k, x.fraction,
           o.ratio_of_means AS own, o.ratio_of_means_se AS own_se,
           x.final, x.final_se, x.random, x.random_se, x.n, x.n_small,
           fc.step AS final_step, x.model_id, x.checkpoint_id
    FROM rows x
    JOIN model m ON m.id = x.model_id
    JOIN checkpoint c ON c.id = x.checkpoint_id
    JOIN checkpoint fc ON fc.id = x.final_checkpoint_id
    LEFT JOIN circuit_point o ON o.model_id = x.model_id
         AND o.checkpoint_id = x.checkpoint_id AND o.config_id = x.config_id
         AND o.op = x.op AND o.protocol = 'paper' AND o.circuit = 'ranked'
         AND o.metric = x.metric AND o.k = x.k
"""

SHARE_VIEW = """
    CREATE VIEW heuristic_share AS
    SELECT m.name AS model,
           regexp_replace(m.name, '[-@]seed[0-9]+$', '') AS model_group,
           coalesce(substring(m.name from '[-@]seed([0-9]+)$')::int, 0) AS seed,
           c.step, s.config_id, e->>'op' AS op, e->>'family' AS family,
           (e->>'labelled_top')::int AS labelled_top, (e->>'n_top')::int AS n_top,
           (e->>'share_top')::real AS share_top,
           (e->'ci_top'->>0)::real AS share_top_lo, (e->'ci_top'->>1)::real AS share_top_hi,
           (e->>'labelled_layer')::int AS labelled_all, (e->>'n_layer')::int AS n_all,
           (e->>'share_layer')::real AS share_all,
           (e->'ci_layer'->>0)::real AS share_all_lo, (e->'ci_layer'->>1)::real AS share_all_hi,
           s.layers, c.model_id, s.checkpoint_id
    FROM checkpoint_summary s
    CROSS JOIN LATERAL jsonb_array_elements(coalesce(s.enrichment, '[]'::jsonb)) e
    JOIN checkpoint c ON c.id = s.checkpoint_id
    JOIN model m ON m.id = c.model_id
    WHERE e->>'layer' = 'all'
"""


def upgrade() -> None:
    op.execute("""
        CREATE TABLE final_circuit_point (
            model_id INTEGER NOT NULL REFERENCES model(id) ON DELETE CASCADE,
            checkpoint_id INTEGER NOT NULL REFERENCES checkpoint(id) ON DELETE CASCADE,
            config_id INTEGER NOT NULL REFERENCES measure_config(id) ON DELETE CASCADE,
            op VARCHAR(1) NOT NULL,
            final_checkpoint_id INTEGER NOT NULL REFERENCES checkpoint(id) ON DELETE CASCADE,
            circuit VARCHAR(8) NOT NULL CHECK (circuit IN ('ranked', 'random')),
            metric VARCHAR(12) NOT NULL,
            k INTEGER NOT NULL,
            fraction REAL NOT NULL,
            mib BOOLEAN NOT NULL,
            paper BOOLEAN NOT NULL,
            mean_ratio REAL,
            mean_ratio_se REAL,
            ratio_of_means REAL,
            ratio_of_means_se REAL,
            median_ratio REAL,
            n INTEGER NOT NULL,
            n_small INTEGER NOT NULL,
            PRIMARY KEY (model_id, checkpoint_id, config_id, op, circuit, metric, k)
        )""")
    op.execute("CREATE INDEX ix_final_circuit_point_final_checkpoint_id ON final_circuit_point "
               "(final_checkpoint_id)")
    op.execute(FINAL_VIEW)
    op.execute(SHARE_VIEW)
    for name in ("final_circuit_point", "final_circuit_faithfulness", "heuristic_share"):
        op.execute(f"GRANT SELECT ON {name} TO {READER}")


def downgrade() -> None:
    op.execute("DROP VIEW heuristic_share")
    op.execute("DROP VIEW final_circuit_faithfulness")
    op.execute("DROP TABLE final_circuit_point")
