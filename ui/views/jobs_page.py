"""Jobs: queue a model and checkpoints (validated by jobs/), and watch progress."""

from __future__ import annotations

import streamlit as st

from ui import data
from ui.views.overview import jobs_panel


def render() -> None:
    st.title("Jobs")
    with st.form("enqueue"):
        model = st.text_input("Model", value="builtin",
                              help="'builtin', a hub name, a local directory or a .gguf file")
        checkpoints = st.text_input("Checkpoints", value="all",
                                    help="'all', a list like 0,512,3000, or start:stop:step")
        c1, c2, c3 = st.columns(3)
        lo = c1.number_input("Operands from", 0, 10_000, 0)
        hi = c2.number_input("to (exclusive)", 1, 10_000, 100)
        pairs = c3.number_input("Pairs per operator", 1, 10_000, 100)
        ops = st.multiselect("Operators", ["+", "-", "*", "/"], default=["+", "-", "*", "/"])
        force = st.checkbox("Recompute jobs that exist (force)")
        submitted = st.form_submit_button("Queue")
    if submitted:
        queue(model, checkpoints, int(lo), int(hi), int(pairs), ops, force)
    st.subheader("Progress")
    jobs_panel()


def queue(model, checkpoints, lo, hi, pairs, ops, force) -> None:
    from catalog.config import MeasureConfig
    from jobs.enqueue import EnqueueError, enqueue

    try:
        config = MeasureConfig(operators=tuple(ops), operand_lo=lo, operand_hi=hi,
                               pairs_per_op=pairs)
        done = enqueue(data.database_url(), model.strip(), checkpoints.strip() or None, config,
                       force=force)
    except (EnqueueError, ValueError) as exc:
        st.error(str(exc))
        return
    except Exception as exc:  # broker unreachable and the like
        st.error(f"Could not queue: {type(exc).__name__}: {exc}")
        return
    stored = sum(j.stored for j in done)
    new = sum(j.created for j in done) - stored
    st.success(f"{new} job(s) queued, {len(done) - new - stored} existed already, {stored} "
               "already in the catalog: "
               + ", ".join(f"#{j.job_id} (step {j.step})" for j in done))
    data.jobs.clear()
