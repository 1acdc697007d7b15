"""The catalog's identity: a UUID stored with the catalog (table ``catalog_identity``,
migration 0037), named by every queue message.

Job and explain-request ids are per database: two catalogs whose workers share a Redis
queue both have a job 1. A message carries its catalog's identity; a worker of another
catalog leaves it in the queue for its owner (jobs.tasks), and the reconciler counts a
waiting message as its own only when it names its catalog. The identity is not the
database URL (hosts and ports change between a worker and the machine that enqueued; a
URL may hold a password). It is minted on first use in this database: a copy of the
database (``CREATE DATABASE ... TEMPLATE``, a restored dump) sees that the stored one was
minted in another database (its oid) and mints its own, so two copies on one queue are
two catalogs.
"""

from __future__ import annotations

import functools

import psycopg

_DB_OID = "(SELECT oid FROM pg_database WHERE datname = current_database())"


def catalog_identity(conn: psycopg.Connection) -> str:
    """This database's catalog identity (a UUID's text), minted if it has none or holds
    the identity of the database it was copied from. Safe under concurrent callers: one
    mint wins and every caller returns it."""
    conn.execute("INSERT INTO catalog_identity (one, id, db_oid) "
                 f"VALUES (true, gen_random_uuid(), {_DB_OID}) ON CONFLICT (one) DO NOTHING")
    conn.execute(f"UPDATE catalog_identity SET id = gen_random_uuid(), db_oid = {_DB_OID}, "
                 f"minted_at = now() WHERE db_oid <> {_DB_OID}")
    row = conn.execute("SELECT id::text FROM catalog_identity").fetchone()
    if row is None:  # pragma: no cover - the INSERT above guarantees a row
        raise LookupError("catalog_identity has no row")
    return str(row[0])


@functools.lru_cache(maxsize=8)
def identity_of(url: str) -> str:
    """The catalog identity of the database at ``url``, read once per process (a worker
    compares it with every message it takes)."""
    from schema.store import connect

    with connect(url, autocommit=True, connect_timeout=10) as conn:
        return catalog_identity(conn)
