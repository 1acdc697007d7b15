"""Emergence counted per step as runs change: ``emergence_histogram``.

"When did the heuristics emerge" is a count of the model's emergence runs per step.
Counted from ``emergence_run`` when asked, it reads every run the last step holds:
on a Pythia-1.4B-shaped catalog (``bench/scale_catalog.py``, about 700K runs) the
documented query took 70 ms warm and 2.0 s on a cold cache, and the explorer's
heuristics page reads four times as many (every operator, by family). The runs grow
with the model's width, not with its checkpoints, so a 6.9B model would take three
times that.

``emergence_histogram`` holds those counts, per model, config, operator, heuristic
family and emergence step (NULL for a model without steps): a few rows per step. It
is kept by statement triggers on ``emergence_run``, which add the rows each statement
inserted and subtract the rows it deleted (an update does both), so the fold of one
checkpoint, the full rebuild and anything else that writes runs keep it right
without being changed, and its cost follows the runs a statement writes, which the
fold keeps small (a pair that stays labelled is not written). A bucket that reaches
zero is removed, so the table equals ``GROUP BY`` over ``heuristic_emergence``
(tested after folds in any order and rebuilds).

Revision ID: 0014
Revises: 0013
"""

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

KEY = "model_id, config_id, op, family, emergence_step"

# The net change per bucket of the runs in {source} (rows with a sign `d`), added to
# the stored counts; buckets left at zero are removed.
APPLY = f"""
      INSERT INTO emergence_histogram AS e (model, {KEY}, pairs)
      SELECT coalesce(m.name, ''), d.model_id, d.config_id, d.op, d.family,
             d.emergence_step, d.n
      FROM (SELECT r.model_id, r.config_id, r.op, h.family, r.emergence_step,
                   sum(r.d) AS n
            FROM ({{source}}) r JOIN heuristic h ON h.id = r.heuristic_id
            GROUP BY r.model_id, r.config_id, r.op, h.family, r.emergence_step
            HAVING sum(r.d) <> 0) d
      LEFT JOIN model m ON m.id = d.model_id
      ON CONFLICT ({KEY}) DO UPDATE SET pairs = e.pairs + EXCLUDED.pairs;
      DELETE FROM emergence_histogram e
      WHERE e.pairs = 0 AND e.model_id IN (SELECT DISTINCT r.model_id FROM ({{source}}) r);"""

RUN = "model_id, config_id, op, heuristic_id, emergence_step"
NEW = f"SELECT {RUN}, 1 AS d FROM new_runs"
OLD = f"SELECT {RUN}, -1 AS d FROM old_runs"

TRACK = f"""
    CREATE FUNCTION emergence_histogram_track() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      -- each branch names only the transition tables its trigger defines
      IF TG_OP = 'INSERT' THEN{APPLY.format(source=NEW)}
      ELSIF TG_OP = 'DELETE' THEN{APPLY.format(source=OLD)}
      ELSIF TG_OP = 'UPDATE' THEN{APPLY.format(source=NEW + ' UNION ALL ' + OLD)}
      ELSE  -- TRUNCATE
        DELETE FROM emergence_histogram;
      END IF;
      RETURN NULL;
    END $$"""

# A trigger with transition tables fires on one event only.
TRIGGERS = (
    "CREATE TRIGGER emergence_histogram_insert AFTER INSERT ON emergence_run "
    "REFERENCING NEW TABLE AS new_runs FOR EACH STATEMENT "
    "EXECUTE FUNCTION emergence_histogram_track()",
    "CREATE TRIGGER emergence_histogram_delete AFTER DELETE ON emergence_run "
    "REFERENCING OLD TABLE AS old_runs FOR EACH STATEMENT "
    "EXECUTE FUNCTION emergence_histogram_track()",
    "CREATE TRIGGER emergence_histogram_update AFTER UPDATE ON emergence_run "
    "REFERENCING NEW TABLE AS new_runs OLD TABLE AS old_runs FOR EACH STATEMENT "
    "EXECUTE FUNCTION emergence_histogram_track()",
    "CREATE TRIGGER emergence_histogram_truncate AFTER TRUNCATE ON emergence_run "
    "FOR EACH STATEMENT EXECUTE FUNCTION emergence_histogram_track()",
)


def upgrade() -> None:
    op.execute("""
    CREATE TABLE emergence_histogram (
      model text NOT NULL,
      model_id integer NOT NULL,
      config_id integer NOT NULL,
      op varchar(1) NOT NULL,
      family varchar(32) NOT NULL,
      emergence_step bigint,
      pairs bigint NOT NULL)  -- > 0: a bucket that empties is deleted""")
    # one row per bucket, a model without steps included (its step is NULL)
    op.execute(f"CREATE UNIQUE INDEX ux_emergence_histogram ON emergence_histogram ({KEY}) "
               "NULLS NOT DISTINCT")
    op.execute("CREATE INDEX ix_emergence_histogram_model ON emergence_histogram "
               "(model, op)")
    op.execute(f"""
    INSERT INTO emergence_histogram (model, {KEY}, pairs)
    SELECT coalesce(m.name, ''), r.model_id, r.config_id, r.op, h.family, r.emergence_step,
           count(*)
    FROM emergence_run r JOIN heuristic h ON h.id = r.heuristic_id
    LEFT JOIN model m ON m.id = r.model_id
    GROUP BY m.name, r.model_id, r.config_id, r.op, h.family, r.emergence_step""")
    op.execute(TRACK)
    for sql in TRIGGERS:
        op.execute(sql)
    op.execute("GRANT SELECT ON emergence_histogram TO catalog_reader")


def downgrade() -> None:
    op.execute("DROP TABLE emergence_histogram")
    op.execute("DROP FUNCTION emergence_histogram_track() CASCADE")
