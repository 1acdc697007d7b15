"""Explained prompts count ranks from 1 (issue 81).

``ncat explain`` printed "rank 1" for an answer second in line ("0 = top"), which readers
took for the top. An explanation's ``rank_answer`` and its logit lens ranks now count the
top token as 1. This adds 1 to the rows stored before: the column and, in the stored
explanation (JSONB), ``rank_answer`` and the rank in each ``lens`` entry
([layer, rank, probability]).

Revision ID: 0039
Revises: 0038
"""

from alembic import op

revision = "0039"
down_revision = "0038"
branch_labels = None
depends_on = None


def _shift(by: int) -> str:
    return f"""
        UPDATE prompt_explanation SET
            rank_answer = rank_answer + {by},
            explanation = jsonb_set(
                jsonb_set(explanation, '{{rank_answer}}',
                          to_jsonb((explanation ->> 'rank_answer')::int + {by})),
                '{{lens}}',
                COALESCE((SELECT jsonb_agg(jsonb_build_array(x -> 0, (x ->> 1)::int + {by},
                                                             x -> 2) ORDER BY i)
                          FROM jsonb_array_elements(explanation -> 'lens')
                               WITH ORDINALITY AS l(x, i)), '[]'::jsonb))
        WHERE explanation ? 'rank_answer'"""


def upgrade() -> None:
    op.execute(_shift(1))


def downgrade() -> None:
    op.execute(_shift(-1))
