"""Circuits: where the answer is computed (component effects, the residual stream's logit
lens) and each faithfulness protocol's curve with its controls, areas and warnings."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from reports import circuits as rc
from ui import data
from ui.views.common import pick_model_checkpoint_config, require_catalog

STATS = {"ratio of means": "ratio_of_means", "mean of ratios (the paper's)": "mean_ratio"}


def render() -> None:
    st.title("Circuits and faithfulness")
    if not require_catalog():
        return
    model, ck, config_id = pick_model_checkpoint_config("circuits")
    d = data.circuits(int(model.id), int(ck.checkpoint_id), config_id)
    if not d.summaries and not d.components:
        st.info("No circuits stored for this checkpoint and config: the summary runs after "
                "the last layer of a job (`ncat catalog` or a queued job), with the config's "
                "`--protocols` and `--component-positions`.")
        return
    ops = sorted({s["op"] for s in d.summaries} | {r["op"] for r in d.components},
                 key="+-*/".index)
    op = st.radio("Operator", ops, horizontal=True, key="circuits-op")
    if d.components:
        left, right = st.columns(2)
        left.plotly_chart(rc.mlp_bars(d, [op]), key="circuits-mlp")
        right.plotly_chart(rc.head_heatmap(d, op), key="circuits-heads")
    lens = d.residual_lens.get(op)
    if lens:
        st.caption("Residual-stream logit lens at the last position, the answer's median "
                   "rank after each layer: " + ", ".join(
                       f"L{la} {int(r)}" for la, r in enumerate(lens["median_rank"])))
    metric = st.selectbox("Metric", ["nl", "logprob", "logit_diff"], key="circuits-metric",
                          format_func={"nl": "normalised logit (the paper's)",
                                       "logprob": "answer's log-probability",
                                       "logit_diff": "logit difference to the counterfactual "
                                                     "answer (MIB)"}.get)
    for s in (s for s in d.summaries if s["op"] == op):
        protocol = s["protocol"]
        st.subheader(f"Protocol {protocol}")
        st.caption(f"heads kept {s['n_heads_kept']}; MLP layers whole: "
                   f"{rc._layers(s['whole'])}; pruned: {rc._layers(s['pruned'])}"
                   + (f"; first heuristics layer {s['late_from']} ({s['late_source']})"
                      if s["late_from"] is not None else "")
                   + f"; ranked by {s['ranking']}; {s['n_prompts']} prompt draws over "
                   f"{s['seeds']} seeds")
        for w in rc.warnings(d, s):
            st.warning(w)
        st.plotly_chart(rc.curve_figure(d, op, protocol, metric), key=f"curve-{protocol}")
        base = s["baselines"].get(metric, {})
        st.caption(f"{metric}: model {rc._f(base.get('model'))}, empty circuit "
                   f"{rc._f(base.get('empty'))}; {base.get('n_small', 'n/a')} of "
                   f"{s['n_prompts']} prompts with a denominator under {rc.SMALL:g} of the "
                   "median prompt's")
        rows = []
        for circuit in ("ranked", "random", "reversed"):
            for p in d.curve(op, protocol, circuit, metric):
                rows.append({"circuit": circuit, "k": p["k"], "share": p["fraction"],
                             **{label: p[stat] for label, stat in STATS.items()},
                             "± SE (ratio of means)": p["ratio_of_means_se"],
                             "median": p["median_ratio"], "small denominators": p["n_small"],
                             "prompts clipped": p.get("n_clipped"),
                             "one prompt moves it by at most": p.get("influence_bound")})
        st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch",
                     key=f"points-{protocol}")
        areas = s["areas"]
        st.dataframe(pd.DataFrame([
            {"circuit": c, **{f"{a.upper()}": (areas.get(c, {}).get(metric, {})
                                              .get("ratio_of_means", {}).get(a))
                              for a in ("cpr", "cmd")}}
            for c in ("ranked", "random", "reversed")]), hide_index=True,
            key=f"areas-{protocol}")
