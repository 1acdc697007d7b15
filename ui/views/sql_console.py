"""SQL console: read-only queries as the analysts' role, with a timeout and a row cap."""

from __future__ import annotations

import streamlit as st

from ui import data

EXAMPLE = "SELECT step, op, family, circuit_neurons FROM heuristic_census ORDER BY step LIMIT 50"


def render() -> None:
    st.title("SQL console")
    st.caption(f"Read-only (role catalog_reader), {data.SQL_TIMEOUT_MS // 1000} s timeout, "
               f"at most {data.SQL_ROW_CAP} rows. See docs/queries.md for the views.")
    sql = st.text_area("Query", value=EXAMPLE, height=140, key="sql")
    if not st.button("Run", key="run-sql"):
        return
    try:
        df, capped = data.run_console(sql)
    except data.ConsoleError as exc:
        st.error(str(exc))
        return
    if capped:
        st.warning(f"Showing the first {data.SQL_ROW_CAP} rows.")
    st.dataframe(df, hide_index=True, width="stretch")
    st.download_button("Download CSV", df.to_csv(index=False), "query.csv", "text/csv")
