"""Heuristics across training: census by family, emergence steps, overlap with the end."""

from __future__ import annotations

import plotly.express as px
import streamlit as st

from reports import plots
from ui import data
from ui.views.common import pick_model_checkpoint_config, require_catalog


def render() -> None:
    st.title("Heuristics across training")
    if not require_catalog():
        return
    model, _, config_id = pick_model_checkpoint_config("heuristics", across_training=True)
    census = data.census(int(model.id), config_id)
    if census.empty:
        st.info("No circuit neuron implements a heuristic yet (the config's label rule: by "
                "default a score >= match_threshold with a p-value below the corrected "
                "level; docs/method.md section 7).")
    else:
        st.plotly_chart(plots.census_bars(census), key="census")
    em = data.emergence(int(model.id), config_id)
    if not em.empty:
        em = em.assign(step=em["emergence_step"].map(
            lambda s: "no steps" if s is None or s != s else str(int(s))))
        order = [str(int(s)) for s in sorted(em["emergence_step"].dropna().unique())]
        fig = px.bar(em, x="step", y="pairs", color="family",
                     color_discrete_map=plots.family_colors(),
                     title="When the final (neuron, heuristic) pairs emerged")
        # steps are categories in numeric order (0, 1, 2, 4, ..., not as text)
        fig.update_xaxes(type="category", categoryorder="array",
                         categoryarray=order + ["no steps"], title="emergence step")
        st.plotly_chart(fig, key="emergence")
    ov = data.overlap(int(model.id), config_id)
    if not ov.empty:
        fig = px.line(ov, x="step", y="share", markers=True,
                      title="Share of the final checkpoint's heuristic circuit already present")
        fig.update_yaxes(range=[0, 1.05])
        st.plotly_chart(fig, key="overlap")
        st.dataframe(ov, hide_index=True)
