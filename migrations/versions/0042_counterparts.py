"""Counterparts of neurons across runs, stored (issue 83; ``ncat counterparts``).

- table ``neuron_counterpart``: for each MLP neuron of one checkpoint (``from``) and
  another checkpoint (``to``: another seed, another step of the same run, another model on
  the same grid), matched on the cells of one measurement config's grid
  (catalog.counterparts.match): its best match in ``to`` and that similarity (the mean
  over operators of the Pearson correlation of the two neurons' activations), its
  one-to-one partner and that similarity, the null's threshold (the ``1 - level``
  quantile of the same neurons' best similarities in the unrelated models named in
  ``null``) and whether the best similarity exceeds it. Matching the same pair again
  replaces its rows.
- view ``neuron_counterparts``: those rows with both models' names and steps.

Revision ID: 0042
Revises: 0041
"""

from alembic import op

revision = "0042"
down_revision = "0041"
branch_labels = None
depends_on = None

READER = "catalog_reader"


def upgrade() -> None:
    op.execute("""
        CREATE TABLE neuron_counterpart (
            from_checkpoint_id INTEGER NOT NULL REFERENCES checkpoint(id) ON DELETE CASCADE,
            to_checkpoint_id INTEGER NOT NULL REFERENCES checkpoint(id) ON DELETE CASCADE,
            config_id INTEGER NOT NULL REFERENCES measure_config(id) ON DELETE CASCADE,
            layer SMALLINT NOT NULL,
            neuron INTEGER NOT NULL,
            best_layer SMALLINT NOT NULL,
            best_neuron INTEGER NOT NULL,
            best_similarity REAL NOT NULL,
            one_to_one_layer SMALLINT,
            one_to_one_neuron INTEGER,
            one_to_one_similarity REAL,
            null_threshold REAL NOT NULL,
            level REAL NOT NULL,
            has_counterpart BOOLEAN NOT NULL,
            null_models TEXT NOT NULL,
            n_cells INTEGER NOT NULL,
            written_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            PRIMARY KEY (from_checkpoint_id, to_checkpoint_id, config_id, layer, neuron)
        )""")
    op.execute("CREATE INDEX neuron_counterpart_to_idx ON neuron_counterpart "
               "(to_checkpoint_id, config_id, best_layer, best_neuron)")
    op.execute("""
        CREATE VIEW neuron_counterparts AS
        SELECT fm.name AS model, fc.step, tm.name AS other_model, tc.step AS other_step,
               n.config_id, n.layer, n.neuron, n.best_layer, n.best_neuron,
               n.best_similarity, n.one_to_one_layer, n.one_to_one_neuron,
               n.one_to_one_similarity, n.null_threshold, n.level, n.has_counterpart,
               n.best_layer = n.layer AND n.best_neuron = n.neuron AS same_index,
               n.null_models, n.n_cells, n.written_at, fc.model_id,
               n.from_checkpoint_id, tc.model_id AS other_model_id, n.to_checkpoint_id
        FROM neuron_counterpart n
        JOIN checkpoint fc ON fc.id = n.from_checkpoint_id
        JOIN model fm ON fm.id = fc.model_id
        JOIN checkpoint tc ON tc.id = n.to_checkpoint_id
        JOIN model tm ON tm.id = tc.model_id""")
    op.execute(f"GRANT SELECT ON neuron_counterpart, neuron_counterparts TO {READER}")


def downgrade() -> None:
    op.execute("DROP VIEW neuron_counterparts")
    op.execute("DROP TABLE neuron_counterpart")
