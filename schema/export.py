"""Export a view, table or read-only query to Parquet or CSV.

Exports run as the read-only role, so a query given on the command line can never
change the catalog.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
from sqlalchemy.engine import make_url

from schema.store import connect

READER = "catalog_reader"
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
FORMATS = ("parquet", "csv")


def as_reader(url: str) -> str:
    """``url`` as the analysts' role, with its password where one is set
    (``NCAT_READER_PASSWORD``: servers that authenticate by password), else none."""
    from catalog.config.settings import get_settings

    secret = get_settings().ncat_reader_password
    password = secret.get_secret_value() if secret is not None else None
    return make_url(url).set(username=READER, password=password).render_as_string(
        hide_password=False)


def read(url: str, view_or_query: str) -> pd.DataFrame:
    """Rows of a view/table name or of a SELECT query, as a DataFrame."""
    sql = view_or_query.strip().rstrip(";")
    if _IDENTIFIER.match(sql):
        sql = f'SELECT * FROM "{sql}"'
    with connect(as_reader(url)) as conn:
        cur = conn.execute(sql)
        cols = [d.name for d in cur.description] if cur.description else []
        return pd.DataFrame(cur.fetchall(), columns=cols)


def export(url: str, view_or_query: str, out: Path, fmt: str | None = None) -> int:
    """Write the rows to ``out`` (format from ``fmt`` or the file suffix); returns the count."""
    fmt = fmt or out.suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r} for {out}; use .parquet or .csv "
                         "(or --format parquet|csv)")
    df = read(url, view_or_query)
    out.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "parquet":
        df.to_parquet(out, index=False)
    else:
        df.to_csv(out, index=False)
    return len(df)
