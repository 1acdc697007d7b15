"""Circuit neurons across training: view circuit_persistence.

The heuristics paper follows Pythia-6.9B's circuits through training and asks how many
of the final checkpoint's circuit neurons are already in the circuit earlier. Here a
checkpoint's circuit (protocol ``paper``) is, in each layer it prunes, its top
``circuit_k`` neurons (catalog_setting, default 20) by the ranking its curve used
(circuit_summary.ranking: attribution, mean + std over pairs, largest first; or the
catalog's rank), ties by neuron index as in catalog.circuits.paper.top_k_mask. For every
checkpoint, operator and config the view gives the final checkpoint's circuit size, how
many of those neurons this checkpoint's circuit holds, and the share. The final
checkpoint is the largest step with a paper circuit under the config.

Revision ID: 0020
Revises: 0019
"""

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

VIEW = """
    CREATE VIEW circuit_persistence AS
    WITH ranked AS (
        SELECT n.model_id, n.checkpoint_id, n.config_id, n.op, n.layer, n.neuron,
               row_number() OVER (
                   PARTITION BY n.model_id, n.checkpoint_id, n.config_id, n.op, n.layer
                   ORDER BY CASE WHEN s.ranking = 'attribution'
                                 THEN -(n.effect_attr + n.effect_attr_std)
                                 ELSE n.rank END NULLS LAST, n.neuron) AS position
        FROM neuron_op n
        JOIN circuit_summary s ON s.model_id = n.model_id
             AND s.checkpoint_id = n.checkpoint_id AND s.config_id = n.config_id
             AND s.op = n.op AND s.protocol = 'paper' AND n.layer = ANY(s.pruned)
    ), circuit AS (
        SELECT * FROM ranked
        WHERE position <= (SELECT value FROM catalog_setting WHERE key = 'circuit_k')
    ), final AS (
        SELECT DISTINCT ON (s.model_id, s.config_id, s.op)
               s.model_id, s.config_id, s.op, s.checkpoint_id
        FROM circuit_summary s JOIN checkpoint c ON c.id = s.checkpoint_id
        WHERE s.protocol = 'paper'
        ORDER BY s.model_id, s.config_id, s.op, c.step DESC NULLS LAST
    )
    SELECT m.name AS model, c.step, s.config_id, s.op,
           count(f.*) AS n_final,
           count(e.*) AS n_shared,
           count(e.*)::real / nullif(count(f.*), 0) AS share,
           s.model_id, s.checkpoint_id
    FROM circuit_summary s
    JOIN final fin ON fin.model_id = s.model_id AND fin.config_id = s.config_id
         AND fin.op = s.op
    JOIN circuit f ON f.model_id = fin.model_id AND f.checkpoint_id = fin.checkpoint_id
         AND f.config_id = fin.config_id AND f.op = fin.op
    LEFT JOIN circuit e ON e.model_id = s.model_id AND e.checkpoint_id = s.checkpoint_id
         AND e.config_id = s.config_id AND e.op = s.op AND e.layer = f.layer
         AND e.neuron = f.neuron
    JOIN checkpoint c ON c.id = s.checkpoint_id
    JOIN model m ON m.id = s.model_id
    WHERE s.protocol = 'paper'
    GROUP BY m.name, c.step, s.config_id, s.op, s.model_id, s.checkpoint_id
"""


def upgrade() -> None:
    op.execute(VIEW)


def downgrade() -> None:
    op.execute("DROP VIEW circuit_persistence")
