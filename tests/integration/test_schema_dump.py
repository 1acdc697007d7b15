"""`docs/schema.sql` is the schema at the migrations' head: views, functions, triggers,
grants and partial-index predicates included, which `alembic check` does not compare."""

import difflib

from schema.dump import DUMP, schema_text
from schema.store import connect


def test_docs_schema_sql_is_the_schema_at_head(db):
    with connect(db) as conn:
        now = schema_text(conn)
    want = DUMP.read_text()
    diff = "".join(difflib.unified_diff(want.splitlines(True), now.splitlines(True),
                                        "docs/schema.sql", "head", n=1))
    assert now == want, ("a migration changed the schema: run `python -m schema.dump "
                         f"--write` and commit docs/schema.sql\n{diff[:4000]}")


def test_the_dump_sees_what_alembic_check_does_not(db):
    """A view's body, a function's, an index predicate and a grant each change the text."""
    with connect(db) as conn:
        before = schema_text(conn)
        changes = [
            "CREATE OR REPLACE VIEW label_enrichment AS SELECT * FROM label_enrichment "
            "WHERE false",
            "CREATE FUNCTION ncat_probe() RETURNS int LANGUAGE sql AS 'SELECT 1'",
            "CREATE INDEX probe_idx ON job (id) WHERE status = 'failed'",
            "REVOKE SELECT ON job FROM catalog_reader",
        ]
        seen = []
        for sql in changes:
            with conn.transaction():
                conn.execute("SAVEPOINT probe")
                conn.execute(sql)
                seen.append(schema_text(conn) != before)
                conn.execute("ROLLBACK TO SAVEPOINT probe")
        assert schema_text(conn) == before
    assert seen == [True, True, True, True]
