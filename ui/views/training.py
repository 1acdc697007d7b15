"""Training: how heuristic families and the final mechanism appear over a model's
checkpoints, across its training seeds (docs/training.md; the same figures as
``ncat report``'s training section)."""

from __future__ import annotations

import re

import streamlit as st

from reports import training as rt
from ui import data
from ui.views.common import require_catalog


def render() -> None:
    st.title("Training: heuristics and the final circuit over checkpoints")
    if not require_catalog():
        return
    names = data.models().name.tolist()
    groups = sorted({re.sub(r"[-@]seed\d+$", "", n) for n in names})
    group = st.sidebar.selectbox("Model (its seeds together)", groups, key="training-model")
    d = data.training(group, None)
    if d is None:
        st.info(f"No checkpoint of {group} has a summary yet: catalog its checkpoints "
                f"(`ncat catalog {group} --checkpoints all`).")
        return
    st.caption(f"{group} · seeds {', '.join(map(str, d.seeds))} · every checkpoint · "
               f"measurement config #{d.config_id}")
    for i, fig in enumerate(rt.figures(d)):
        st.plotly_chart(fig, key=f"training-{i}")
    st.caption("The final circuit: the last checkpoint's paper circuit (its neurons, heads "
               "and pruned layers) measured at each step, beside the step's own circuit and "
               "a random circuit under the final circuit's plan, at the size nearest 2% of "
               "the layer; bands are ± one standard deviation over seeds (none with one "
               "seed). Shares: labelled neurons of each family among every measured neuron.")
    st.markdown("\n".join(rt.markdown(d)[1:]))
