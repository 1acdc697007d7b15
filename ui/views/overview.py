"""Overview: models, checkpoints (accuracy, faithfulness), jobs with live progress."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from ui import data
from ui.views.common import EMPTY


def render() -> None:
    st.title("Arithmetic neuron catalog")
    models = data.models()
    if models.empty:
        st.info(EMPTY)
    for model in models.itertuples():
        st.subheader(f"{model.name}")
        st.caption(f"{model.source} model, {model.n_layers} layers x {model.d_mlp} neurons, "
                   f"single-token numbers up to {model.number_limit}")
        cks = data.checkpoints(int(model.id))
        rows = []
        for ck in cks.itertuples():
            row = {"step": ck.step, "weights": ck.weights,
                   "duplicate of": ck.duplicate_of_step}
            if isinstance(ck.accuracy, dict):
                row.update({f"acc {op}": v for op, v in ck.accuracy.items()})
                faith = ck.faithfulness.get("+") or []
                if faith:
                    k, f = faith[len(faith) // 2]
                    row[f"faithfulness + (k={k})"] = f
            rows.append(row)
        st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
    st.subheader("Jobs")
    jobs_panel()


@st.fragment(run_every=3)
def jobs_panel() -> None:
    jobs = data.jobs()
    if jobs.empty:
        st.caption("No jobs yet. Queue one on the Jobs page or with `ncat enqueue`.")
        return
    for job in jobs.itertuples():
        frac = job.done / job.layers if job.layers else 0.0
        text = f"job {job.id}: {job.model} step {job.step}: {job.status} ({job.done}/{job.layers})"
        if job.error:
            text += f", layer {job.failed_layer}: {job.error}"
        st.progress(frac, text=text)
