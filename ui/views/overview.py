"""Overview: models, checkpoints (accuracy, faithfulness), jobs with live progress."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from catalog.sources.base import transformers_check
from reports import plots
from schema.jobs import ACTIVE, at_checkpoint
from ui import data
from ui.views.common import EMPTY, reachable


def render() -> None:
    st.title("Arithmetic neuron catalog")
    if not reachable():
        return
    models = data.models()
    if models.empty:
        st.info(EMPTY)
    for model in models.itertuples():
        st.subheader(f"{model.name}")
        numbers = (f"single-token numbers up to {model.number_limit}" if not model.digit_level
                   else "digit-level tokenizer: result heuristics are about the full result, "
                        "KV maps and patching about its first digit (the answer token)")
        st.caption(f"{model.source} model, {model.n_layers} layers x {model.d_mlp} neurons, "
                   f"{numbers}")
        cks = data.checkpoints(int(model.id))
        checked = cks.transformers_nats.dropna() if "transformers_nats" in cks else cks[:0]
        st.caption("Loads: " + transformers_check(float(checked.max()) if len(checked)
                                                  else None)
                   + (f" (the largest over {checked.size} checkpoint rows)"
                      if len(checked) > 1 else ""))
        table, faith_k = checkpoint_table(cks, data.headline_faithfulness(int(model.id)))
        # one row per checkpoint, config and operator, the last checkpoints first: every
        # column fits the page (one column per operator and measure was cut off at the
        # right), and two configs of one step are told apart
        st.dataframe(table, hide_index=True, width="stretch",
                     height=min(36 * (len(table) + 1) + 3, 36 * 21 + 3))
        notes = ["duplicate of: a checkpoint whose weights equal an earlier one's (same hash) "
                 "is not measured again; its numbers are that step's"]
        configs = data.configs(int(model.id))
        if len(configs) > 1:
            notes.append("config: " + "; ".join(
                f"{c.id} = {c.operators} on [{c.operand_lo}, {c.operand_hi}), "
                f"{c.shots or 0} shots, labels '{c.label_rule}'" for c in configs.itertuples()))
        if faith_k is not None:
            notes.append(f"faithfulness (k={faith_k}): how much of the answer (the "
                         "ratio of the means of the paper's normalised logit over the "
                         "prompts, 0 = the empty circuit, 1 = the model; the paper's mean of "
                         "per-prompt ratios is on the Circuits page) a "
                         f"circuit keeps with the top {faith_k} neurons of each late layer "
                         "and the rest mean-ablated (docs/method.md section 6), ± its "
                         "standard error, over n correctly answered prompts; under "
                         f"{FEW_PROMPTS} prompts it says little (a model that answers almost "
                         "nothing); blank where the checkpoint has no summary")
        st.caption("; ".join(notes))
        if any(isinstance(e, list) and e for e in cks.get("enrichment", [])):
            st.caption("labelled top / random: share of each layer's top set (by rank) that "
                       "carries a heuristic label, beside a random set of as many other "
                       "neurons of the same layer; the report gives intervals and the exact "
                       "test (docs/method.md section 7)")
        # through training: checkpoints with a step (a model's final weights have none)
        periodic = data.periodic_through_training(int(model.id)).dropna(subset=["step"])
        if not periodic.empty:
            config_id = periodic.groupby("config_id").step.nunique().idxmax()
            st.plotly_chart(plots.periodic_lines(
                periodic[periodic.config_id == config_id],
                f"Periodic maps through training (config {config_id})"),
                key=f"periodic-{model.id}")
            st.caption("Share of live maps (every layer and operator) whose dominant period "
                       "on the axis beats the null of the other operands' effects; about 1% "
                       "by chance (docs/method.md section 11, docs/periodic.md)")
        report_button(model.name, cks)
    st.subheader("Jobs")
    jobs_panel()


@st.fragment(run_every=3)
def jobs_panel() -> None:
    jobs = data.jobs()
    if jobs.empty:
        st.caption("No jobs yet. Queue one on the Jobs page or with `ncat enqueue`.")
        return
    waiting = jobs.status.isin([str(s) for s in ACTIVE]).any()
    if waiting and data.workers_listening() == 0:
        st.warning("No worker is listening on this catalog's queue, so queued jobs wait: "
                   "start one with `ncat worker` (the demo stops its own worker before it "
                   "serves the explorer).")
    for job in jobs.itertuples():
        frac = job.done / job.layers if job.layers else 0.0
        text = (f"job {job.id}: {at_checkpoint(job.model, job.step)}: {job.status} "
                f"({job.done}/{job.layers})")
        if job.error:
            text += f", layer {job.failed_layer}: {job.error}"
        st.progress(frac, text=text)


FEW_PROMPTS = 20


def _fmt(value, se=None) -> str:
    if value is None or value != value:
        return ""
    return f"{value:.3f}" if se is None or se != se else f"{value:.3f} ± {se:.3f}"


def checkpoint_table(cks: pd.DataFrame, faith: pd.DataFrame) -> tuple[pd.DataFrame, int | None]:
    """The overview's table: a row per checkpoint, config and operator (the last
    checkpoints first) with the accuracy, the headline faithfulness with its standard
    error and prompt count, and the labelled shares of the top and random sets; and the
    circuit size the faithfulness column shows."""
    points = {(int(r.checkpoint_id), int(r.config_id), r.op, int(r.k)): r
              for r in faith.itertuples()}
    rows, faith_k = [], None
    order = cks.sort_values(["step", "config_id"], ascending=[False, True],
                            na_position="first", kind="stable") if len(cks) else cks
    for ck in order.itertuples():
        if not isinstance(ck.accuracy, dict):
            rows.append({**_checkpoint_cells(ck), "op": ""})
            continue
        shares = _overall_shares(ck.enrichment)
        for op, acc in ck.accuracy.items():
            row = {**_checkpoint_cells(ck), "op": op, "accuracy": acc}
            k = _faithfulness_cells(row, ck, op, points)
            faith_k = faith_k if k is None else k
            row.update(shares.get(op, {}))
            rows.append(row)
    table = pd.DataFrame(rows)
    if "n prompts" in table:
        table["n prompts"] = table["n prompts"].astype("Int64")
    return table, faith_k


def _overall_shares(enrichment) -> dict[str, dict[str, str]]:
    """op -> the labelled shares of the top and random sets over every layer and family,
    as the table's cell (none where the checkpoint has no enrichment)."""
    rows = enrichment if isinstance(enrichment, list) else []
    return {e["op"]: {"labelled top / random": f"{e['share_top']:.2f} / "
                                               f"{e['share_random']:.2f}"}
            for e in rows if e["layer"] == "all" and e["family"] == "any"}


def _checkpoint_cells(ck) -> dict:
    """A checkpoint's own columns of the overview's table."""
    dup = ck.duplicate_of_step
    return {"step": ck.step, "config": "" if ck.config_id != ck.config_id
            else int(ck.config_id), "weights": ck.weights,
            "duplicate of": "" if dup is None or dup != dup else f"step {int(dup)}"}


def _faithfulness_cells(row: dict, ck, op: str, points: dict) -> int | None:
    """The headline faithfulness of ``op`` at the middle of its curve, with its standard
    error and prompt count, into ``row``; the circuit size shown (None: no curve)."""
    curve = (ck.faithfulness or {}).get(op) or []
    if not curve:
        return None
    k, f = curve[len(curve) // 2]
    pt = points.get((int(ck.checkpoint_id), int(ck.config_id), op, int(k)))
    row["faithfulness"] = _fmt(f, None if pt is None else pt.ratio_of_means_se)
    row["n prompts"] = None if pt is None else int(pt.n)
    if pt is not None and pt.n < FEW_PROMPTS and row["faithfulness"]:
        row["faithfulness"] += " (few prompts)"
    return k


def report_button(model: str, cks: pd.DataFrame) -> None:
    """The `ncat report` page of a checkpoint, built on demand and offered for download."""
    steps = [s for s in cks["step"].tolist()] if not cks.empty else []
    if not steps:
        return
    c1, c2 = st.columns([1, 3])
    step = c1.selectbox("report of step", steps, index=len(steps) - 1, key=f"rep-{model}",
                        format_func=lambda s: "the only checkpoint" if s is None or s != s
                        else str(int(s)))
    if c2.button("Build report (HTML, beside the paper's claims)", key=f"repb-{model}"):
        import tempfile
        from pathlib import Path

        from reports.report import report
        from schema.report_reads import ReportError

        try:
            with tempfile.TemporaryDirectory() as tmp:
                html_path, md_path = report(
                    data.database_url(), model,
                    None if step is None or step != step else int(step), Path(tmp))
                page, md = html_path.read_text(), md_path.read_text()
        except ReportError as exc:
            st.warning(str(exc))
            return
        st.download_button("Download report.html", page, file_name="report.html",
                           mime="text/html", key=f"repd-{model}")
        with st.expander("Summary (Markdown)"):
            st.markdown(md)
