"""The schema at the migrations' head, in one readable file: ``docs/schema.sql``.

Eighteen-odd migrations replace views and functions many times over; to learn what one is
today, read ``docs/schema.sql``. It is written from the server's own catalogs after
``alembic upgrade head`` (tables with their columns, constraints and partition keys,
indexes with their predicates, views, functions, triggers, grants and the read-only
role's settings; the per-model partitions, which follow the data, are left out), so that
``tests/integration/test_schema_dump.py`` fails when a migration changes any of it
without the file being written again:

    python -m schema.dump --write        # after adding a migration
"""

from __future__ import annotations

import sys
from pathlib import Path

import psycopg

DUMP = Path(__file__).resolve().parents[1] / "docs" / "schema.sql"
ROLES = ("catalog_reader",)  # the roles the migrations create

HEADER = ("-- The catalog's schema at the migrations' head, written by `python -m schema.dump "
          "--write`\n-- from a database migrated to head (tests check that it is current). "
          "Read it; do not run it:\n-- the migrations are what build a database.\n")


def _rows(conn: psycopg.Connection, sql: str, params: tuple = ()) -> list[tuple]:
    return conn.execute(sql, params).fetchall()


def schema_text(conn: psycopg.Connection) -> str:  # noqa: C901
    """Every object of the public schema that a migration defines, in a stable order."""
    out = [HEADER]
    owner = str(_rows(conn, "SELECT current_user")[0][0])

    def grants(acl: str) -> str:  # the migrating user's name is the server's, not ours
        return acl.replace(f"{owner}=", "OWNER=").replace(f"/{owner}", "/OWNER")
    tables = _rows(conn, """
        SELECT c.oid, c.relname, c.relkind, pg_get_partkeydef(c.oid), c.relacl::text
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND NOT c.relispartition
        ORDER BY c.relname""")
    for oid, name, kind, partkey, acl in tables:
        cols = _rows(conn, """
            SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
                   pg_get_expr(d.adbin, d.adrelid), a.attidentity
            FROM pg_attribute a LEFT JOIN pg_attrdef d
              ON d.adrelid = a.attrelid AND d.adnum = a.attnum
            WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
            ORDER BY a.attnum""", (oid,))
        lines = []
        for col, typ, notnull, default, identity in cols:
            text = f"    {col} {typ}"
            if identity:
                text += " GENERATED " + ("ALWAYS" if identity == "a" else "BY DEFAULT") \
                    + " AS IDENTITY"
            elif default is not None:
                text += f" DEFAULT {default}"
            if notnull:
                text += " NOT NULL"
            lines.append(text)
        for cname, cdef in _rows(conn, """
                SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint
                WHERE conrelid = %s AND contype <> 'n' ORDER BY conname""", (oid,)):
            lines.append(f"    CONSTRAINT {cname} {cdef}")
        tail = f" PARTITION BY {partkey}" if kind == "p" else ""
        out.append(f"CREATE TABLE {name} (\n" + ",\n".join(lines) + f"\n){tail};\n")
        if acl:
            out.append(f"-- grants on {name}: {grants(acl)}\n")
    out.append("\n-- indexes\n")
    for (indexdef,) in _rows(conn, """
            SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i
            JOIN pg_class t ON t.oid = i.indrelid JOIN pg_namespace n ON n.oid = t.relnamespace
            JOIN pg_class x ON x.oid = i.indexrelid
            WHERE n.nspname = 'public' AND NOT t.relispartition
            ORDER BY t.relname, x.relname"""):
        out.append(indexdef + ";\n")
    for name, kind, definition, acl in _rows(conn, """
            SELECT c.relname, c.relkind, pg_get_viewdef(c.oid, true), c.relacl::text
            FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = 'public' AND c.relkind IN ('v', 'm') ORDER BY c.relname"""):
        what = "MATERIALIZED VIEW" if kind == "m" else "VIEW"
        out.append(f"\nCREATE {what} {name} AS\n{definition.rstrip()}\n")
        if acl:
            out.append(f"-- grants on {name}: {grants(acl)}\n")
    for definition, acl in _rows(conn, """
            SELECT pg_get_functiondef(p.oid), p.proacl::text FROM pg_proc p
            JOIN pg_namespace n ON n.oid = p.pronamespace
            WHERE n.nspname = 'public' AND p.prokind IN ('f', 'p')
            ORDER BY p.proname, pg_get_function_identity_arguments(p.oid)"""):
        out.append("\n" + definition.rstrip() + ";\n")
        if acl:
            out.append(f"-- grants: {grants(acl)}\n")
    out.append("\n-- triggers\n")
    for (triggerdef,) in _rows(conn, """
            SELECT pg_get_triggerdef(t.oid) FROM pg_trigger t
            JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = 'public' AND NOT t.tgisinternal AND NOT c.relispartition
            ORDER BY c.relname, t.tgname"""):
        out.append(triggerdef + ";\n")
    out.append("\n-- roles\n")
    # session_preload_libraries names the reader guard only on servers that have it
    # (migration 0033), so it is left out: the file is the same on every server; the
    # settings sorted (their order is the order they were last set on the server's role,
    # which another database's migration may change)
    for name, login, config in _rows(conn, """
            SELECT rolname, rolcanlogin, ARRAY(
              SELECT c FROM unnest(rolconfig) c
              WHERE c NOT LIKE 'session_preload_libraries=%%' ORDER BY c)::text
            FROM pg_roles WHERE rolname = ANY(%s) ORDER BY rolname""", (list(ROLES),)):
        out.append(f"-- role {name}: login {login}, settings {config}\n")
    for name, acl in _rows(conn, """
            SELECT nspname, nspacl::text FROM pg_namespace WHERE nspname = 'public'"""):
        out.append(f"-- grants on schema {name}: {grants(acl)}\n")
    return "".join(out)


def main(argv: list[str]) -> int:
    from schema.database import resolve_database_url
    from schema.engine import migrate
    from schema.store import connect

    url = resolve_database_url()
    migrate(url)
    with connect(url) as conn:
        text = schema_text(conn)
    if "--write" in argv:
        DUMP.write_text(text)
        print(f"wrote {DUMP}")
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
