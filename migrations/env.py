"""Alembic environment: the URL from schema.database, metadata from schema.tables."""

import re

from alembic import context
from sqlmodel import SQLModel

import schema.tables  # noqa: F401  (registers every table on SQLModel.metadata)
from schema.engine import make_engine

config = context.config
target_metadata = SQLModel.metadata

# Partitions (neuron_op_p0 ...) and views are created by hand in migrations; they are
# not models, so autogenerate and `alembic check` must not report them.
_PARTITION = re.compile(r"^(neuron_op|neuron_grid|neuron_lens|neuron_score)_p\d+$")


# Tables derived from the others, folded in per checkpoint by refresh_checkpoint_views()
# and rebuilt per model by refresh_catalog_views() (migrations 0009, 0011): the analysts'
# census, emergence runs, overlap and label histogram, and the record of what is folded in;
# emergence_histogram is kept from emergence_run by triggers (0014).
DERIVED = {"heuristic_census", "emergence_run", "checkpoint_overlap", "label_histogram",
           "derived_layer", "emergence_histogram"}


def include_object(obj, name, type_, reflected, compare_to):
    if type_ == "table" and name and (_PARTITION.match(name) or name in DERIVED):
        return False
    if type_ == "index" and getattr(getattr(obj, "table", None), "name", None) in DERIVED:
        return False
    return True


def run_migrations_online() -> None:
    url = config.attributes.get("url")
    connectable = config.attributes.get("connection")
    if connectable is not None:
        _run(connectable)
        return
    engine = make_engine(url)
    with engine.connect() as connection:
        _run(connection)
    engine.dispose()


def _run(connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata,
                      include_object=include_object, compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


run_migrations_online()
