"""SQL console: read-only queries as the analysts' role, with a timeout and a row cap."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from ui import data
from ui.views.common import reachable

EXAMPLE = "SELECT step, op, family, circuit_neurons FROM heuristic_census ORDER BY step LIMIT 50"


def render() -> None:
    st.title("SQL console")
    if not reachable():
        return
    st.caption(f"Read-only (role catalog_reader, a read-only transaction rolled back after "
               f"each query), {data.SQL_TIMEOUT_MS // 1000} s timeout, at most "
               f"{data.SQL_ROW_CAP} rows and {data.SQL_MAX_BYTES >> 20} MB. See docs/queries.md "
               "for the views.")
    sql = st.text_area("Query", value=EXAMPLE, height=140, key="sql")
    if not st.button("Run", key="run-sql"):
        return
    try:
        with data.console_turn():  # the rows are held until the table is drawn
            _show(data.run_console(sql))
    except data.ConsoleError as exc:  # refused, failed, or no turn free
        st.error(str(exc))


def _show(res) -> None:
    df = pd.DataFrame(res.rows, columns=res.columns)
    if res.capped:
        st.warning(f"Showing the first {data.SQL_ROW_CAP} rows.")
    if res.byte_capped:
        st.warning(f"Showing the first {len(res.rows)} rows: they reached "
                   f"{data.SQL_MAX_BYTES >> 20} MB, the console's limit.")
    if res.oversized:
        st.warning(f"{len(res.oversized)} row(s) larger than {data.SQL_MAX_ROW_BYTES >> 20} MB "
                   f"are shown empty (rows {', '.join(map(str, res.oversized[:10]))}); select "
                   "fewer or shorter columns.")
    shown, cut = preview(df)
    if cut:
        st.caption(f"Arrays longer than {PREVIEW} values are shown cut "
                   f"({', '.join(cut)}); the CSV holds them whole.")
    st.dataframe(shown, hide_index=True, width="stretch")
    # written when clicked: ten sessions' CSVs of large arrays held the server's CPU
    st.download_button("Download CSV", lambda: df.to_csv(index=False), "query.csv",
                       "text/csv")


PREVIEW = 50  # array values shown per cell


def preview(df: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """``df`` with each column holding an array longer than PREVIEW written as text, its
    first PREVIEW values and the count (a grid cannot show 20,000 values, and drawing
    them held the browser and the server); the names of those columns."""
    def long(v) -> bool:
        return isinstance(v, list | tuple | np.ndarray) and len(v) > PREVIEW

    def text(v) -> str | None:
        if v is None:
            return None
        if not isinstance(v, list | tuple | np.ndarray):
            return str(v)
        head = ", ".join(map(str, list(v[:PREVIEW])))
        return f"[{head}, ...] ({len(v):,} values)" if len(v) > PREVIEW else f"[{head}]"

    cut = [c for c in df.columns if df[c].dtype == object and any(long(v) for v in df[c])]
    if not cut:
        return df, []
    shown = df.copy()
    for c in cut:
        shown[c] = [text(v) for v in df[c]]
    return shown, [str(c) for c in cut]
