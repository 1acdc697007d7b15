"""The explorer's entry point: `streamlit run ui/app.py`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere

import streamlit as st  # noqa: E402

from ui.views import (  # noqa: E402
    circuits,
    heuristics,
    jobs_page,
    neuron,
    overview,
    prompt,
    search,
    sql_console,
    training,
)

st.set_page_config(page_title="Arithmetic neuron catalog", layout="wide")
pages = [
    st.Page(overview.render, title="Overview", default=True),
    st.Page(search.render, title="Neuron search", url_path="search"),
    st.Page(neuron.render, title="Neuron", url_path="neuron"),
    st.Page(prompt.render, title="Prompt", url_path="prompt"),
    st.Page(heuristics.render, title="Heuristics", url_path="heuristics"),
    st.Page(circuits.render, title="Circuits", url_path="circuits"),
    st.Page(training.render, title="Training", url_path="training"),
    st.Page(sql_console.render, title="SQL console", url_path="sql"),
    st.Page(jobs_page.render, title="Jobs", url_path="jobs"),
]
st.sidebar.caption("What every number means: docs/method.md in the repository "
                   "(activation grids, logit lens, patching effects, heuristic scores).")


def _overview_at_its_own_path() -> None:
    """/overview, the path the sidebar's Overview has on every other page's links: the
    default page is served at the root and Streamlit ignores its url_path."""
    overview.render()


pages.append(st.Page(_overview_at_its_own_path, title="Overview", url_path="overview",
                     visibility="hidden"))
st.navigation(pages).run()
