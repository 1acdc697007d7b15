"""What explains each labelled map (catalog 0.10.0, catalog.labels.operand_fit, docs/method.md
section 7, "What a label explains"): columns of ``neuron_op`` and a view.

Columns (REAL, NULL where the map got no label under the value rule, or in rows
catalogued before 0.10.0), the held-out R^2 (five folds of unordered operand pairs) of
each competing explanation of the neuron's K map (``fit_*``) and KV map (``kv_fit_*``) on the operator's valid cells:

- ``fit_operands``: f(op1) + g(op2), both operands' main effects;
- ``fit_result``: one mean per value of this operator's result;
- ``fit_joint``: both together;
- ``fit_other``: the best other operator's result with the operands, and
  ``fit_other_op`` (CHAR(1)) which operator that is.

They describe; the gate decides on sets (catalog.labels.operand_fit.gate: the label's own set
beyond the operands, against every other operator's result sets and windows).
``kv_fit_joint - kv_fit_operands`` is what the result adds to the operands.

View ``map_explanation``: the columns per model, step, config, layer, neuron and
operator, with ``best_explanation`` per map ('operands' where the operands alone fit
within 0.01 of the joint fit, 'result' where this operator's result fits best, else
'other operator') and whether the map kept a result label.

Revision ID: 0025
Revises: 0024
"""

from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

REAL = ("fit_operands", "fit_result", "fit_joint", "fit_other",
        "kv_fit_operands", "kv_fit_result", "kv_fit_joint", "kv_fit_other")
CHAR = ("fit_other_op", "kv_fit_other_op")

VIEW = """
    CREATE VIEW map_explanation AS
    SELECT m.name AS model, c.step, n.config_id, n.layer, n.neuron, n.op,
           n.fit_operands, n.fit_result, n.fit_joint, n.fit_other, n.fit_other_op,
           n.kv_fit_operands, n.kv_fit_result, n.kv_fit_joint, n.kv_fit_other,
           n.kv_fit_other_op,
           n.kv_fit_joint - n.kv_fit_operands AS kv_result_beyond_operands,
           CASE WHEN n.kv_fit_other > n.kv_fit_joint THEN 'other operator'
                WHEN n.kv_fit_joint - n.kv_fit_operands < 0.01 THEN 'operands'
                ELSE 'result' END AS best_explanation,
           EXISTS (SELECT 1 FROM neuron_score s JOIN heuristic h ON h.id = s.heuristic_id
                   WHERE s.model_id = n.model_id AND s.checkpoint_id = n.checkpoint_id
                     AND s.config_id = n.config_id AND s.layer = n.layer
                     AND s.neuron = n.neuron AND s.op = n.op AND s.implements
                     AND h.target = 'result') AS result_label,
           n.model_id, n.checkpoint_id
    FROM neuron_op n
    JOIN model m ON m.id = n.model_id
    JOIN checkpoint c ON c.id = n.checkpoint_id
    WHERE n.kv_fit_joint IS NOT NULL
"""


def upgrade() -> None:
    op.execute("ALTER TABLE neuron_op " + ", ".join(
        [f"ADD COLUMN {c} REAL" for c in REAL] + [f"ADD COLUMN {c} CHAR(1)" for c in CHAR]))
    op.execute(VIEW)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS map_explanation")
    op.execute("ALTER TABLE neuron_op " + ", ".join(
        f"DROP COLUMN {c}" for c in REAL + CHAR))
