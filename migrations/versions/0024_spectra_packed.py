"""The spectrum columns packed into eight smallints a map (catalog.periodic.spectra, docs/method.md
section 11): 0023's seventeen took 34 bytes a row, 18% of ``neuron_op``'s bytes on the
built-in model, where issue 34 allows 10%; these take 16.

- ``op1_spec``, ``op2_spec``, ``result_spec``, ``kv_spec``: the dominant period * 300 +
  its share of the profile's variance in 299ths (a period is one range of the column:
  period 10 is 3000..3299, and ``{axis}_spec / 300`` the period);
- ``op1_fitlin``, ``op2_fitlin``, ``result_fitlin``: the fit R^2 in 180ths * 181 + the
  linear share in 180ths;
- ``spec_helix``: the helix R^2 in 2000ths * 16 + a bit per axis whose period is
  significant (1 op1, 2 op2, 4 result, 8 KV).

NULL: not measured. Rows catalogued under 0023 are converted (shares rounded to the new
steps). The partial indexes hold ``(model_id, checkpoint_id, {axis}_spec / 300)`` of the
significant rows; the views ``neuron_spectrum``, ``period_distribution`` and
``period_label_overlap`` keep their columns, unpacked.

Revision ID: 0024
Revises: 0023
"""

import importlib.util
from pathlib import Path

from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

AXES = ("op1", "op2", "result", "kv")
FITTED = ("op1", "op2", "result")
NEW = (["spec_helix"] + [f"{x}_spec" for x in AXES] + [f"{x}_fitlin" for x in FITTED])


def _v0023():
    path = Path(__file__).with_name("0023_spectra.py")
    spec = importlib.util.spec_from_file_location("ncat_migration_0023", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _unpacked(sql: str) -> str:
    """0023's view SQL over the packed columns."""
    for x in AXES:
        sql = sql.replace(f"n.{x}_share / 1e4::float8", f"(n.{x}_spec % 300) / 299::float8")
        sql = sql.replace(f"n.{x}_period", f"(n.{x}_spec / 300)")
    for x in FITTED:
        sql = sql.replace(f"n.{x}_fit / 1e4::float8", f"(n.{x}_fitlin / 181) / 180::float8")
        sql = sql.replace(f"n.{x}_linear / 1e4::float8",
                          f"(n.{x}_fitlin % 181) / 180::float8")
    sql = sql.replace("n.helix_r2 / 1e4::float8", "(n.spec_helix >> 4) / 2000::float8")
    return sql.replace("n.spec_periodic", "n.spec_helix")


# period_label_overlap read the raw columns through ``n.*``: its first step now unpacks
OVERLAP_LIVE_0023 = """        SELECT n.*, (n.spec_periodic & 1) <> 0 AS p1, (n.spec_periodic & 2) <> 0 AS p2,
               (n.spec_periodic & 4) <> 0 AS pr
        FROM neuron_op n"""
OVERLAP_LIVE = """        SELECT n.model_id, n.checkpoint_id, n.config_id, n.layer, n.neuron, n.op,
               (n.spec_helix & 1) <> 0 AS p1, (n.spec_helix & 2) <> 0 AS p2,
               (n.spec_helix & 4) <> 0 AS pr,
               n.op1_spec / 300 AS op1_period, n.op2_spec / 300 AS op2_period,
               n.result_spec / 300 AS result_period,
               (n.op1_spec % 300) / 299::float8 AS op1_share,
               (n.op2_spec % 300) / 299::float8 AS op2_share,
               (n.result_spec % 300) / 299::float8 AS result_share,
               (n.op1_fitlin % 181) / 180::float8 AS op1_linear,
               (n.op2_fitlin % 181) / 180::float8 AS op2_linear,
               (n.result_fitlin % 181) / 180::float8 AS result_linear
        FROM neuron_op n"""


def _drop_views_and_indexes() -> None:
    op.execute("DROP VIEW period_label_overlap")
    op.execute("DROP VIEW period_distribution")
    op.execute("DROP VIEW neuron_spectrum")
    for x in AXES:
        op.execute(f"DROP INDEX ix_neuron_op_{x}_period")


def upgrade() -> None:
    old = _v0023()
    _drop_views_and_indexes()
    op.execute("ALTER TABLE neuron_op " + ", ".join(f"ADD COLUMN {c} SMALLINT" for c in NEW))

    def steps(col: str, n: int) -> str:  # ten-thousandths to n-ths, within [0, n]
        return f"least(greatest(round({col} * {n} / 1e4), 0), {n})::int"
    sets = ["spec_helix = CASE WHEN helix_r2 >= 0 THEN "
            f"{steps('helix_r2', 2000)} * 16 + spec_periodic END"]
    sets += [f"{x}_spec = CASE WHEN {x}_period >= 2 AND {x}_share >= 0 THEN "
             f"{x}_period * 300 + {steps(f'{x}_share', 299)} END" for x in AXES]
    sets += [f"{x}_fitlin = CASE WHEN {x}_fit >= 0 AND {x}_linear >= 0 THEN "
             f"{steps(f'{x}_fit', 180)} * 181 + {steps(f'{x}_linear', 180)} END"
             for x in FITTED]
    op.execute("UPDATE neuron_op SET " + ", ".join(sets) + " WHERE spec_periodic IS NOT NULL")
    op.execute("ALTER TABLE neuron_op " + ", ".join(f"DROP COLUMN {c}" for c in old.COLUMNS))
    for i, x in enumerate(AXES):
        op.execute(f"CREATE INDEX ix_neuron_op_{x}_period ON neuron_op "
                   f"(model_id, checkpoint_id, ({x}_spec / 300)) "
                   f"WHERE (spec_helix & {1 << i}) <> 0")
    op.execute(_unpacked(old.SPECTRUM.format(axes=old.AXIS_COLUMNS)))
    op.execute(_unpacked(old.DISTRIBUTION))
    assert OVERLAP_LIVE_0023 in old.OVERLAP
    op.execute(_unpacked(old.OVERLAP.replace(OVERLAP_LIVE_0023, OVERLAP_LIVE)))


def downgrade() -> None:
    old = _v0023()
    _drop_views_and_indexes()
    op.execute("ALTER TABLE neuron_op " + ", ".join(
        f"ADD COLUMN {c} SMALLINT" for c in old.COLUMNS))
    sets = ["spec_periodic = spec_helix & 15",
            "helix_r2 = round((spec_helix >> 4) * 1e4 / 2000)"]
    for x in AXES:
        sets += [f"{x}_period = {x}_spec / 300",
                 f"{x}_share = round(({x}_spec % 300) * 1e4 / 299)"]
    for x in FITTED:
        sets += [f"{x}_fit = round(({x}_fitlin / 181) * 1e4 / 180)",
                 f"{x}_linear = round(({x}_fitlin % 181) * 1e4 / 180)"]
    op.execute("UPDATE neuron_op SET " + ", ".join(sets) + " WHERE spec_helix IS NOT NULL")
    op.execute("ALTER TABLE neuron_op " + ", ".join(f"DROP COLUMN {c}" for c in NEW))
    for i, x in enumerate(AXES):
        op.execute(f"CREATE INDEX ix_neuron_op_{x}_period ON neuron_op "
                   f"(model_id, checkpoint_id, {x}_period) WHERE (spec_periodic & {1 << i}) <> 0")
    op.execute(old.SPECTRUM.format(axes=old.AXIS_COLUMNS))
    op.execute(old.DISTRIBUTION)
    op.execute(old.OVERLAP)
