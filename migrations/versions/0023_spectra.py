"""Periodic structure of every map (catalog 0.7.0, catalog.periodic.spectra, docs/method.md
section 11): columns of ``neuron_op``, their indexes and three views.

Columns (NULL in rows catalogued before; -1 is never stored):

- ``spec_periodic``: a bit per axis whose dominant period is significant (1 op1, 2 op2,
  4 result, 8 the KV map along the result); 0 for constant maps;
- ``op1_period``, ``op2_period``, ``result_period``, ``kv_period``: the dominant period of
  each axis's profile (2 to 100, at least two cycles on the axis);
- ``*_share``: its share of the profile's variance, in ten-thousandths;
- ``op1_fit``, ``op2_fit``, ``result_fit``: the share of the map's variance a line and the
  three largest periods explain, in ten-thousandths;
- ``op1_linear``, ``op2_linear``, ``result_linear``: the share of the profile a line
  explains (the magnitude, low-frequency part), in ten-thousandths;
- ``helix_r2``: a line and cos and sin at periods 2, 5, 10 and 100 of the result,
  fit to the map, in ten-thousandths.

Ten-thousandths in smallint keep the 17 values at 34 bytes a row. Partial indexes serve
"neurons whose op1 spectrum is dominated by period 10" from the significant rows only.

Views: ``neuron_spectrum`` (the columns as periods and fractions, per axis a boolean),
``period_distribution`` (per model, step, config, layer, operator and axis: how many
live maps are periodic with each period, of how many, with a Wilson interval: the
frequency distribution through training), ``period_label_overlap`` (per model, step,
config, operator and target axis: how many modulo-n labelled neurons are periodic on
that axis with a period dividing n, and how many range-labelled ones are magnitude
maps, each beside the rate among all live maps of the same layers).

Revision ID: 0023
Revises: 0022
"""

from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

AXES = ("op1", "op2", "result", "kv")
COLUMNS = (["spec_periodic"] + [f"{x}_period" for x in AXES] + [f"{x}_share" for x in AXES]
           + ["op1_fit", "op2_fit", "result_fit", "op1_linear", "op2_linear",
              "result_linear", "helix_r2"])

SPECTRUM = """
    CREATE VIEW neuron_spectrum AS
    SELECT m.name AS model, c.step, n.config_id, n.layer, n.neuron, n.op,
           {axes},
           n.op1_fit / 1e4::float8 AS op1_fit, n.op2_fit / 1e4::float8 AS op2_fit,
           n.result_fit / 1e4::float8 AS result_fit,
           n.op1_linear / 1e4::float8 AS op1_linear, n.op2_linear / 1e4::float8 AS op2_linear,
           n.result_linear / 1e4::float8 AS result_linear,
           n.helix_r2 / 1e4::float8 AS helix_r2,
           n.model_id, n.checkpoint_id
    FROM neuron_op n
    JOIN model m ON m.id = n.model_id
    JOIN checkpoint c ON c.id = n.checkpoint_id
    WHERE n.spec_periodic IS NOT NULL AND NOT coalesce(n.constant, false)
"""

AXIS_COLUMNS = ", ".join(
    f"n.{x}_period AS {x}_period, n.{x}_share / 1e4::float8 AS {x}_share, "
    f"(n.spec_periodic & {1 << i}) <> 0 AS {x}_periodic" for i, x in enumerate(AXES))

DISTRIBUTION = """
    CREATE VIEW period_distribution AS
    WITH maps AS (
        SELECT n.model_id, n.checkpoint_id, n.config_id, n.layer, n.op, a.axis, a.period,
               a.periodic
        FROM neuron_op n
        CROSS JOIN LATERAL (VALUES
            ('op1', n.op1_period, (n.spec_periodic & 1) <> 0),
            ('op2', n.op2_period, (n.spec_periodic & 2) <> 0),
            ('result', n.result_period, (n.spec_periodic & 4) <> 0),
            ('kv', n.kv_period, (n.spec_periodic & 8) <> 0)) AS a(axis, period, periodic)
        WHERE n.spec_periodic IS NOT NULL AND NOT coalesce(n.constant, false)
    ), live AS (
        SELECT model_id, checkpoint_id, config_id, layer, op, axis, count(*) AS n_live,
               count(*) FILTER (WHERE periodic) AS n_periodic
        FROM maps GROUP BY model_id, checkpoint_id, config_id, layer, op, axis
    ), by_period AS (
        SELECT model_id, checkpoint_id, config_id, layer, op, axis, period, count(*) AS n
        FROM maps WHERE periodic
        GROUP BY model_id, checkpoint_id, config_id, layer, op, axis, period
    )
    SELECT md.name AS model, c.step, l.config_id, l.layer, l.op, l.axis, p.period,
           coalesce(p.n, 0) AS n, l.n_periodic, l.n_live,
           coalesce(p.n, 0)::float8 / nullif(l.n_live, 0) AS share,
           wilson_low(coalesce(p.n, 0), l.n_live) AS share_low,
           wilson_high(coalesce(p.n, 0), l.n_live) AS share_high,
           l.model_id, l.checkpoint_id
    FROM live l
    LEFT JOIN by_period p USING (model_id, checkpoint_id, config_id, layer, op, axis)
    JOIN model md ON md.id = l.model_id
    JOIN checkpoint c ON c.id = l.checkpoint_id
"""

OVERLAP = """
    CREATE VIEW period_label_overlap AS
    WITH live AS (
        SELECT n.*, (n.spec_periodic & 1) <> 0 AS p1, (n.spec_periodic & 2) <> 0 AS p2,
               (n.spec_periodic & 4) <> 0 AS pr
        FROM neuron_op n
        WHERE n.spec_periodic IS NOT NULL AND NOT coalesce(n.constant, false)
    ), axis AS (
        SELECT l.model_id, l.checkpoint_id, l.config_id, l.layer, l.neuron, l.op, a.target,
               a.period, a.periodic, a.share, a.linear
        FROM live l CROSS JOIN LATERAL (VALUES
            ('op1', l.op1_period, l.p1, l.op1_share, l.op1_linear),
            ('op2', l.op2_period, l.p2, l.op2_share, l.op2_linear),
            ('result', l.result_period, l.pr, l.result_share, l.result_linear))
            AS a(target, period, periodic, share, linear)
    ), labels AS (
        SELECT s.model_id, s.checkpoint_id, s.config_id, s.layer, s.neuron, s.op, h.family,
               h.target, CASE WHEN h.family = 'modulo' THEN (h.params ->> 0)::int END
                   AS modulus
        FROM neuron_score s JOIN heuristic h ON h.id = s.heuristic_id
        WHERE s.implements AND h.family IN ('modulo', 'range')
    ), matched AS (
        SELECT DISTINCT l.model_id, l.checkpoint_id, l.config_id, l.layer, l.neuron, l.op,
               l.family, l.target,
               bool_or(CASE WHEN l.family = 'modulo'
                            THEN a.periodic AND l.modulus % a.period = 0
                            ELSE a.linear > a.share END)
                   OVER (PARTITION BY l.model_id, l.checkpoint_id, l.config_id, l.layer,
                         l.neuron, l.op, l.family, l.target) AS agrees
        FROM labels l
        JOIN axis a USING (model_id, checkpoint_id, config_id, layer, neuron, op, target)
    ), layers AS (
        SELECT DISTINCT model_id, checkpoint_id, config_id, op, family, target, layer
        FROM matched
    ), base AS (
        SELECT y.model_id, y.checkpoint_id, y.config_id, y.op, y.family, y.target,
               count(*) AS n_live,
               count(*) FILTER (WHERE CASE WHEN y.family = 'modulo' THEN a.periodic
                                           ELSE a.linear > a.share END) AS n_base
        FROM layers y
        JOIN axis a ON a.model_id = y.model_id AND a.checkpoint_id = y.checkpoint_id
             AND a.config_id = y.config_id AND a.op = y.op AND a.layer = y.layer
             AND a.target = y.target
        GROUP BY y.model_id, y.checkpoint_id, y.config_id, y.op, y.family, y.target
    ), counted AS (
        SELECT model_id, checkpoint_id, config_id, op, family, target, count(*) AS n_labelled,
               count(*) FILTER (WHERE agrees) AS n_agree
        FROM matched GROUP BY model_id, checkpoint_id, config_id, op, family, target
    )
    SELECT md.name AS model, c.step, k.config_id, k.op, k.family, k.target,
           CASE k.family WHEN 'modulo' THEN 'periodic, period dividing the modulus'
                ELSE 'magnitude: a line explains more than any period' END AS agreement,
           k.n_labelled, k.n_agree, k.n_agree::float8 / nullif(k.n_labelled, 0) AS share,
           wilson_low(k.n_agree, k.n_labelled) AS share_low,
           wilson_high(k.n_agree, k.n_labelled) AS share_high,
           b.n_live, b.n_base, b.n_base::float8 / nullif(b.n_live, 0) AS base_rate,
           k.model_id, k.checkpoint_id
    FROM counted k
    JOIN base b USING (model_id, checkpoint_id, config_id, op, family, target)
    JOIN model md ON md.id = k.model_id
    JOIN checkpoint c ON c.id = k.checkpoint_id
"""


def upgrade() -> None:
    op.execute("ALTER TABLE neuron_op " + ", ".join(
        f"ADD COLUMN {c} SMALLINT" for c in COLUMNS))
    for i, x in enumerate(("op1", "op2", "result", "kv")):
        op.execute(f"CREATE INDEX ix_neuron_op_{x}_period ON neuron_op "
                   f"(model_id, checkpoint_id, {x}_period) WHERE (spec_periodic & {1 << i}) <> 0")
    op.execute(SPECTRUM.format(axes=AXIS_COLUMNS))
    op.execute(DISTRIBUTION)
    op.execute(OVERLAP)


def downgrade() -> None:
    op.execute("DROP VIEW period_label_overlap")
    op.execute("DROP VIEW period_distribution")
    op.execute("DROP VIEW neuron_spectrum")
    for x in ("op1", "op2", "result", "kv"):
        op.execute(f"DROP INDEX ix_neuron_op_{x}_period")
    op.execute("ALTER TABLE neuron_op " + ", ".join(f"DROP COLUMN {c}" for c in COLUMNS))
