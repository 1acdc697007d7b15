"""Derived tables folded in one checkpoint at a time; a histogram of label strength.

Since 0009 a finished job rebuilt its model's census, emergence and overlap: cheap for
the demo, but the rebuild reads every label of every checkpoint of the model, so along a
Pythia sweep (154 checkpoints) each job's final step grows with the checkpoints before
it. ``refresh_checkpoint_views(model, checkpoint, config)`` folds ONE checkpoint's newly
written layers into the derived tables instead:

- ``heuristic_census`` and ``label_histogram`` are per checkpoint: that checkpoint's rows
  are replaced.
- ``heuristic_emergence`` (per layer, the pairs held at the layer's last step, with the
  step their unbroken run of labels starts from) becomes a view over ``emergence_run``
  (the ids and that first step; the run's length is counted from the layer's folded
  steps when read). A step after the last one drops the runs of pairs it does not hold
  and starts runs for pairs new in it; a step inserted between others extends the runs
  that start just after it and breaks the runs it falls into without holding their
  pair. Both read the new step's labels and the layer's runs, and write only the runs
  that change: a pair that stays labelled costs nothing.
- ``checkpoint_overlap``: a step before the last one adds its own row (the final circuit's
  pairs looked up in that checkpoint); a new last step recomputes every row by looking
  up its circuit's pairs in each checkpoint (circuit-sized, not label-sized, work).

``derived_layer`` records which (checkpoint, config, layer) have been folded in and the
``layer_result.written_at`` they had then. A layer written again (a forced re-run), and a
model without steps, fall back to the model's full rebuild, which is what
``refresh_catalog_views(model)`` still does (and what a changed ``match_threshold`` or
``circuit_k`` needs). Once every written layer is folded in, the tables equal a full
rebuild, whatever order the checkpoints came in (tested).

``label_histogram`` counts each checkpoint's labels per operator, family, score bin
(``score_from``: 0.05 wide, so ``score >= 0.8`` is ``score_from >= 0.8``) and p-value
decade (``p_decade = d``: 10^d <= p < 10^(d+1), so ``p_value < 1e-6`` is
``p_decade < -6``; decades below -15 are pooled in -16), with the sum of their base
rates: a stricter labelling rule on that grid is a sum over a few rows instead of a scan
of every label.

Revision ID: 0011
Revises: 0010
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

SETTING = "(SELECT value FROM catalog_setting WHERE key = '{}')"
THRESHOLD = SETTING.format("match_threshold")
CIRCUIT_K = SETTING.format("circuit_k")
LABEL = f"coalesce(s.implements, s.score >= {THRESHOLD})"
MINE = "(p_model IS NULL OR {}.model_id = p_model)"  # restricts a scan to one model
P_FLOOR = -16  # p-value decades below this are pooled into it
DECADES = ", ".join(f"1e{d}" for d in range(P_FLOOR, 1))  # 1e-16, ..., 1e0

# Both are single expressions with no FROM clause, so PostgreSQL inlines them into the
# queries that group a checkpoint's millions of scores by them (a call per row is slow).
FUNCTIONS = (
    # the 0.05-wide bin a score falls in. `score >= 0.8` compares the REAL with the
    # literal in double precision; a REAL times 20 is exact in double precision, and no
    # REAL lies between k/20 and its nearest double (k/20 is a REAL only where it is a
    # dyadic fraction, and then exactly), so the floor puts every score on the side of
    # each bin edge that such a filter puts it on (tested against the raw filter)
    """
    CREATE FUNCTION score_bin(x real) RETURNS numeric(4, 2) LANGUAGE sql IMMUTABLE AS $$
      SELECT (floor(x::float8 * 20) / 20)::numeric(4, 2)
    $$""",
    # the decade d with 10^d <= p < 10^(d+1): width_bucket finds it among the powers of
    # ten written as double-precision literals, the very numbers `p_value < 1e-6` compares
    # with, so the bins agree with such filters exactly (tested one ulp either side)
    f"""
    CREATE FUNCTION p_decade(p float8) RETURNS smallint LANGUAGE sql IMMUTABLE AS $$
      SELECT (CASE WHEN p < 1e{P_FLOOR + 1} THEN {P_FLOOR}  -- pooled (NULL stays NULL)
              ELSE width_bucket(p, ARRAY[{DECADES}]::float8[]) - {-P_FLOOR + 1} END)::smallint
    $$""",
)

HISTOGRAM = f"""
    SELECT m.name AS model, c.step, s.config_id, s.op, h.family,
           score_bin(s.score) AS score_from, p_decade(s.p_value) AS p_decade,
           count(*) AS labels, sum(s.base_rate::float8) AS base_rate_sum,
           count(s.base_rate) AS base_rates, s.model_id, s.checkpoint_id
    FROM neuron_score s
    JOIN heuristic h ON h.id = s.heuristic_id
    JOIN checkpoint c ON c.id = s.checkpoint_id
    JOIN model m ON m.id = s.model_id
    WHERE {LABEL} AND {{where}}
    GROUP BY m.name, c.step, s.config_id, s.op, h.family, score_bin(s.score),
             p_decade(s.p_value), s.model_id, s.checkpoint_id"""

CENSUS = f"""
    SELECT m.name AS model, c.step, n.config_id, n.op, h.family,
           count(DISTINCT (n.layer, n.neuron)) AS circuit_neurons,
           n.model_id, n.checkpoint_id
    FROM neuron_op n
    JOIN neuron_score s ON s.model_id = n.model_id AND s.checkpoint_id = n.checkpoint_id
         AND s.config_id = n.config_id AND s.layer = n.layer AND s.neuron = n.neuron
         AND s.op = n.op
    JOIN heuristic h ON h.id = s.heuristic_id
    JOIN checkpoint c ON c.id = n.checkpoint_id
    JOIN model m ON m.id = n.model_id
    WHERE n.rank < {CIRCUIT_K} AND {LABEL} AND {{where}}
    GROUP BY m.name, c.step, n.config_id, n.op, h.family, n.model_id, n.checkpoint_id"""

# One checkpoint's rows of the per-checkpoint tables.
ONE_CHECKPOINT_S = ("s.model_id = p_model AND s.checkpoint_id = p_checkpoint "
                    "AND s.config_id = p_config")
# One checkpoint's census ($1 model, $2 config, $3 checkpoint, $4 the circuit size rounded
# up, as ranks are integers), run with EXECUTE: planned with the circuit size in hand,
# the rank index finds the circuit's rows instead of every row of the checkpoint.
CENSUS_ONE = "INSERT INTO heuristic_census " + CENSUS.replace(CIRCUIT_K, "$4").format(
    where="n.model_id = $1 AND n.checkpoint_id = $3 AND n.config_id = $2 AND s.model_id = $1")

# The overlap rows of model $1, config $2 for the checkpoints in `ck`, against the
# circuit labels (rank < $4) of checkpoint $3: each final pair is looked up in each
# checkpoint through neuron_score's primary key. Run with EXECUTE, so it is planned with
# the circuit size in hand: a generic plan guesses a third of the checkpoint's rows are
# in the circuit and scans every score of every checkpoint instead.
OVERLAP = f"""
    INSERT INTO checkpoint_overlap (model, step, config_id, final_pairs, present, share,
                                    model_id, checkpoint_id)
    WITH final_pairs AS MATERIALIZED (
        SELECT s.layer, s.neuron, s.op, s.heuristic_id
        FROM neuron_op n
        JOIN neuron_score s ON s.model_id = n.model_id AND s.checkpoint_id = n.checkpoint_id
             AND s.config_id = n.config_id AND s.layer = n.layer AND s.neuron = n.neuron
             AND s.op = n.op
        WHERE n.model_id = $1 AND n.checkpoint_id = $3 AND n.config_id = $2 AND n.rank < $4
              AND s.model_id = $1 AND {LABEL}),
    total AS (SELECT count(*) AS n FROM final_pairs)
    SELECT m.name, ck.step, $2, t.n, p.n, p.n::real / nullif(t.n, 0), $1, ck.checkpoint_id
    FROM ({{ck}}) ck
    CROSS JOIN total t
    JOIN model m ON m.id = $1
    CROSS JOIN LATERAL (
        SELECT count(*) AS n FROM final_pairs fp
        JOIN neuron_score s ON s.model_id = $1 AND s.checkpoint_id = ck.checkpoint_id
             AND s.config_id = $2 AND s.layer = fp.layer AND s.neuron = fp.neuron
             AND s.op = fp.op AND s.heuristic_id = fp.heuristic_id
        WHERE {LABEL}) p
    WHERE t.n > 0"""

FOLDED_CK = """
    SELECT DISTINCT d.checkpoint_id, c.step FROM derived_layer d
    JOIN checkpoint c ON c.id = d.checkpoint_id
    WHERE d.model_id = p_model AND d.config_id = p_config"""
OVERLAP_ALL = OVERLAP.format(ck=FOLDED_CK.replace("p_model", "$1").replace("p_config", "$2"))
OVERLAP_ONE = OVERLAP.format(ck="SELECT $5::integer AS checkpoint_id, $6::bigint AS step")

# Is the pair of emergence_run row {r} among the folded checkpoint's labels (`lab`)?
HELD = """EXISTS (SELECT 1 FROM lab l WHERE l.layer = {r}.layer AND l.neuron = {r}.neuron
                    AND l.op = {r}.op AND l.heuristic_id = {r}.heuristic_id)"""

# heuristic_emergence keeps its columns as a view over emergence_run: a run's length is
# the number of the layer's folded steps from its first step on (the run is unbroken to
# the last step), found by binary search in the sorted steps (width_bucket), so a pair
# that stays labelled costs no write when a step is folded in. A model without steps has
# one checkpoint: its runs are one checkpoint long. A query that does not ask for
# checkpoints_held does not read the steps, and one that does not ask for the heuristic's
# label or family does not read the heuristics (both left joins are on a unique key).
EMERGENCE_VIEW = """
    CREATE VIEW heuristic_emergence AS
    SELECT m.name AS model, r.layer, r.neuron, r.op, r.config_id, h.label AS heuristic,
           h.family, r.emergence_step,
           CASE WHEN r.emergence_step IS NULL THEN 1::bigint
                ELSE cardinality(ls.steps) - width_bucket(r.emergence_step, ls.steps) + 1
           END AS checkpoints_held,
           r.model_id, r.heuristic_id
    FROM emergence_run r
    JOIN model m ON m.id = r.model_id
    LEFT JOIN heuristic h ON h.id = r.heuristic_id  -- (left: dropped when not asked for)
    LEFT JOIN (SELECT d.model_id, d.config_id, d.layer,
                      array_agg(c.step ORDER BY c.step) FILTER (WHERE c.step IS NOT NULL)
                        AS steps
               FROM derived_layer d JOIN checkpoint c ON c.id = d.checkpoint_id
               GROUP BY d.model_id, d.config_id, d.layer) ls
           ON ls.model_id = r.model_id AND ls.config_id = r.config_id AND ls.layer = r.layer"""

REFRESH_CHECKPOINT = f"""
    CREATE FUNCTION refresh_checkpoint_views(p_model integer, p_checkpoint integer,
                                             p_config integer) RETURNS text
    LANGUAGE plpgsql SET jit = off SET work_mem = '256MB' SET enable_mergejoin = off
    SET enable_nestloop = on AS $$
    DECLARE
      v_step bigint;
      v_final integer;
      v_new smallint[];
      v_top smallint[];
      v_mid smallint[];
      v_k integer;
      v_count bigint;
    BEGIN
      -- one refresher per model at a time (the full rebuild takes the same lock)
      PERFORM pg_advisory_xact_lock(20260009, p_model);
      SELECT step INTO v_step FROM checkpoint WHERE id = p_checkpoint AND model_id = p_model;
      IF NOT FOUND THEN
        RAISE EXCEPTION 'checkpoint % is not a checkpoint of model %', p_checkpoint, p_model;
      END IF;
      -- this checkpoint's layers written since they were last folded in
      SELECT coalesce(array_agg(lr.layer ORDER BY lr.layer), '{{}}') INTO v_new
      FROM layer_result lr
      LEFT JOIN derived_layer d ON d.checkpoint_id = lr.checkpoint_id
           AND d.config_id = lr.config_id AND d.layer = lr.layer
      WHERE lr.checkpoint_id = p_checkpoint AND lr.config_id = p_config
        AND d.written_at IS DISTINCT FROM lr.written_at;
      IF cardinality(v_new) = 0 THEN
        RETURN 'nothing new';
      END IF;
      -- a layer written again changes labels already folded in; a model without steps has
      -- one checkpoint: both are rebuilt whole
      IF v_step IS NULL
         OR EXISTS (SELECT 1 FROM derived_layer d WHERE d.checkpoint_id = p_checkpoint
                    AND d.config_id = p_config AND d.layer = ANY (v_new))
         OR EXISTS (SELECT 1 FROM derived_layer d JOIN checkpoint c ON c.id = d.checkpoint_id
                    WHERE d.model_id = p_model AND c.step IS NULL) THEN
        PERFORM refresh_catalog_views(p_model);
        RETURN 'rebuilt';
      END IF;

      DELETE FROM heuristic_census
      WHERE model_id = p_model AND checkpoint_id = p_checkpoint AND config_id = p_config;
      v_k := (SELECT ceil(value)::integer FROM catalog_setting WHERE key = 'circuit_k');
      EXECUTE $q${CENSUS_ONE}$q$ USING p_model, p_config, p_checkpoint, v_k;
      DELETE FROM label_histogram
      WHERE model_id = p_model AND checkpoint_id = p_checkpoint AND config_id = p_config;

      -- per new layer: is this step after the layer's last folded step (or the first)?
      SELECT coalesce(array_agg(l) FILTER (WHERE last IS NULL OR v_step > last), '{{}}'),
             coalesce(array_agg(l) FILTER (WHERE v_step < last), '{{}}')
      INTO v_top, v_mid
      FROM (SELECT l, (SELECT max(c.step) FROM derived_layer d
                       JOIN checkpoint c ON c.id = d.checkpoint_id
                       WHERE d.model_id = p_model AND d.config_id = p_config
                         AND d.layer = l) AS last
            FROM unnest(v_new) l) q;
      -- the checkpoint's labels are read once (the scan of its scores is the one cost that
      -- grows with the model's width); everything below joins them by hash, whatever the
      -- statistics say: right after a rebuild or a bulk write they are stale, and a nested
      -- loop over the labels planned for "1 row" is quadratic (minutes at 786K labels)
      SET LOCAL enable_nestloop = off;  -- (the SET clause above keeps it to this function)
      WITH lab AS MATERIALIZED (
        SELECT s.layer, s.neuron, s.op, s.heuristic_id, s.score, s.p_value, s.base_rate
        FROM neuron_score s WHERE {ONE_CHECKPOINT_S} AND {LABEL}),
      histogram AS (
        INSERT INTO label_histogram
        SELECT m.name, v_step, p_config, l.op, h.family, score_bin(l.score),
               p_decade(l.p_value), count(*), sum(l.base_rate::float8), count(l.base_rate),
               p_model, p_checkpoint
        FROM lab l JOIN heuristic h ON h.id = l.heuristic_id JOIN model m ON m.id = p_model
        GROUP BY m.name, l.op, h.family, score_bin(l.score), p_decade(l.p_value)),
      -- a new last step: pairs it does not hold lose their run; pairs it holds keep theirs,
      -- or start one here (a pair that stays labelled is not written at all)
      dropped AS (
        DELETE FROM emergence_run r
        WHERE r.model_id = p_model AND r.config_id = p_config AND r.layer = ANY (v_top)
          AND NOT {HELD.format(r='r')}),
      started AS (
        INSERT INTO emergence_run (model_id, config_id, layer, neuron, op, heuristic_id,
                                   emergence_step)
        SELECT p_model, p_config, l.layer, l.neuron, l.op, l.heuristic_id, v_step
        FROM lab l
        WHERE l.layer = ANY (v_top)
          AND NOT EXISTS (SELECT 1 FROM emergence_run r WHERE r.model_id = p_model
                          AND r.config_id = p_config AND r.layer = l.layer
                          AND r.neuron = l.neuron AND r.op = l.op
                          AND r.heuristic_id = l.heuristic_id)),
      -- a step between others: a pair it holds extends a run that starts just after it; a
      -- pair it does not hold breaks the run it falls inside, which then starts at the
      -- next step (runs it falls inside and holds just get longer: nothing to write)
      after AS (
        SELECT d.layer, min(c.step) AS next_step FROM derived_layer d
        JOIN checkpoint c ON c.id = d.checkpoint_id
        WHERE d.model_id = p_model AND d.config_id = p_config AND d.layer = ANY (v_mid)
          AND c.step > v_step
        GROUP BY d.layer),
      extended AS (  -- a join, not EXISTS: lab's pairs are unique, and so estimated
        UPDATE emergence_run r SET emergence_step = v_step FROM after a, lab l
        WHERE r.model_id = p_model AND r.config_id = p_config AND r.layer = a.layer
          AND r.emergence_step = a.next_step AND l.layer = r.layer AND l.neuron = r.neuron
          AND l.op = r.op AND l.heuristic_id = r.heuristic_id),
      broken AS (
        UPDATE emergence_run r SET emergence_step = a.next_step FROM after a
        WHERE r.model_id = p_model AND r.config_id = p_config AND r.layer = a.layer
          AND r.emergence_step < v_step AND NOT {HELD.format(r='r')})
      -- the sub-statements share one snapshot and touch disjoint rows: dropped and started
      -- split the top layers' pairs by whether the step holds them, extended and broken
      -- the middle layers' runs by where they start
      SELECT count(*) INTO v_count FROM lab;
      SET LOCAL enable_nestloop = on;  -- the overlap below looks pairs up by index

      INSERT INTO derived_layer (model_id, checkpoint_id, config_id, layer, written_at)
      SELECT p_model, lr.checkpoint_id, lr.config_id, lr.layer, lr.written_at
      FROM layer_result lr
      WHERE lr.checkpoint_id = p_checkpoint AND lr.config_id = p_config
        AND lr.layer = ANY (v_new)
      ON CONFLICT (checkpoint_id, config_id, layer) DO UPDATE
      SET written_at = EXCLUDED.written_at;

      SELECT checkpoint_id INTO v_final FROM ({FOLDED_CK}) f ORDER BY step DESC LIMIT 1;
      IF v_final = p_checkpoint THEN  -- the last step: every row against its circuit
        DELETE FROM checkpoint_overlap WHERE model_id = p_model AND config_id = p_config;
        EXECUTE $q${OVERLAP_ALL}$q$ USING p_model, p_config, v_final, v_k;
      ELSE
        DELETE FROM checkpoint_overlap
        WHERE model_id = p_model AND checkpoint_id = p_checkpoint AND config_id = p_config;
        EXECUTE $q${OVERLAP_ONE}$q$ USING p_model, p_config, v_final, v_k, p_checkpoint,
                                          v_step;
      END IF;
      RETURN 'folded';
    END $$"""


def _full_rebuild(derived: dict[str, str]) -> str:
    """refresh_catalog_views(p_model): 0009's rebuild of one model (NULL: every model),
    its emergence kept as runs (emergence_run), plus the label histogram and the record
    of what is folded in."""
    body = "\n".join(
        f"      DELETE FROM {name} WHERE p_model IS NULL OR model_id = p_model;\n"
        f"      INSERT INTO {name} {sql};" for name, sql in derived.items()
        if name != "heuristic_emergence")
    return f"""
    CREATE OR REPLACE FUNCTION refresh_catalog_views(p_model integer DEFAULT NULL)
    RETURNS void LANGUAGE plpgsql SET jit = off AS $$
    BEGIN
      -- one refresher per model at a time (all models: every refresher waits)
      PERFORM pg_advisory_xact_lock(20260009, coalesce(p_model, 0));
{body}
      DELETE FROM emergence_run WHERE p_model IS NULL OR model_id = p_model;
      INSERT INTO emergence_run (model_id, config_id, layer, neuron, op, heuristic_id,
                                 emergence_step)
      SELECT model_id, config_id, layer, neuron, op, heuristic_id, emergence_step
      FROM ({derived["heuristic_emergence"]}) e;
      DELETE FROM label_histogram WHERE p_model IS NULL OR model_id = p_model;
      INSERT INTO label_histogram {HISTOGRAM.format(where=MINE.format('s'))};
      DELETE FROM derived_layer WHERE p_model IS NULL OR model_id = p_model;
      INSERT INTO derived_layer (model_id, checkpoint_id, config_id, layer, written_at)
      SELECT c.model_id, lr.checkpoint_id, lr.config_id, lr.layer, lr.written_at
      FROM layer_result lr JOIN checkpoint c ON c.id = lr.checkpoint_id
      WHERE {MINE.format('c')};
    END $$"""


def _views_0009():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "views_0009", Path(__file__).with_name("0009_views_per_model.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def upgrade() -> None:
    for sql in FUNCTIONS:
        op.execute(sql)
    op.execute("""
    CREATE TABLE derived_layer (
      model_id integer NOT NULL REFERENCES model (id) ON DELETE CASCADE,
      checkpoint_id integer NOT NULL REFERENCES checkpoint (id) ON DELETE CASCADE,
      config_id integer NOT NULL REFERENCES measure_config (id) ON DELETE CASCADE,
      layer smallint NOT NULL,
      written_at timestamptz NOT NULL,
      PRIMARY KEY (checkpoint_id, config_id, layer))""")
    op.execute("CREATE INDEX ix_derived_layer_model ON derived_layer "
               "(model_id, config_id, layer)")
    op.execute(f"CREATE TABLE label_histogram AS {HISTOGRAM.format(where='false')}")
    op.execute("CREATE INDEX ix_label_histogram_checkpoint ON label_histogram "
               "(model_id, checkpoint_id)")
    op.execute("CREATE INDEX ix_label_histogram_model ON label_histogram (model, step)")
    op.execute("CREATE INDEX ix_checkpoint_overlap_checkpoint ON checkpoint_overlap "
               "(model_id, config_id, checkpoint_id)")
    op.execute("CREATE INDEX ix_heuristic_census_checkpoint ON heuristic_census "
               "(model_id, checkpoint_id, config_id)")
    op.execute("""
    CREATE TABLE emergence_run (
      model_id integer NOT NULL,
      config_id integer NOT NULL,
      layer smallint NOT NULL,
      neuron integer NOT NULL,
      op varchar(1) NOT NULL,
      heuristic_id integer NOT NULL,
      emergence_step bigint,
      PRIMARY KEY (model_id, config_id, layer, neuron, op, heuristic_id))""")
    # the analysts' question: how many pairs emerged at each step, per operator
    op.execute("CREATE INDEX ix_emergence_run_op ON emergence_run "
               "(model_id, op, emergence_step)")
    op.execute("DROP TABLE heuristic_emergence")
    op.execute(EMERGENCE_VIEW)
    op.execute(_full_rebuild(_views_0009().DERIVED))
    op.execute(REFRESH_CHECKPOINT)
    op.execute("SELECT refresh_catalog_views()")  # emergence, histogram, folded record
    op.execute("GRANT SELECT ON label_histogram, heuristic_emergence TO catalog_reader")


def downgrade() -> None:
    old = _views_0009()
    op.execute("DROP FUNCTION refresh_checkpoint_views(integer, integer, integer)")
    op.execute("DROP FUNCTION refresh_catalog_views(integer)")
    # emergence back to a table with the view's rows (the view reads derived_layer)
    op.execute("CREATE TABLE heuristic_emergence_t AS SELECT * FROM heuristic_emergence")
    op.execute("DROP VIEW heuristic_emergence")
    op.execute("DROP TABLE emergence_run")
    op.execute("ALTER TABLE heuristic_emergence_t RENAME TO heuristic_emergence")
    op.execute("CREATE INDEX ix_heuristic_emergence_model ON heuristic_emergence "
               "(model, layer, neuron, op)")
    op.execute("CREATE INDEX ix_heuristic_emergence_model_id ON heuristic_emergence "
               "(model_id)")
    op.execute("GRANT SELECT ON heuristic_emergence TO catalog_reader")
    op.execute("DROP TABLE label_histogram")
    op.execute("DROP TABLE derived_layer")
    op.execute("DROP INDEX ix_checkpoint_overlap_checkpoint")
    op.execute("DROP INDEX ix_heuristic_census_checkpoint")
    op.execute("DROP FUNCTION p_decade(float8)")
    op.execute("DROP FUNCTION score_bin(real)")
    body = "\n".join(
        f"      DELETE FROM {name} WHERE p_model IS NULL OR model_id = p_model;\n"
        f"      INSERT INTO {name} {sql};" for name, sql in old.DERIVED.items())
    op.execute(f"""
    CREATE FUNCTION refresh_catalog_views(p_model integer DEFAULT NULL) RETURNS void
    LANGUAGE plpgsql AS $$
    BEGIN
      PERFORM pg_advisory_xact_lock(20260009, coalesce(p_model, 0));
{body}
    END $$""")
