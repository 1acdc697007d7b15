"""One prompt's answer explained, stored (``ncat explain --store``), and its aggregate over
a checkpoint's prompts (catalog.explain).

- ``checkpoint_summary.prompt_explanations`` (JSONB): op -> the direct decomposition of
  each knockout prompt's answer over the labelled neurons, aggregated
  (catalog.explain.grid.summarize_prompts: how often labelled neurons whose heuristic holds
  carry most of the answer, with the neurons' base rate; the medians of the shares and of
  the neurons for 50% / 80%; the paired comparison of a labelled neuron's term where its
  heuristic holds and where it does not).
- table ``prompt_explanation``: one explained prompt per (checkpoint, config, prompt):
  the answer and its probability, T and its shares, the neurons for 50% / 80%, the
  knockout beside its random control, and the whole explanation as JSON.
- view ``prompt_explanations``: those rows with the model's name and the step.

Revision ID: 0029
Revises: 0028
"""

from alembic import op

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None

READER = "catalog_reader"


def upgrade() -> None:
    op.execute("ALTER TABLE checkpoint_summary ADD COLUMN prompt_explanations JSONB")
    op.execute("""
        CREATE TABLE prompt_explanation (
            model_id INTEGER NOT NULL REFERENCES model(id) ON DELETE CASCADE,
            checkpoint_id INTEGER NOT NULL REFERENCES checkpoint(id) ON DELETE CASCADE,
            config_id INTEGER NOT NULL REFERENCES measure_config(id) ON DELETE CASCADE,
            prompt TEXT NOT NULL,
            op VARCHAR(1) NOT NULL,
            a INTEGER NOT NULL,
            b INTEGER NOT NULL,
            result INTEGER NOT NULL,
            predicted TEXT NOT NULL,
            correct BOOLEAN NOT NULL,
            p_answer DOUBLE PRECISION NOT NULL,
            rank_answer INTEGER NOT NULL,
            target DOUBLE PRECISION NOT NULL,
            share_holds DOUBLE PRECISION,
            share_labelled_other DOUBLE PRECISION,
            share_other_neurons DOUBLE PRECISION,
            share_heads DOUBLE PRECISION,
            share_rest DOUBLE PRECISION,
            neurons_50 INTEGER,
            neurons_80 INTEGER,
            heuristics_in_80 INTEGER,
            labelled BOOLEAN NOT NULL,
            n_knocked INTEGER,
            p_knocked DOUBLE PRECISION,
            p_random DOUBLE PRECISION,
            p_random_se DOUBLE PRECISION,
            explanation JSONB NOT NULL,
            written_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            PRIMARY KEY (checkpoint_id, config_id, prompt)
        )""")
    op.execute("CREATE INDEX prompt_explanation_model_idx ON prompt_explanation "
               "(model_id, prompt)")
    op.execute("""
        CREATE VIEW prompt_explanations AS
        SELECT m.name AS model, c.step, e.config_id, e.prompt, e.op, e.a, e.b, e.result,
               e.predicted, e.correct, e.p_answer, e.rank_answer, e.target, e.share_holds,
               e.share_labelled_other, e.share_other_neurons, e.share_heads, e.share_rest,
               e.neurons_50, e.neurons_80, e.heuristics_in_80, e.labelled, e.n_knocked,
               e.p_knocked, e.p_random, e.p_random_se, e.written_at, e.model_id,
               e.checkpoint_id
        FROM prompt_explanation e
        JOIN model m ON m.id = e.model_id
        JOIN checkpoint c ON c.id = e.checkpoint_id""")
    op.execute(f"GRANT SELECT ON prompt_explanation, prompt_explanations TO {READER}")


def downgrade() -> None:
    op.execute("DROP VIEW prompt_explanations")
    op.execute("DROP TABLE prompt_explanation")
    op.execute("ALTER TABLE checkpoint_summary DROP COLUMN prompt_explanations")
