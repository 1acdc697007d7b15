"""Derived tables folded in one checkpoint at a time; a histogram of label strength.

Since 0009 a finished job rebuilt its model's census, emergence and overlap: cheap for
the demo, but the rebuild reads every label of every checkpoint of the model, so along a
Pythia sweep (154 checkpoints) each job's final step grows with the checkpoints before
it. ``refresh_checkpoint_views(model, checkpoint, config)`` folds ONE checkpoint's newly
written layers into the derived tables instead:

- ``heuristic_census`` and ``label_histogram`` are per checkpoint: that checkpoint's rows
  are replaced.
- ``heuristic_emergence`` (per layer, the pairs held at the layer's last step, with the
  step their unbroken run of labels starts from): a step after the last one replaces the
  layer's rows by the new step's labels, each keeping its old run if it was held before;
  a step inserted between others extends, starts or breaks the runs it falls into. Both
  read only the new step's labels and the layer's current rows.
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
    # the decade d with 10^d <= p < 10^(d+1), compared as `p_value < 1e-6` compares:
    # log10 rounds onto the decade above for a p one ulp below a power of ten (tested),
    # and a libm less exact than glibc's could round below one at a power of ten
    f"""
    CREATE FUNCTION p_decade(p float8) RETURNS smallint LANGUAGE sql IMMUTABLE AS $$
      SELECT CASE WHEN p IS NULL THEN NULL WHEN p <= 0 THEN {P_FLOOR}::smallint
        ELSE greatest({P_FLOOR}, d - (p < power(10::numeric, d))::int
                      + (p >= power(10::numeric, d + 1))::int)::smallint END
      FROM (SELECT CASE WHEN p > 0 THEN floor(log(p))::int END AS d) b
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
ONE_CHECKPOINT_N = ("n.model_id = p_model AND n.checkpoint_id = p_checkpoint "
                    "AND n.config_id = p_config AND s.model_id = p_model")

# The overlap rows of (p_model, p_config) for the checkpoints in `ck`, against the
# circuit labels of checkpoint v_final: each final pair is looked up in each checkpoint
# through neuron_score's primary key.
OVERLAP = f"""
    WITH final_pairs AS MATERIALIZED (
        SELECT s.layer, s.neuron, s.op, s.heuristic_id
        FROM neuron_score s
        JOIN neuron_op n ON n.model_id = s.model_id AND n.checkpoint_id = s.checkpoint_id
             AND n.config_id = s.config_id AND n.layer = s.layer AND n.neuron = s.neuron
             AND n.op = s.op
        WHERE s.model_id = p_model AND s.checkpoint_id = v_final AND s.config_id = p_config
              AND {LABEL} AND n.rank < {CIRCUIT_K}),
    total AS (SELECT count(*) AS n FROM final_pairs)
    SELECT m.name, ck.step, p_config, t.n, p.n, p.n::real / nullif(t.n, 0), p_model,
           ck.checkpoint_id
    FROM ({{ck}}) ck
    CROSS JOIN total t
    JOIN model m ON m.id = p_model
    CROSS JOIN LATERAL (
        SELECT count(*) AS n FROM final_pairs fp
        JOIN neuron_score s ON s.model_id = p_model AND s.checkpoint_id = ck.checkpoint_id
             AND s.config_id = p_config AND s.layer = fp.layer AND s.neuron = fp.neuron
             AND s.op = fp.op AND s.heuristic_id = fp.heuristic_id
        WHERE {LABEL}) p
    WHERE t.n > 0"""

FOLDED_CK = """
    SELECT DISTINCT d.checkpoint_id, c.step FROM derived_layer d
    JOIN checkpoint c ON c.id = d.checkpoint_id
    WHERE d.model_id = p_model AND d.config_id = p_config"""

IS_LABEL_AT_NEW = f"""EXISTS (
          SELECT 1 FROM neuron_score s WHERE s.model_id = p_model
          AND s.checkpoint_id = p_checkpoint AND s.config_id = p_config
          AND s.layer = v_layer AND s.neuron = e.neuron AND s.op = e.op
          AND s.heuristic_id = e.heuristic_id AND {LABEL})"""

EMERGENCE_ROWS = "e.model_id = p_model AND e.config_id = p_config AND e.layer = v_layer"

REFRESH_CHECKPOINT = f"""
    CREATE FUNCTION refresh_checkpoint_views(p_model integer, p_checkpoint integer,
                                             p_config integer) RETURNS text
    LANGUAGE plpgsql AS $$
    DECLARE
      v_step bigint;
      v_layer smallint;
      v_last bigint;
      v_next bigint;
      v_after bigint;
      v_final integer;
      v_new smallint[];
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
      INSERT INTO heuristic_census {CENSUS.format(where=ONE_CHECKPOINT_N)};
      DELETE FROM label_histogram
      WHERE model_id = p_model AND checkpoint_id = p_checkpoint AND config_id = p_config;
      INSERT INTO label_histogram {HISTOGRAM.format(where=ONE_CHECKPOINT_S)};

      FOREACH v_layer IN ARRAY v_new LOOP
        SELECT max(c.step) INTO v_last FROM derived_layer d
        JOIN checkpoint c ON c.id = d.checkpoint_id
        WHERE d.model_id = p_model AND d.config_id = p_config AND d.layer = v_layer;
        IF v_last IS NULL OR v_step > v_last THEN
          -- a new last step: its labels, each keeping the run it had at the old last step
          WITH old AS (
            DELETE FROM heuristic_emergence e WHERE {EMERGENCE_ROWS} RETURNING e.*)
          INSERT INTO heuristic_emergence (model, layer, neuron, op, config_id, heuristic,
                                           family, emergence_step, checkpoints_held,
                                           model_id, heuristic_id)
          SELECT m.name, s.layer, s.neuron, s.op, s.config_id, h.label, h.family,
                 coalesce(old.emergence_step, v_step), coalesce(old.checkpoints_held, 0) + 1,
                 s.model_id, s.heuristic_id
          FROM neuron_score s
          JOIN heuristic h ON h.id = s.heuristic_id
          JOIN model m ON m.id = s.model_id
          LEFT JOIN old ON old.neuron = s.neuron AND old.op = s.op
                       AND old.heuristic_id = s.heuristic_id
          WHERE {ONE_CHECKPOINT_S} AND s.layer = v_layer AND {LABEL};
        ELSE
          -- a step between others: it extends a run that starts just after it, lengthens
          -- the runs it falls inside, and breaks those whose pair it does not hold
          SELECT min(c.step), count(*) INTO v_next, v_after FROM derived_layer d
          JOIN checkpoint c ON c.id = d.checkpoint_id
          WHERE d.model_id = p_model AND d.config_id = p_config AND d.layer = v_layer
            AND c.step > v_step;
          UPDATE heuristic_emergence e
          SET emergence_step = v_step, checkpoints_held = e.checkpoints_held + 1
          WHERE {EMERGENCE_ROWS} AND e.emergence_step = v_next AND {IS_LABEL_AT_NEW};
          UPDATE heuristic_emergence e SET checkpoints_held = e.checkpoints_held + 1
          WHERE {EMERGENCE_ROWS} AND e.emergence_step < v_step AND {IS_LABEL_AT_NEW};
          UPDATE heuristic_emergence e SET emergence_step = v_next, checkpoints_held = v_after
          WHERE {EMERGENCE_ROWS} AND e.emergence_step < v_step AND NOT {IS_LABEL_AT_NEW};
        END IF;
      END LOOP;

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
        INSERT INTO checkpoint_overlap (model, step, config_id, final_pairs, present, share,
                                        model_id, checkpoint_id)
        {OVERLAP.format(ck=FOLDED_CK)};
      ELSE
        DELETE FROM checkpoint_overlap
        WHERE model_id = p_model AND checkpoint_id = p_checkpoint AND config_id = p_config;
        INSERT INTO checkpoint_overlap (model, step, config_id, final_pairs, present, share,
                                        model_id, checkpoint_id)
        {OVERLAP.format(ck="SELECT p_checkpoint AS checkpoint_id, v_step AS step")};
      END IF;
      RETURN 'folded';
    END $$"""


def _full_rebuild(derived: dict[str, str]) -> str:
    """refresh_catalog_views(p_model): 0009's rebuild of one model (NULL: every model),
    plus the label histogram and the record of what is folded in."""
    body = "\n".join(
        f"      DELETE FROM {name} WHERE p_model IS NULL OR model_id = p_model;\n"
        f"      INSERT INTO {name} {sql};" for name, sql in derived.items())
    return f"""
    CREATE OR REPLACE FUNCTION refresh_catalog_views(p_model integer DEFAULT NULL)
    RETURNS void LANGUAGE plpgsql AS $$
    BEGIN
      -- one refresher per model at a time (all models: every refresher waits)
      PERFORM pg_advisory_xact_lock(20260009, coalesce(p_model, 0));
{body}
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
    op.execute("CREATE INDEX ix_heuristic_emergence_layer ON heuristic_emergence "
               "(model_id, config_id, layer, neuron, op, heuristic_id)")
    op.execute(_full_rebuild(_views_0009().DERIVED))
    op.execute(REFRESH_CHECKPOINT)
    op.execute("SELECT refresh_catalog_views()")  # the histogram and the folded record
    op.execute("GRANT SELECT ON label_histogram TO catalog_reader")


def downgrade() -> None:
    old = _views_0009()
    op.execute("DROP FUNCTION refresh_checkpoint_views(integer, integer, integer)")
    op.execute("DROP FUNCTION refresh_catalog_views(integer)")
    op.execute("DROP TABLE label_histogram")
    op.execute("DROP TABLE derived_layer")
    op.execute("DROP INDEX ix_checkpoint_overlap_checkpoint")
    op.execute("DROP INDEX ix_heuristic_census_checkpoint")
    op.execute("DROP INDEX ix_heuristic_emergence_layer")
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
