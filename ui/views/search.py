"""Neuron search: filters, sortable server-side pages, links to each neuron."""

from __future__ import annotations

import streamlit as st

from ui import data
from ui.views.common import neuron_link, pick_model_checkpoint_config, require_catalog

PAGE_SIZE = 50


def render() -> None:
    st.title("Neuron search")
    if not require_catalog():
        return
    model, ck, config_id = pick_model_checkpoint_config("search")
    c1, c2, c3, c4 = st.columns(4)
    layer = c1.selectbox("Layer", ["any"] + list(range(int(model.n_layers))), key="s-layer")
    op = c2.selectbox("Operator", ["any", "+", "-", "*", "/"], key="s-op")
    family = c3.selectbox("Heuristic family", ["any"] + data.families(), key="s-family")
    label = c4.text_input("Heuristic label contains", placeholder="result in [10", key="s-label")
    c5, c6, c7, c8 = st.columns(4)
    min_score = c5.number_input(
        "Min score", 0.0, 1.0, 0.0, 0.05, key="s-score",
        help="Algorithm 1 score: share of the heuristic's cells among the neuron's top k "
             "(docs/method.md section 7). Compare it with the heuristic's base rate.")
    min_effect = c6.number_input(
        "Min effect", value=None, placeholder="any", key="s-effect",
        help="minimum |effect| by the config's ranking statistic (default: the 10%-trimmed "
             "mean over pairs of the log-space patching effect; docs/method.md section 5)")
    max_rank = c7.number_input("Max rank", min_value=0, value=None, placeholder="any",
                               key="s-rank")
    sort = c8.selectbox("Sort by", list(data.SORTS), key="s-sort")
    c9, c10, _, _ = st.columns(4)
    periodic = c9.selectbox(
        "Periodic on", ["—", "any", *data.SPECTRUM_AXES], key="s-periodic",
        help="maps whose dominant period on this axis (kv: the KV map along the result) "
             "beats the null of the other operands' effects (docs/method.md section 11); "
             "needs a config measured with spectra on")
    period = c10.number_input("Period", min_value=2, max_value=100, value=None,
                              placeholder="any", key="s-period",
                              disabled=periodic == "—")
    f = data.Filters(
        model_id=int(model.id), checkpoint_id=int(ck.checkpoint_id), config_id=config_id,
        layer=None if layer == "any" else int(layer), op=None if op == "any" else op,
        family=None if family == "any" else family, label=label.strip(),
        min_score=float(min_score), min_effect=min_effect,
        max_rank=None if max_rank is None else int(max_rank), sort=sort,
        periodic=None if periodic == "—" else periodic,
        period=None if periodic == "—" or period is None else int(period))
    page = int(st.session_state.get("search-page", 0))
    cap = data.COUNT_CAP
    rows, total = data.search(f, page, PAGE_SIZE, cap)
    pages = max(1, -(-min(total, cap) // PAGE_SIZE))
    if page >= pages:
        page = 0
        rows, total = data.search(f, 0, PAGE_SIZE, cap)
    if total > cap:  # counted no further: the pages go as far as the count did
        st.write(f"**More than {cap:,}** neuron-operator rows match; page {page + 1} of "
                 f"the first {pages}. Narrow the filters to count them all.")
    else:
        st.write(f"**{total}** neuron-operator rows match; page {page + 1} of {pages}.")
    if rows.empty:
        st.info("No neuron matches these filters. Lower the minimum score or effect.")
        return
    rows.insert(0, "open", [neuron_link(int(model.id), int(ck.checkpoint_id), config_id,
                                        r.layer, r.neuron, getattr(r, "op", None))
                            for r in rows.itertuples()])
    st.dataframe(rows, hide_index=True, width="stretch", column_config={
        "open": st.column_config.LinkColumn("page", display_text="open",
                                            help="the neuron's page"),
        "matched_heuristic": st.column_config.TextColumn(
            help="the heuristic that matched the filters (its best-scoring one)"),
        "matched_score": st.column_config.NumberColumn(format="%.2f"),
        "effect": st.column_config.NumberColumn(
            format="%.3f", help="what neurons are ranked by: the config's statistic of the "
                                "log-space patching effect (default its 10%-trimmed mean over "
                                "pairs); read this one"),
        "effect_exact": st.column_config.NumberColumn(
            help="the heuristics paper's mean effect over pairs (exact patching): a ratio "
                 "of probabilities, heavy-tailed (one pair can make it huge); for comparison "
                 "with the paper, not for ranking"),
        "effect_attr": st.column_config.NumberColumn(
            help="attribution patching's estimate of the mean log-space effect (first "
                 "order): not the same quantity as effect_exact"),
        "best_heuristic": st.column_config.TextColumn(
            help="the neuron's best-scoring heuristic for this operator, whatever the "
                 "filters"),
        "best_score": st.column_config.NumberColumn(format="%.2f"),
        "best_base_rate": st.column_config.NumberColumn(
            "base rate", format="%.3f",
            help="the share of the grid's cells in the best heuristic's set: a score on a "
                 "broad set (op2 in [0, 50)) is reached by chance far more often than on a "
                 "specific one; blank where none is stored"),
        "best_p_value": st.column_config.NumberColumn(
            "p-value", format="%.2e",
            help="the exact p-value of the best score under a random ordering of the map "
                 "(docs/method.md section 7); labels need it below the corrected level")})
    prev, _, nxt = st.columns([1, 4, 1])
    if prev.button("Previous", disabled=page == 0, key="s-prev"):
        st.session_state["search-page"] = page - 1
        st.rerun()
    if nxt.button("Next", disabled=page + 1 >= pages, key="s-next"):
        st.session_state["search-page"] = page + 1
        st.rerun()
