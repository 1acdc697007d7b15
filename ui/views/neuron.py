"""One neuron: grids (K and KV maps), logit lens, heuristic matches, evolution.

The URL carries the neuron (model_id, checkpoint_id, config_id, layer, neuron), so a
page can be shared.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from catalog.core.arith import OPERATORS
from reports import plots
from ui import data
from ui.views.common import neuron_link, query_ids, require_catalog

KEYS = ("model_id", "checkpoint_id", "config_id", "layer", "neuron")

# (column of data.neuron_ops, the row's name, what it means): the page's first table, one
# row per fact and one column per operator, so that it fits any width
FACTS = [
    ("effect", "effect (ranking statistic)",
     "what ranks neurons (default: 10%-trimmed mean, log space)"),
    ("rank", "rank in the layer", "0 = the largest |effect| of this layer for the operator"),
    ("is_exact", "exact patching", "yes: exact patching; no: attribution (first order)"),
    ("effect_trimmed", "trimmed mean (log space)", "log-space effect, 10%-trimmed mean"),
    ("effect_median", "median (log space)", "log-space effect, median over pairs"),
    ("effect_log", "mean (log space)", "log-space effect, mean over pairs"),
    ("moved_share", "pairs moved", "share of pairs whose log-space effect exceeds 1e-3"),
    ("effect_exact", "paper's mean effect", "a ratio of probabilities: one odd pair can "
     "swamp it"),
    ("effect_attr", "attribution (log space)", "attribution's mean: not the paper's scale"),
    ("max_act", "max activation", "over the operator's prompts"),
    ("mean_act", "mean activation", "over the operator's prompts"),
    ("density", "active share", "share of the operator's prompts with activation > 0"),
    ("constant", "constant map", "yes: one activation on every prompt: never labelled"),
    ("best_heuristic", "best heuristic", "its most specific label, else its highest score"),
    ("best_score", "best score", "share of its cells among the neuron's top-k cells"),
    ("best_bottom", "from the bottom cells", "yes: scored on the most negative cells"),
    ("labelled", "labelled", "yes: the best heuristic passes the label rule"),
    ("kv_fit_operands", "operands explain (held out)", "R^2 of f(op1) + g(op2) on the KV map"),
    ("kv_fit_joint", "with the result (held out)", "operands + this operator's result (R^2)"),
    ("kv_fit_other_op", "best rival", "another op's result (order-free), max or min"),
    ("kv_fit_other", "with the rival (held out)", "operands + the best rival (R^2)"),
    ("kv_result_over_rival", "result over rival", "> 0: result fits better; else no result label"),
]


def _fact(value) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def facts_table(ops: pd.DataFrame) -> pd.DataFrame:
    """``data.neuron_ops`` turned: one row per fact, one column per operator, and what the
    fact means."""
    out = pd.DataFrame({"fact": [name for _, name, _ in FACTS]})
    order = {op: i for i, op in enumerate(OPERATORS)}
    ops = ops.sort_values("op", key=lambda col: col.map(lambda o: order.get(o, len(order))))
    for _, row in ops.iterrows():
        out[str(row["op"])] = [_fact(row[col].item() if hasattr(row[col], "item")
                                     else row[col]) for col, _, _ in FACTS]
    out["what it means"] = [why for *_, why in FACTS]
    return out


def no_effect_note(ops: pd.DataFrame, patching: dict) -> str | None:
    """Why some operators have no effects ("—"), where that is so: no pairs to patch."""
    missing = [str(op) for op, eff in zip(ops["op"], ops["effect"], strict=True)
               if eff is None or pd.isna(eff)]
    if not missing:
        return None
    no_pairs = [op for op in missing if (patching.get(op) or {}).get("n_pairs") == 0]
    if no_pairs:
        return (f"No patching effect for {', '.join(no_pairs)}: effects are measured on pairs "
                "of prompts the model answers correctly, and at this checkpoint it answers "
                "none (0 pairs). With no effects, every neuron ties and ranks follow the "
                "neuron index.")
    return (f"No patching effect for {', '.join(missing)}: this measurement config did not "
            "patch it (see its patching setting).")


SPECTRUM_AXES = (("op1", "op1"), ("op2", "op2"), ("result", "result"),
                 ("kv", "result, KV map"))


def spectrum_table(spec: pd.DataFrame) -> pd.DataFrame:
    """``data.spectrum`` turned: one row per operator and axis, the dominant period with
    its share, whether it beats the null, and the fits (docs/method.md section 11)."""
    order = {op: i for i, op in enumerate(OPERATORS)}
    spec = spec.sort_values("op", key=lambda col: col.map(lambda o: order.get(o, len(order))))
    rows = []
    for _, r in spec.iterrows():
        for x, name in SPECTRUM_AXES:
            period = r[f"{x}_period"]
            if period is None or pd.isna(period):
                continue
            rows.append({"operator": str(r["op"]), "axis": name, "period": int(period),
                         "share": float(r[f"{x}_share"]),
                         "periodic": bool(r[f"{x}_periodic"]),
                         "fit R^2": (float(r[f"{x}_fit"]) if x != "kv" else None),
                         "linear share": (float(r[f"{x}_linear"]) if x != "kv" else None),
                         "helix R^2": float(r["helix_r2"]) if x == "result" else None})
    return pd.DataFrame(rows, columns=["operator", "axis", "period", "share", "periodic",
                                       "fit R^2", "linear share", "helix R^2"])


def _params() -> dict | str | None:
    """The page's neuron: ids from a stable link (model, step, config, layer, neuron) or an
    old one (ids; rewritten to the stable form); a message when the link names a
    checkpoint this catalog does not hold."""
    qp = st.query_params
    try:
        layer, neuron = int(qp["layer"]), int(qp["neuron"])
    except (KeyError, ValueError):
        return None
    ids = query_ids(qp)
    if not isinstance(ids, tuple):
        return ids
    return dict(zip(KEYS, (*ids, layer, neuron), strict=True))


def _sketch_banner(p: dict, sketched: list[str], grids: dict) -> None:
    """Say which grids are sketches, and offer to compute the full ones."""
    block = max(g.block for g in grids.values() if g is not None and g.sketch)
    st.info(f"Showing a sketch for {', '.join(sketched)}: this neuron is outside the layer's "
            f"top set stored at full resolution, so each cell shows the mean of its "
            f"{block}x{block}-cell block; the row and column means below are per operand. "
            "Computing the full grid queues a job for this neuron's layer (a worker must "
            "be running).")
    if st.button("Compute full grid", key="full-grid"):
        from catalog.config import ScienceConfig
        from jobs.enqueue import EnqueueError, enqueue_full_grid

        name, step, config = data.job_request(p["model_id"], p["checkpoint_id"],
                                              p["config_id"])
        try:
            j = enqueue_full_grid(data.database_url(), name, step,
                                  ScienceConfig.from_dict(config), p["layer"], [p["neuron"]])
        except (EnqueueError, ValueError) as exc:
            st.error(str(exc))
            return
        except Exception as exc:  # broker unreachable and the like
            st.error(f"Could not queue: {type(exc).__name__}: {exc}")
            return
        st.success(f"Full-grid job #{j.job_id}: {j.note}. Reload this page once it is done "
                   "(Jobs page).")
        data.jobs.clear()


def _where(p: dict) -> str:
    """Which model, checkpoint and measurement the page shows, in one line."""
    from schema.jobs import at_checkpoint

    name, step, config = data.job_request(p["model_id"], p["checkpoint_id"], p["config_id"])
    ops = "".join(config.get("operators", ()))
    shots = config.get("shots", 0)
    return (f"{at_checkpoint(name, step)} · measurement config #{p['config_id']}: operators "
            f"{ops}, operands [{config.get('operand_lo', 0)}, {config.get('operand_hi')}), "
            f"{shots} solved example(s), {config.get('pairs_per_op')} pairs, label rule "
            f"{config.get('label_rule', 'significant')}, dtype {config.get('dtype', 'float32')}")


def _explain_a_cell(p: dict, layout: pd.DataFrame) -> None:
    """A cell of the grids, as a link to the Prompt page with that prompt."""
    from ui.views.prompt import prompt_link

    with st.expander("Explain one prompt of these grids"):
        c1, c2, c3 = st.columns(3)
        op = c1.selectbox("operator", list(layout.index), key="cell-op")
        lo = int(layout.lo[op])
        a = c2.number_input("op1", min_value=lo, value=lo, step=1, key="cell-a")
        b = c3.number_input("op2", min_value=lo, value=lo, step=1, key="cell-b")
        prompt = f"{int(a)}{op}{int(b)}="
        st.markdown(f"[Explain {prompt} on the Prompt page]"
                    f"({prompt_link(p['model_id'], p['checkpoint_id'], p['config_id'], prompt)})"
                    ": which neurons carry its answer, with their labels, and this neuron among "
                    "them.")


def render() -> None:
    st.title("Neuron")
    if not require_catalog():
        return
    p = _params()
    if p is None:
        st.info("Open a neuron from the search page, or give model, step (or final), layer "
                "and neuron in the URL (and config, a prefix of its hash, where the model "
                "was measured under several).")
        return
    if isinstance(p, str):
        st.warning(f"The link names a neuron this catalog cannot show: {p}.")
        return
    ops = data.neuron_ops(*p.values())
    if ops.empty:
        st.warning(f"No stored neuron {p['neuron']} in layer {p['layer']} for these ids.")
        return
    st.subheader(f"Layer {p['layer']}, neuron {p['neuron']}")
    st.caption(_where(p))
    facts = facts_table(ops)
    # every fact in view: at the default height the table showed 10 of its 17 rows, the
    # best heuristic and whether it is a label behind an inner scroll
    st.dataframe(facts, hide_index=True, width="stretch", height=35 * (len(facts) + 1) + 3)
    note = no_effect_note(ops, data.layer_patching(p["checkpoint_id"], p["config_id"],
                                                   p["layer"]))
    if note:
        st.info(note)
    layout = data.layout(p["config_id"]).set_index("op")

    _k_maps(p, layout)
    _kv_map(p, layout)

    _explain_a_cell(p, layout)

    _lens_and_spectrum(p)
    _matches(p)
    _counterparts(p)

    _evolution(p, layout)


def _k_maps(p: dict, layout: pd.DataFrame) -> None:
    """The neuron's stored K maps, one per operator (block means where sketched)."""
    st.markdown("#### Activation grids (K map)")
    grids = {op: data.stored_grid(*p.values(), op=op) for op in layout.index}
    sketched = [op for op, g in grids.items() if g is not None and g.sketch]
    if sketched:
        _sketch_banner(p, sketched, grids)
    cols = st.columns(2)
    for i, (op, g) in enumerate(grids.items()):
        if g is not None:
            title = f"K map, {op}" + (f" (sketch: {g.block}x{g.block}-cell block means)"
                                      if g.sketch else "")
            cols[i % 2].plotly_chart(plots.heatmap(g.values, int(layout.lo[op]), title),
                                     key=f"k{op}")
            if g.sketch and g.row_means is not None and g.col_means is not None:
                cols[i % 2].plotly_chart(plots.profiles(g.row_means, g.col_means,
                                                        int(layout.lo[op]), op),
                                         key=f"p{op}")


def _kv_map(p: dict, layout: pd.DataFrame) -> None:
    """The KV map of the operator chosen (or the one the link names)."""
    st.markdown("#### Direct effect on the answer (KV map)")
    kv_ops = list(layout.index)
    linked = st.query_params.get("op")  # a link may name the operator it was made for
    kv_op = st.radio("Operator", kv_ops, horizontal=True, key="kv-op",
                     index=kv_ops.index(linked) if linked in kv_ops else 0)
    g = data.stored_grid(*p.values(), op=kv_op, kv=True)
    if g is not None:
        title = f"KV map, {kv_op}" + (" (sketch: block means times each cell's lens value)"
                                      if g.sketch else "")
        st.plotly_chart(plots.heatmap(g.values, int(layout.lo[kv_op]), title,
                                      diverging=True, unit="activation x lens"), key="kv")


def _lens_and_spectrum(p: dict) -> None:
    """The logit lens and the periodic structure, where stored."""
    lens = data.lens(*p.values())
    if lens:
        st.markdown("#### Logit lens")
        st.plotly_chart(plots.lens_line(lens["numbers"]), key="lens")
        c1, c2 = st.columns(2)
        c1.dataframe(pd.DataFrame({"promoted": lens["top_tokens"], "value": lens["top_values"]}),
                     hide_index=True)
        c2.dataframe(pd.DataFrame({"suppressed": lens["bottom_tokens"],
                                   "value": lens["bottom_values"]}), hide_index=True)

    spec = data.spectrum(*p.values())
    if not spec.empty:
        st.markdown("#### Periodic structure")
        st.caption("Per axis, the period whose cosine and sine explain most of the map's "
                   "profile along that number, and that share; periodic: it beats the null "
                   "of the other operands' effects (p = 0.01) and a cubic; fit R^2: a line "
                   "and the three largest periods over the map's cells; linear share: the "
                   "magnitude part; helix R^2: periods 2, 5, 10 and 100 of the result "
                   "(docs/method.md section 11).")
        st.dataframe(spectrum_table(spec), hide_index=True, width="stretch",
                     column_config={c: st.column_config.NumberColumn(format="%.2f")
                                    for c in ("share", "fit R^2", "linear share",
                                              "helix R^2")})


def _matches(p: dict) -> None:
    """The heuristic scores stored for the neuron."""
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


def _evolution(p: dict, layout: pd.DataFrame) -> None:
    """The neuron across training: effect and best score per step, grids at chosen steps."""
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
        at = {step: data.grid(p["model_id"], int(ev[ev.step == step].checkpoint_id.iloc[0]),
                              p["config_id"], p["layer"], p["neuron"], op=op)
              for step in chosen}
        shared = plots.shared_range(list(at.values()))  # one colour scale across steps
        for col, step in zip(cols, chosen, strict=True):
            if at[step] is not None:
                col.plotly_chart(plots.heatmap(at[step], int(layout.lo[op]), f"step {step}",
                                               zrange=shared),
                                 key=f"ev-{step}")
        st.caption("One colour scale for the steps shown (activation of the neuron).")


def _counterparts(p: dict) -> None:
    """The neuron's counterparts in other checkpoints (``ncat counterparts``), each linked
    to its neuron page; nothing where it was never matched."""
    cp = data.counterparts(p["checkpoint_id"], p["config_id"], p["layer"], p["neuron"])
    if cp.empty:
        return
    st.markdown("#### Counterparts in other checkpoints")
    first = cp.iloc[0]
    st.caption("Its best match in each checkpoint it was matched in (`ncat counterparts`): "
               "the mean over operators of the correlation of the two neurons' activations "
               "on the grid; a counterpart where that passes the null's threshold, the "
               f"{1 - float(first.level):.0%} quantile of best similarities in unrelated "
               f"models ({first.null_models}).")
    table = pd.DataFrame([_counterpart_row(p, r) for r in cp.itertuples()])
    st.dataframe(table, hide_index=True, width="stretch", column_config={
        "best match": st.column_config.LinkColumn(display_text="open"),
        "similarity": st.column_config.NumberColumn(format="%.3f"),
        "threshold": st.column_config.NumberColumn(format="%.3f")})


def _counterpart_row(p: dict, r) -> dict:
    def named(layer, neuron) -> str:
        return f"L{int(layer)} N{int(neuron)}"

    step = "final" if r.other_step != r.other_step else int(r.other_step)
    one = "" if r.one_to_one_layer != r.one_to_one_layer else (
        f"{named(r.one_to_one_layer, r.one_to_one_neuron)} ({r.one_to_one_similarity:.2f})")
    return {"checkpoint": f"{r.other_model} step {step}",
            "best match": neuron_link(r.other_model_id, r.to_checkpoint_id, p["config_id"],
                                      int(r.best_layer), int(r.best_neuron)),
            "neuron": named(r.best_layer, r.best_neuron), "similarity": r.best_similarity,
            "threshold": r.null_threshold, "counterpart": bool(r.has_counterpart),
            "one-to-one": one}
