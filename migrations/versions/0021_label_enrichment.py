"""Labels that discriminate (catalog 0.6.0): enrichment and the relabelled-values control.

- ``checkpoint_summary.enrichment``: per layer (and pooled), operator and heuristic family,
  the labelled share of the top set beside a seeded random set of the same layer and the
  whole layer, with Wilson intervals, Newcombe's interval of the difference and Fisher's
  one-sided exact p-value (catalog.labels.enrichment).
- ``checkpoint_summary.aliases``: per operator, the heuristics scored once for a cell set
  that other heuristics share, with those others' labels.
- ``layer_result.label_control``: per operator, how many of a sample of the layer's maps
  the label rule labels against relabelled operand and result values.
- SQL functions ``wilson_low(k, n)`` and ``wilson_high(k, n)``: the 95% Wilson interval.
- View ``label_enrichment``: per model, step, config, layer and operator, the top set (the
  config's ``top_set_fraction`` of the layer by rank, at least one neuron), how many of it
  carry a label, the rest of the layer and the whole layer, each share with its interval.
  The random-set comparison and the exact test are in ``checkpoint_summary.enrichment``
  (a random draw does not belong in a view).

Revision ID: 0021
Revises: 0020
"""

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

WILSON = """
    CREATE FUNCTION wilson_{side}(k bigint, n bigint) RETURNS double precision
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
        SELECT CASE WHEN n > 0 THEN
            ((k::float8 / n + 1.959964 ^ 2 / (2 * n))
             {sign} 1.959964 * sqrt(k::float8 / n * (1 - k::float8 / n) / n
                                    + 1.959964 ^ 2 / (4 * n::float8 * n)))
            / (1 + 1.959964 ^ 2 / n) END
    $$
"""

VIEW = """
    CREATE VIEW label_enrichment AS
    WITH labelled AS (
        SELECT DISTINCT model_id, checkpoint_id, config_id, layer, neuron, op
        FROM neuron_score WHERE implements
    ), neurons AS (
        SELECT n.model_id, n.checkpoint_id, n.config_id, n.layer, n.op, n.neuron, n.rank,
               l.neuron IS NOT NULL AS labelled,
               greatest(1, ceil(coalesce((mc.config ->> 'top_set_fraction')::float8, 0.05)
                                * count(*) OVER (PARTITION BY n.model_id, n.checkpoint_id,
                                                 n.config_id, n.layer, n.op)))::int AS n_top
        FROM neuron_op n
        JOIN measure_config mc ON mc.id = n.config_id
        LEFT JOIN labelled l ON l.model_id = n.model_id AND l.checkpoint_id = n.checkpoint_id
             AND l.config_id = n.config_id AND l.layer = n.layer AND l.neuron = n.neuron
             AND l.op = n.op
    ), counted AS (
        SELECT model_id, checkpoint_id, config_id, layer, op, count(*) AS n_layer,
               count(*) FILTER (WHERE rank < n_top) AS n_top,
               count(*) FILTER (WHERE rank < n_top AND labelled) AS labelled_top,
               count(*) FILTER (WHERE labelled) AS labelled_layer
        FROM neurons GROUP BY model_id, checkpoint_id, config_id, layer, op
    )
    SELECT m.name AS model, c.step, k.config_id, k.layer, k.op,
           k.n_top, k.labelled_top, k.labelled_top::float8 / nullif(k.n_top, 0) AS share_top,
           wilson_low(k.labelled_top, k.n_top) AS share_top_low,
           wilson_high(k.labelled_top, k.n_top) AS share_top_high,
           k.n_layer - k.n_top AS n_rest, k.labelled_layer - k.labelled_top AS labelled_rest,
           (k.labelled_layer - k.labelled_top)::float8 / nullif(k.n_layer - k.n_top, 0)
               AS share_rest,
           wilson_low(k.labelled_layer - k.labelled_top, k.n_layer - k.n_top) AS share_rest_low,
           wilson_high(k.labelled_layer - k.labelled_top, k.n_layer - k.n_top)
               AS share_rest_high,
           k.n_layer, k.labelled_layer,
           k.labelled_layer::float8 / nullif(k.n_layer, 0) AS share_layer,
           k.model_id, k.checkpoint_id
    FROM counted k
    JOIN model m ON m.id = k.model_id
    JOIN checkpoint c ON c.id = k.checkpoint_id
"""


def upgrade() -> None:
    op.execute("ALTER TABLE checkpoint_summary ADD COLUMN enrichment JSONB")
    op.execute("ALTER TABLE checkpoint_summary ADD COLUMN aliases JSONB")
    op.execute("ALTER TABLE layer_result ADD COLUMN label_control JSONB")
    op.execute(WILSON.format(side="low", sign="-"))
    op.execute(WILSON.format(side="high", sign="+"))
    op.execute(VIEW)


def downgrade() -> None:
    op.execute("DROP VIEW label_enrichment")
    op.execute("DROP FUNCTION wilson_high(bigint, bigint)")
    op.execute("DROP FUNCTION wilson_low(bigint, bigint)")
    op.execute("ALTER TABLE layer_result DROP COLUMN label_control")
    op.execute("ALTER TABLE checkpoint_summary DROP COLUMN aliases")
    op.execute("ALTER TABLE checkpoint_summary DROP COLUMN enrichment")
