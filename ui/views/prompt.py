"""One prompt explained (catalog.explain.prompt): which labelled neurons carry its answer.

The URL may carry the checkpoint and the prompt (``/prompt?model_id=..&checkpoint_id=..
&config_id=..&prompt=21%2B17%3D``; the neuron page links here from its grids); otherwise
the sidebar picks them. Models up to ``NCAT_EXPLAIN_MAX_NEURONS`` MLP neurons are
explained in the explorer's process (the built-in model: well under a second a
checkpoint); larger ones show what ``ncat explain ... --store`` stored for the prompt,
with the command to run.
"""

from __future__ import annotations

import threading

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from catalog.config.settings import get_settings
from reports import prompts as report_prompts
from reports.plots import family_colors
from ui import data
from ui.views.common import (
    link,
    neuron_link,
    pick_model_checkpoint_config,
    query_ids,
    require_catalog,
)

OTHER_COLORS = {"labelled, does not hold here": "#bbbbbb", "unlabelled": "#7f7f7f",
                "heads": "#17becf"}


def prompt_link(model_id, checkpoint_id, config_id, prompt: str) -> str:
    return link("prompt", model_id, checkpoint_id, config_id, prompt=prompt)


def _picked() -> tuple[int, int, int]:
    ids = query_ids(st.query_params)
    if isinstance(ids, str):
        st.warning(f"The link's checkpoint is not here: {ids}. Pick one in the sidebar.")
    if not isinstance(ids, tuple):
        model, ck, config_id = pick_model_checkpoint_config("prompt")
        return int(model.id), int(ck.checkpoint_id), config_id
    name, step, _ = data.job_request(*ids)
    st.caption(f"{name} · {'final weights' if step is None else f'step {step}'} · "
               f"measurement config #{ids[2]} (from the link)")
    return ids  # type: ignore[return-value]


@st.cache_resource(max_entries=4, show_spinner="loading the model")
def _model(name: str, step: int | None, dtype: str):
    """(the loaded model, the lock every use of it holds). The model is shared by every
    session of the explorer, and an explanation attaches hooks to it for the duration of a
    forward; Streamlit starts a rerun while the run it replaces may still be computing
    (fast reruns), so two explanations on one model would see each other's hooks (a
    knockout's zeroed neurons in another prompt's decomposition: seen in the browser test)."""
    import torch

    from catalog.sources import load_model

    return load_model(name, step, dtype=getattr(torch, dtype), progress=False), \
        threading.Lock()


@st.cache_data(max_entries=64, show_spinner="explaining")
def explained(model_id: int, checkpoint_id: int, config_id: int, prompt: str,
              seeds: int) -> dict:
    """The explanation as a dict (``Explanation.to_dict``), with the catalog's labels."""
    from catalog.config import ScienceConfig
    from catalog.explain.holds import catalog_context
    from catalog.explain.prompt import explain, labels_from_rows, parse

    name, step, stored = data.job_request(model_id, checkpoint_id, config_id)
    config = ScienceConfig.from_dict(stored)
    _, op, _ = parse(prompt, config)
    got = data.prompt_labels(checkpoint_id, config_id, op)
    labels = labels_from_rows(got.rows)
    lm, lock = _model(name, step, str(config.torch_dtype()).removeprefix("torch."))
    with lock:
        e = explain(lm.model, lm.tokenizer, prompt, config, labels=labels, top=15,
                    seeds=seeds, **catalog_context(got, lm.model, config))
    return e.to_dict()


def _group(row: dict) -> str:
    holds = [x["family"] for x in row["labels"] if x["holds"]]
    if holds:
        return holds[0]
    return "labelled, does not hold here" if row["labels"] else "unlabelled"


def contributions_chart(e: dict) -> go.Figure:
    """The top neurons' terms of T grouped by the family of the first label that holds
    here (else "labelled, does not hold here" / "unlabelled"), each neuron its own block;
    the heads' total beside them."""
    fig = go.Figure()
    for row in e["toward"] + e["away"]:
        group = _group(row)
        labs = "; ".join(("✓ " if x["holds"] else "✗ ") + x["label"]
                         + f" ({x.get('side', 'high')})" for x in row["labels"])
        fig.add_bar(x=[group], y=[row["contribution"]], showlegend=False,
                    marker_color=family_colors().get(group, OTHER_COLORS.get(group, "#444")),
                    hovertemplate=(f"L{row['layer']} N{row['neuron']}: "
                                   f"{row['contribution']:+.3f} ({row['share']:.1%} of T)<br>"
                                   f"{labs or 'no label'}<extra></extra>"))
    fig.add_bar(x=["heads"], y=[e["heads_total"]], showlegend=False,
                marker_color=OTHER_COLORS["heads"],
                hovertemplate=f"every head: {e['heads_total']:+.3f}<extra></extra>")
    fig.update_layout(barmode="relative", height=380, margin=dict(l=40, r=10, t=50, b=40),
                      title=f"Contributions to T = {e['target']:.2f}, by heuristic family",
                      yaxis_title="term of T (logit difference)")
    return fig


CONTROL_NAMES = {"unlabelled": "unlabelled, chosen the same way",
                 "not holding": "labelled, set excludes the prompt, chosen the same way",
                 "same ranking": "same ranking, labels ignored",
                 "random": "random neurons of the same layers"}


def knockout_chart(ko: dict) -> go.Figure:
    """The answer's probability clean, after the knockout, and after each control (the
    draws' mean ± its standard error); a stored explanation from before the controls
    has the random one only."""
    x = ["clean", f"{len(ko['neurons'])} of its labelled neurons zeroed"]
    y = [ko["p_clean"], ko["p_knocked"]]
    err = [0.0, 0.0]
    controls = ko.get("controls") or {"random": {"p": ko["p_random"],
                                                 "p_mean": ko["p_random_mean"],
                                                 "p_se": ko.get("p_random_se")}}
    for name, c in controls.items():
        x.append(f"{CONTROL_NAMES.get(name, name)} ({len(c['p'])} draw"
                 f"{'s' if len(c['p']) != 1 else ''})")
        y.append(c["p_mean"])
        se = c.get("p_se")
        err.append(se if se is not None and se == se else 0.0)
    fig = go.Figure(go.Bar(x=x, y=y, error_y=dict(type="data", array=err),
                           marker_color=["#1f77b4", "#d62728"] + ["#7f7f7f"] * (len(x) - 2)))
    fig.update_layout(title="Knockout: the answer's probability", height=320,
                      yaxis=dict(range=[0, 1]), margin=dict(l=40, r=10, t=50, b=40))
    return fig


def nil_here(ko: dict) -> bool:
    """On this prompt, some matched control's p is within two standard errors of its
    draws of the knockout's (or below it)."""
    adds = ko.get("label_adds") or {}
    controls = ko.get("controls") or {}
    return any(v <= 2 * (controls.get(k, {}).get("p_se") or 0.0) for k, v in adds.items())


def knockout_caption(ko: dict) -> str:
    """What the knockout and its controls say, and what the label adds (or that it adds
    nothing: a matched control hurting as much as the labelled neurons)."""
    text = (f"Zeroing {len(ko['neurons'])} labelled neurons whose label holds (per layer at "
            "most the config's knockout_neurons, those ranked first on this prompt by "
            f"{ko.get('ranking', 'direct')} effect; at the last position): the answer is "
            f"{'still' if ko['top_after'] else 'no longer'} the top token; as many random "
            f"neurons keep it on top in {sum(ko['top_random'])} of {len(ko['top_random'])} "
            f"draws (Wilson 95% [{ko['top_random_ci'][0]:.2f}, {ko['top_random_ci'][1]:.2f}]).")
    adds = ko.get("label_adds") or {}
    if adds:
        text += (" What the label adds (a matched control's p minus the knockout's; the "
                 "controls are chosen the same way, the label aside): " + ", ".join(
                     f"against {CONTROL_NAMES[k]} {v:+.3f}" for k, v in adds.items())
                 + (". The label adds nothing here: a matched control hurts the answer as "
                    "much, within two standard errors of its draws." if nil_here(ko) else "."))
    return text


def across_chart(rows: pd.DataFrame) -> go.Figure:
    fig = go.Figure()
    x = rows.step.clip(lower=0.5)  # step 0 on a log axis
    fig.add_scatter(x=x, y=rows.p_answer, name="p(answer)", mode="lines+markers")
    fig.add_scatter(x=x, y=rows.share_holds, name="share of T, labelled and holding",
                    mode="lines+markers")
    fig.add_scatter(x=x, y=rows.share_heads, name="share of T, heads", mode="lines+markers")
    fig.update_layout(title="The same prompt across training", height=340,
                      xaxis=dict(type="log", title="step (0 drawn at 0.5)"),
                      margin=dict(l=40, r=10, t=50, b=40))
    return fig


def _across(model_id: int, config_id: int, prompt: str, small: bool) -> pd.DataFrame:
    """One row per catalogued checkpoint of the model under the config: computed here for
    a small model, else the stored explanations."""
    if not small:
        return pd.DataFrame(data.stored_prompt(model_id, config_id, prompt))
    cks = data.checkpoints(model_id)
    cks = cks[(cks.config_id == config_id) & cks.step.notna()]
    rows = []
    for ck in cks.itertuples():
        e = explained(model_id, int(ck.checkpoint_id), config_id, prompt, 0)
        rows.append({"step": int(ck.step), "correct": e["correct"], "p_answer": e["p_answer"],
                     "target": e["target"],
                     "share_holds": e["shares"]["labelled, heuristic holds"],
                     "share_heads": e["shares"]["heads"], "neurons_80": e["n_for"]["80%"]})
    return pd.DataFrame(rows)


def _default_prompt(config_id: int, model_id: int, checkpoint_id: int) -> str:
    from catalog.config import ScienceConfig

    _, _, stored = data.job_request(model_id, checkpoint_id, config_id)
    c = ScienceConfig.from_dict(stored)
    lo, hi = c.operand_lo, c.operand_hi
    a, b = (21, 17) if lo <= 17 and hi > 21 else (lo + (hi - lo) // 2, lo + (hi - lo) // 3)
    return f"{a}{c.operators[0]}{b}="


def _neuron_lines(e: dict, ids: tuple[int, int, int], rows: list[dict]) -> list[str]:
    out = []
    for r in rows:
        labs = "; ".join(("✓ " if x["holds"] else "✗ ") + x["label"] for x in r["labels"])
        href = neuron_link(*ids, r['layer'], r['neuron'], e.get("op"))
        out.append(f"- [L{r['layer']} N{r['neuron']}]({href})"
                   f" {r['contribution']:+.3f} ({r['share']:.1%}), act {r['activation']:.2f}"
                   + (f" (typically {r['typical']:.2f})" if r["typical"] is not None else "")
                   + f": {labs or 'no label'}; promotes {' '.join(r['promotes'])}")
    return out


def _worker_branch(ids: tuple[int, int, int], model, prompt: str, limit: int
                   ) -> dict | None:
    """A model too large for this process: the prompt's stored explanation if a worker (or
    ``ncat explain --store``) wrote one, else its request's state and the button that
    queues it. None when there is nothing to draw yet."""
    from catalog.config import ScienceConfig
    from catalog.explain.prompt import PromptError, parse
    from jobs.explain_jobs import NotSent, request, resend

    model_id, checkpoint_id, config_id = ids
    name, step, stored_config = data.job_request(*ids)
    try:
        a, op, b = parse(prompt, ScienceConfig.from_dict(stored_config))
    except PromptError as exc:
        st.error(str(exc))
        return None
    text = f"{a}{op}{b}="
    stored, req = data.worker_explanation(checkpoint_id, config_id, text)
    neurons = int(model.n_layers) * int(model.d_mlp)
    where = (f"{model['name']} has {neurons:,} MLP neurons, more than this explorer "
             f"explains in its own process ({limit:,}; NCAT_EXPLAIN_MAX_NEURONS): a worker "
             "explains it (`ncat worker`), or `ncat explain "
             f"{name} '{text}'" + (f" --checkpoint {step}" if step is not None else "")
             + " --store` where the model fits.")
    busy = req is not None and req.status in ("queued", "running")
    if stored is not None and not busy:
        st.caption(where + " Showing the stored explanation.")
        return stored
    st.info(where)
    if req is not None and req.status == "failed":
        st.error(f"The worker could not explain {text}: {req.error}")
    if busy:
        st.warning(f"Request #{req.id}: {req.status} since "
                   f"{(req.started_at or req.created_at):%Y-%m-%d %H:%M:%S} "
                   f"(worker {req.worker or 'not yet'}, started {req.starts} time(s)). "
                   "Refresh to see it when it is done.")
        left, right = st.columns(2)
        if left.button("Refresh", key="prompt-refresh"):
            st.rerun()
        if right.button("Send again", key="prompt-resend",
                        help="send the request's message again (a restarted broker loses "
                             "queued messages); a worker drops a request already done"):
            resend(data.database_url(), req.id)
        return None
    label = "Explain it again on a worker" if stored is not None else "Explain on a worker"
    if st.button(label, key="prompt-queue"):
        try:
            got, _ = request(data.database_url(), model_id=model_id,
                             checkpoint_id=checkpoint_id, config_id=config_id, prompt=text)
        except (PromptError, ValueError) as exc:
            st.error(str(exc))
            return None
        except NotSent as exc:
            st.error(str(exc))
            return None
        st.success(f"Explain request #{got.id} queued.")
        st.rerun()
    return stored


def _label_matters(checkpoint_id: int, config_id: int, op: str) -> None:
    """The checkpoint summary's answer to "does the label matter?" for the operator: what
    the label adds to the knockout and the share of T against matched controls and
    against the labels placed at random, and the steering test, over the summary's
    prompts (the report's tables)."""
    explained = data.summary_explained(checkpoint_id, config_id)
    if not (explained.get(op) or {}).get("knockouts"):
        return
    with st.expander(f"Does the label matter? Over this checkpoint's {op} prompts",
                     expanded=False):
        st.markdown("\n".join(report_prompts.label_adds_tables(explained, [op])))


def render() -> None:
    st.title("Prompt")
    if not require_catalog():
        return
    ids = _picked()
    model_id, checkpoint_id, config_id = ids
    model = data.models().set_index("id").loc[model_id]
    limit = get_settings().ncat_explain_max_neurons
    small = int(model.n_layers) * int(model.d_mlp) <= limit
    prompt = st.text_input("Prompt (a op b =, written under the config's template and "
                           "solved examples, as the catalog measures it)",
                           value=st.query_params.get("prompt")
                           or _default_prompt(config_id, model_id, checkpoint_id),
                           key="prompt-text").strip()
    if not small:
        e = _worker_branch(ids, model, prompt, limit)
        if e is None:
            return
    else:
        from catalog.explain.prompt import PromptError

        try:
            e = explained(model_id, checkpoint_id, config_id, prompt, 5)
        except PromptError as exc:
            st.error(str(exc))
            return
    left, mid, right = st.columns(3)
    left.metric("answer", f"{e['result']}",
                f"model writes {e.get('written') or e['predicted']!r}",
                delta_color="normal" if e["correct"] else "inverse")
    mid.metric("p(answer)", f"{e['p_answer']:.3f}", f"rank {e['rank_answer']} (1 = top)",
               delta_color="off")
    right.metric("labelled neurons that hold carry",
                 f"{e['shares']['labelled, heuristic holds']:.0%} of T",
                 f"{e['n_for']['80%']} neurons for 80%", delta_color="off")
    st.caption(("Correct" if e["correct"] else "Wrong") + ": greedy decoding "
               + ("writes" if e["correct"] else "does not write") + " the whole result. "
               "T is the answer's logit minus the competing numbers' mean, split exactly "
               "over every neuron and head with the norms' scales frozen (direct effects); "
               "shares: " + ", ".join(f"{k} {v:.1%}" for k, v in e["shares"].items())
               + ". Logit lens, the answer's rank by layer: "
               + " ".join(f"L{la}:{rank}" for la, rank, _ in e["lens"]))
    st.plotly_chart(contributions_chart(e), key="prompt-contributions")
    st.subheader("Neurons toward the answer")
    st.markdown("\n".join(_neuron_lines(e, ids, e["toward"])) or "none")
    with st.expander("Neurons away from the answer"):
        st.markdown("\n".join(_neuron_lines(e, ids, e["away"])) or "none")
    ko = e["knockout"]
    if ko is not None:
        st.plotly_chart(knockout_chart(ko), key="prompt-knockout")
        st.caption(knockout_caption(ko))
    else:
        st.caption("No knockout: no labelled neuron's heuristic holds for this prompt.")
    _label_matters(checkpoint_id, config_id, e["op"])
    st.subheader("Across training")
    rows = _across(model_id, config_id, prompt, small=small)
    if len(rows) > 1:
        st.plotly_chart(across_chart(rows), key="prompt-across")
        st.dataframe(rows, hide_index=True)
    else:
        st.caption("One " + ("catalogued checkpoint" if small else "stored explanation")
                   + " of this prompt under this config: nothing to compare.")
