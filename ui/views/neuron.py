"""One neuron: grids (K and KV maps), logit lens, heuristic matches, evolution.

The URL carries the neuron (model_id, checkpoint_id, config_id, layer, neuron), so a
page can be shared.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from ui import data, plots
from ui.views.common import require_catalog

KEYS = ("model_id", "checkpoint_id", "config_id", "layer", "neuron")


def _params() -> dict | None:
    qp = st.query_params
    try:
        return {k: int(qp[k]) for k in KEYS}
    except (KeyError, ValueError):
        return None


def render() -> None:
    st.title("Neuron")
    if not require_catalog():
        return
    p = _params()
    if p is None:
        st.info("Open a neuron from the search page, or give model_id, checkpoint_id, "
                "config_id, layer and neuron in the URL.")
        return
    ops = data.neuron_ops(*p.values())
    if ops.empty:
        st.warning(f"No stored neuron {p['neuron']} in layer {p['layer']} for these ids.")
        return
    st.subheader(f"Layer {p['layer']}, neuron {p['neuron']}")
    st.dataframe(ops, hide_index=True, width="stretch")
    layout = data.layout(p["config_id"]).set_index("op")

    st.markdown("#### Activation grids (K map)")
    cols = st.columns(2)
    for i, op in enumerate(layout.index):
        g = data.grid(*p.values(), op=op)
        if g is not None:
            cols[i % 2].plotly_chart(plots.heatmap(g, int(layout.lo[op]), f"K map, {op}"),
                                     key=f"k{op}")
    st.markdown("#### Direct effect on the answer (KV map)")
    kv_op = st.radio("Operator", list(layout.index), horizontal=True, key="kv-op")
    g = data.grid(*p.values(), op=kv_op, kv=True)
    if g is not None:
        st.plotly_chart(plots.heatmap(g, int(layout.lo[kv_op]), f"KV map, {kv_op}",
                                      diverging=True), key="kv")

    lens = data.lens(*p.values())
    if lens:
        st.markdown("#### Logit lens")
        st.plotly_chart(plots.lens_line(lens["numbers"]), key="lens")
        c1, c2 = st.columns(2)
        c1.dataframe(pd.DataFrame({"promoted": lens["top_tokens"], "value": lens["top_values"]}),
                     hide_index=True)
        c2.dataframe(pd.DataFrame({"suppressed": lens["bottom_tokens"],
                                   "value": lens["bottom_values"]}), hide_index=True)

    st.markdown("#### Heuristic matches")
    st.caption("Score: share of the heuristic's cells among the neuron's top-k cells; base "
               "rate: the score a random ordering gives (|S_H| / cells); p-value: the exact "
               "chance of a score this high on a random ordering; 'bottom' rows scored the most "
               "negative cells; label_rule: the neuron implements the heuristic under the "
               "config's rule (by default score >= threshold and p-value <= level / heuristics "
               "scored). Constant neurons get no rows (docs/method.md section 7).")
    m = data.matches(*p.values())
    if m.empty:
        st.caption("No heuristic scores above the stored floor.")
    else:
        st.dataframe(m, hide_index=True, width="stretch",
                     column_config={"score": st.column_config.ProgressColumn(
                         min_value=0.0, max_value=1.0, format="%.2f"),
                         "base_rate": st.column_config.NumberColumn(format="%.2f"),
                         "p_value": st.column_config.NumberColumn(format="%.1e")})

    st.markdown("#### Across training")
    ev = data.evolution(p["model_id"], p["config_id"], p["layer"], p["neuron"])
    if ev.empty:
        return
    c1, c2 = st.columns(2)
    c1.plotly_chart(plots.evolution_lines(ev, "effect", "Patching effect (ranking statistic)"),
                    key="ev-e")
    c2.plotly_chart(plots.evolution_lines(ev, "best_score", "Best heuristic score"), key="ev-s")
    steps = sorted(ev.step.unique().tolist())
    chosen = st.multiselect("Grids at steps", steps, default=steps[-3:], key="ev-steps")
    op = st.radio("Operator ", list(layout.index), horizontal=True, key="ev-op")
    if chosen:
        cols = st.columns(len(chosen))
        for col, step in zip(cols, chosen, strict=True):
            ck = int(ev[ev.step == step].checkpoint_id.iloc[0])
            g = data.grid(p["model_id"], ck, p["config_id"], p["layer"], p["neuron"], op=op)
            if g is not None:
                col.plotly_chart(plots.heatmap(g, int(layout.lo[op]), f"step {step}"),
                                 key=f"ev-{step}")
