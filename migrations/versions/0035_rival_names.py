"""The rivals of a result label by name (issue 78, catalog 0.11.0;
catalog.labels.rivals): ``neuron_op.fit_other_op`` and ``kv_fit_other_op`` become text.

A result label now competes with every explanation of the map that is not the result:
each other operator's result on every cell, in a form that does not depend on the
operands' order (op1 + op2, |op1 - op2|, op1 * op2, max // min), and the operands'
order statistics (max(op1, op2), min(op1, op2)), each fit with the operands as a factor
of its values by bins and by residues, so that it predicts values a fold never held.
``fit_other`` is the best such rival's held-out R^2 and ``fit_other_op`` its NAME (one
operator's character before; rows written before keep it). ``kv_fit_joint`` is the own
result as it predicts best (its factor by value or by bins, or the set of a result label
that stands). A result label stands only where ``kv_fit_other <= kv_fit_joint``: the
label and the comparison stored beside it never disagree.

View ``map_explanation``: ``best_explanation`` says 'rival' (was 'other operator') and
the new ``kv_result_over_rival`` is by how much the result predicts the KV map better
than its best rival (negative where the rival wins).

Revision ID: 0035
Revises: 0034
"""

from alembic import op

revision = "0035"
down_revision = "0034"
branch_labels = None
depends_on = None

TEXT = ("fit_other_op", "kv_fit_other_op")

VIEW = """
    CREATE VIEW map_explanation AS
    SELECT m.name AS model, c.step, n.config_id, n.layer, n.neuron, n.op,
           n.fit_operands, n.fit_result, n.fit_joint, n.fit_other, n.fit_other_op,
           n.kv_fit_operands, n.kv_fit_result, n.kv_fit_joint, n.kv_fit_other,
           n.kv_fit_other_op,
           n.kv_fit_joint - n.kv_fit_operands AS kv_result_beyond_operands,
           n.kv_fit_joint - n.kv_fit_other AS kv_result_over_rival,
           CASE WHEN n.kv_fit_other > n.kv_fit_joint THEN '{rival}'
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
    op.execute("DROP VIEW IF EXISTS map_explanation")
    op.execute("ALTER TABLE neuron_op " + ", ".join(
        f"ALTER COLUMN {c} TYPE TEXT" for c in TEXT))
    op.execute(VIEW.format(rival="rival"))


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS map_explanation")
    op.execute("ALTER TABLE neuron_op " + ", ".join(
        f"ALTER COLUMN {c} TYPE CHAR(1) USING left({c}, 1)" for c in TEXT))
    op.execute(VIEW.replace("           n.kv_fit_joint - n.kv_fit_other AS kv_result_over_rival,\n",
                            "").format(rival="other operator"))
