"""Selectors and empty states shared by the pages."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from ui import data

EMPTY = ("The catalog is empty. Run the demo (`bash scripts/demo.sh`), or catalog a model: "
         "`ncat catalog builtin --checkpoints all`, or queue one on the Jobs page.")


def require_catalog() -> bool:
    if not data.has_catalog():
        st.info(EMPTY)
        return False
    return True


def pick_model_checkpoint_config(key: str, across_training: bool = False):
    """Sidebar selectors, and a line on the page naming what it shows (the model, the
    checkpoint, or every checkpoint with ``across_training``, and the measurement config);
    returns (model row, checkpoint row, config id)."""
    models = data.models()
    names = models.name.tolist()
    name = st.sidebar.selectbox("Model", names, key=f"{key}-model")
    model = models[models.name == name].iloc[0]
    cks = data.checkpoints(int(model.id))
    cks = cks[cks.config_id.notna()] if cks.config_id.notna().any() else cks
    steps = cks.step.tolist()
    step = st.sidebar.selectbox("Checkpoint step", steps, index=len(steps) - 1,
                                key=f"{key}-step",
                                format_func=lambda s: "(no steps)" if pd.isna(s) else str(int(s)))
    # a model without training steps (a GGUF file, a local directory) has step NULL
    ck = cks[cks.step.isna()].iloc[0] if pd.isna(step) else cks[cks.step == step].iloc[0]
    cfgs = data.configs(int(model.id))
    labels = [f"#{r.id}: ops {r.operators}, operands [{r.operand_lo}, {r.operand_hi}), "
              f"template {r.template!r}, {r.shots or 0} shots, labels: {r.label_rule or 'paper'}"
              for r in cfgs.itertuples()]
    choice = st.sidebar.selectbox("Measurement config", labels, key=f"{key}-config")
    config_id = int(cfgs.id.iloc[labels.index(choice)])
    where = "every checkpoint" if across_training else (
        "final weights" if pd.isna(step) else f"step {int(step)}")
    st.caption(f"{name} · {where} · measurement config {choice}")
    return model, ck, config_id


def neuron_link(model_id, checkpoint_id, config_id, layer, neuron) -> str:
    return (f"/neuron?model_id={model_id}&checkpoint_id={checkpoint_id}&config_id={config_id}"
            f"&layer={layer}&neuron={neuron}")
