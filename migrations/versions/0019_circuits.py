"""Circuits as the heuristics paper builds them (catalog 0.5.0; docs/method.md section 6).

- component_effect: the patching effect of every attention head (head >= 0) and every
  whole MLP layer (head = -1) per operator and prompt position (op1, op, op2, last), with
  a neuron's statistics;
- circuit_summary: per operator and faithfulness protocol, how the circuits were built
  (first heuristics layer and where it came from, pruned and whole layers, heads kept),
  the baselines (model and empty circuit per metric) and the curves' areas (CPR, CMD);
- circuit_point: each point of each curve (the ranked circuit and its random and
  reversed controls) per metric, with standard errors and the count of prompts whose
  denominator is too small to say anything;
- checkpoint_summary.residual_lens: where the answer appears in the residual stream;
- views component_effects and circuit_curve read them by model name and step.

Revision ID: 0019
Revises: 0018
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0019'
down_revision = '0018'
branch_labels = None
depends_on = None


VIEWS = {
    # One row per component, operator and position; component is 'MLP' or 'H<head>'.
    "component_effects": """
        CREATE VIEW component_effects AS
        SELECT m.name AS model, c.step, e.config_id, e.op, e.layer,
               CASE WHEN e.head < 0 THEN 'MLP' ELSE 'H' || e.head END AS component,
               e.head, e.position, e.n_pairs, e.effect_exact, e.effect_exact_std,
               e.effect_attr, e.effect_attr_std, e.effect_log, e.effect_median,
               e.effect_trimmed, e.moved_share, e.rank_value, e.is_exact,
               e.model_id, e.checkpoint_id
        FROM component_effect e
        JOIN checkpoint c ON c.id = e.checkpoint_id
        JOIN model m ON m.id = e.model_id""",
    # One row per point of a faithfulness curve, with how its circuit was built.
    "circuit_curve": """
        CREATE VIEW circuit_curve AS
        SELECT m.name AS model, c.step, p.config_id, p.op, p.protocol, p.circuit, p.metric,
               p.k, p.fraction, p.mib, p.paper, p.mean_ratio, p.mean_ratio_se,
               p.ratio_of_means, p.ratio_of_means_se, p.median_ratio, p.n, p.n_small,
               s.late_from, s.late_source, s.pruned, s.whole, s.n_heads_kept, s.ranking,
               p.model_id, p.checkpoint_id
        FROM circuit_point p
        JOIN circuit_summary s USING (model_id, checkpoint_id, config_id, op, protocol)
        JOIN checkpoint c ON c.id = p.checkpoint_id
        JOIN model m ON m.id = p.model_id""",
}


def upgrade() -> None:
    op.create_table('circuit_point',
    sa.Column('model_id', sa.Integer(), nullable=False),
    sa.Column('checkpoint_id', sa.Integer(), nullable=False),
    sa.Column('config_id', sa.Integer(), nullable=False),
    sa.Column('op', sa.String(length=1), nullable=False),
    sa.Column('protocol', sa.String(length=16), nullable=False),
    sa.Column('circuit', sa.String(length=8), nullable=False),
    sa.Column('metric', sa.String(length=12), nullable=False),
    sa.Column('k', sa.Integer(), nullable=False),
    sa.Column('fraction', sa.REAL(), nullable=False),
    sa.Column('mib', sa.Boolean(), nullable=False),
    sa.Column('paper', sa.Boolean(), nullable=False),
    sa.Column('mean_ratio', sa.REAL(), nullable=True),
    sa.Column('mean_ratio_se', sa.REAL(), nullable=True),
    sa.Column('ratio_of_means', sa.REAL(), nullable=True),
    sa.Column('ratio_of_means_se', sa.REAL(), nullable=True),
    sa.Column('median_ratio', sa.REAL(), nullable=True),
    sa.Column('n', sa.Integer(), nullable=False),
    sa.Column('n_small', sa.Integer(), nullable=False),
    sa.ForeignKeyConstraint(['checkpoint_id'], ['checkpoint.id'], ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['config_id'], ['measure_config.id'], ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['model_id'], ['model.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('model_id', 'checkpoint_id', 'config_id', 'op', 'protocol', 'circuit', 'metric', 'k')
    )
    op.create_table('circuit_summary',
    sa.Column('model_id', sa.Integer(), nullable=False),
    sa.Column('checkpoint_id', sa.Integer(), nullable=False),
    sa.Column('config_id', sa.Integer(), nullable=False),
    sa.Column('op', sa.String(length=1), nullable=False),
    sa.Column('protocol', sa.String(length=16), nullable=False),
    sa.Column('late_from', sa.SmallInteger(), nullable=True),
    sa.Column('late_source', sa.String(length=8), nullable=True),
    sa.Column('pruned', postgresql.ARRAY(sa.SmallInteger()), nullable=False),
    sa.Column('whole', postgresql.ARRAY(sa.SmallInteger()), nullable=False),
    sa.Column('heads', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('n_heads_kept', sa.Integer(), nullable=False),
    sa.Column('n_prompts', sa.Integer(), nullable=False),
    sa.Column('n_unique', sa.Integer(), nullable=False),
    sa.Column('seeds', sa.SmallInteger(), nullable=False),
    sa.Column('context', sa.String(length=8), nullable=False),
    sa.Column('population', sa.String(length=8), nullable=True),
    sa.Column('ranking', sa.String(length=16), nullable=False),
    sa.Column('baselines', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('areas', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.ForeignKeyConstraint(['checkpoint_id'], ['checkpoint.id'], ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['config_id'], ['measure_config.id'], ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['model_id'], ['model.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('model_id', 'checkpoint_id', 'config_id', 'op', 'protocol')
    )
    op.create_table('component_effect',
    sa.Column('model_id', sa.Integer(), nullable=False),
    sa.Column('checkpoint_id', sa.Integer(), nullable=False),
    sa.Column('config_id', sa.Integer(), nullable=False),
    sa.Column('op', sa.String(length=1), nullable=False),
    sa.Column('layer', sa.SmallInteger(), nullable=False),
    sa.Column('head', sa.SmallInteger(), nullable=False),
    sa.Column('position', sa.String(length=8), nullable=False),
    sa.Column('n_pairs', sa.Integer(), nullable=False),
    sa.Column('effect_exact', sa.REAL(), nullable=True),
    sa.Column('effect_exact_std', sa.REAL(), nullable=True),
    sa.Column('effect_attr', sa.REAL(), nullable=True),
    sa.Column('effect_attr_std', sa.REAL(), nullable=True),
    sa.Column('effect_log', sa.REAL(), nullable=True),
    sa.Column('effect_median', sa.REAL(), nullable=True),
    sa.Column('effect_trimmed', sa.REAL(), nullable=True),
    sa.Column('moved_share', sa.REAL(), nullable=True),
    sa.Column('rank_value', sa.REAL(), nullable=True),
    sa.Column('is_exact', sa.Boolean(), nullable=False),
    sa.ForeignKeyConstraint(['checkpoint_id'], ['checkpoint.id'], ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['config_id'], ['measure_config.id'], ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['model_id'], ['model.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('model_id', 'checkpoint_id', 'config_id', 'op', 'layer', 'head', 'position')
    )
    op.add_column('checkpoint_summary', sa.Column('residual_lens', postgresql.JSONB(astext_type=sa.Text()), nullable=True))
    for sql in VIEWS.values():
        op.execute(sql)


def downgrade() -> None:
    for name in VIEWS:
        op.execute(f"DROP VIEW {name}")
    op.drop_column('checkpoint_summary', 'residual_lens')
    op.drop_table('component_effect')
    op.drop_table('circuit_summary')
    op.drop_table('circuit_point')
