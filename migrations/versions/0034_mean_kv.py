"""The KV map's mean per neuron and operator: ``neuron_op.mean_kv``; what the label adds
to an explained prompt's knockout in the ``prompt_explanations`` view (issue 77).

A label keeps the side of the map that scored (``neuron_score.bottom``): the neuron is
high, or low, on the heuristic's set. Whether a label holds for one prompt is then the
prompt being in the set AND the neuron's value there on that side of the map's typical
value: ``mean_act`` for the K map, and, for result labels, the KV map's mean, stored
here (NULL for a constant neuron, which has no KV map, and for rows written before: the
side is then not checked, only the set).

An explained prompt's knockout now stands beside controls chosen the same way except for
the label (catalog.explain.controls); the view gives analysts the ranking and what the
label adds against each matched control (a control's p(answer) minus the knockout's),
read from the stored explanation (NULL for explanations stored before).

Revision ID: 0034
Revises: 0033
"""

from alembic import op

revision = "0034"
down_revision = "0033"
branch_labels = None
depends_on = None


VIEW = """
        CREATE OR REPLACE VIEW prompt_explanations AS
        SELECT m.name AS model, c.step, e.config_id, e.prompt, e.op, e.a, e.b, e.result,
               e.predicted, e.correct, e.p_answer, e.rank_answer, e.target, e.share_holds,
               e.share_labelled_other, e.share_other_neurons, e.share_heads, e.share_rest,
               e.neurons_50, e.neurons_80, e.heuristics_in_80, e.labelled, e.n_knocked,
               e.p_knocked, e.p_random, e.p_random_se, e.written_at, e.model_id,
               e.checkpoint_id{extra}
        FROM prompt_explanation e
        JOIN model m ON m.id = e.model_id
        JOIN checkpoint c ON c.id = e.checkpoint_id"""

EXTRA = """,
               e.explanation -> 'knockout' ->> 'ranking' AS knockout_ranking,
               (e.explanation -> 'knockout' -> 'label_adds' ->> 'unlabelled')::float8
                   AS label_adds_unlabelled,
               (e.explanation -> 'knockout' -> 'label_adds' ->> 'not holding')::float8
                   AS label_adds_not_holding"""


def upgrade() -> None:
    op.execute("ALTER TABLE neuron_op ADD COLUMN mean_kv REAL")
    op.execute(VIEW.format(extra=EXTRA))


def downgrade() -> None:
    op.execute("DROP VIEW prompt_explanations")
    op.execute(VIEW.format(extra="").replace("CREATE OR REPLACE", "CREATE"))
    op.execute("GRANT SELECT ON prompt_explanations TO catalog_reader")
    op.execute("ALTER TABLE neuron_op DROP COLUMN mean_kv")
