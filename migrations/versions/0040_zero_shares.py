"""``heuristic_share`` has a row for every family at every step (issue 81).

A checkpoint summary's enrichment lists the families that label some neuron there; a
family no neuron carries at a step (early in training, or one operator's) had no row at
that step, so plots of a share through training drew a gap (or joined the points on
either side) where the share was 0. The view now crosses every family seen under a
model group and config with every summarised step and operator, and gives a missing
family 0 of the step's neurons, with its Wilson 95% interval [0, z^2 / (n + z^2)].

Revision ID: 0040
Revises: 0039
"""

from alembic import op

revision = "0040"
down_revision = "0039"
branch_labels = None
depends_on = None

READER = "catalog_reader"

# the rows the summaries hold: 0031's view
STORED = """
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

Z2 = "3.841458820694124"  # 1.959963984540054 ** 2: Wilson's 95% interval, as catalog.core.stats

ZERO_FILLED = f"""
    CREATE VIEW heuristic_share AS
    WITH stored AS ({STORED}),
    families AS (SELECT DISTINCT model_group, config_id, op, family FROM stored),
    points AS (SELECT DISTINCT ON (checkpoint_id, config_id, op)
                      model, model_group, seed, step, config_id, op, n_top, n_all, layers,
                      model_id, checkpoint_id
               FROM stored ORDER BY checkpoint_id, config_id, op, family)
    SELECT p.model, p.model_group, p.seed, p.step, p.config_id, p.op, f.family,
           coalesce(s.labelled_top, 0) AS labelled_top, p.n_top,
           coalesce(s.share_top, 0)::real AS share_top,
           coalesce(s.share_top_lo, 0)::real AS share_top_lo,
           coalesce(s.share_top_hi, CASE WHEN p.n_top > 0
                    THEN {Z2} / (p.n_top + {Z2}) END)::real AS share_top_hi,
           coalesce(s.labelled_all, 0) AS labelled_all, p.n_all,
           coalesce(s.share_all, 0)::real AS share_all,
           coalesce(s.share_all_lo, 0)::real AS share_all_lo,
           coalesce(s.share_all_hi, CASE WHEN p.n_all > 0
                    THEN {Z2} / (p.n_all + {Z2}) END)::real AS share_all_hi,
           p.layers, p.model_id, p.checkpoint_id
    FROM points p
    JOIN families f ON f.model_group = p.model_group AND f.config_id = p.config_id
         AND f.op = p.op
    LEFT JOIN stored s ON s.checkpoint_id = p.checkpoint_id AND s.config_id = p.config_id
         AND s.op = p.op AND s.family = f.family
"""


def _replace(body: str) -> None:
    op.execute("DROP VIEW heuristic_share")
    op.execute(body)
    op.execute(f"GRANT SELECT ON heuristic_share TO {READER}")


def upgrade() -> None:
    _replace(ZERO_FILLED)


def downgrade() -> None:
    _replace("CREATE VIEW heuristic_share AS" + STORED)
