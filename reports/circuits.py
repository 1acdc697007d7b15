"""The report's circuits: component effects, the faithfulness curves of each protocol with
their controls and areas, and warnings where a figure cannot be trusted.

Read from the tables of migration 0019 (component_effect, circuit_summary,
circuit_point) and checkpoint_summary.residual_lens. The paper's figures are set beside
ours: Llama3-8B circuits of about 1.5% of each late layer's neurons reach a faithfulness
of 0.96 on average, on a curve that rises with the circuit's size.
"""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go

from schema.report_reads import CircuitData

PAPER_F = {"+": 0.97, "-": 0.98, "*": 0.90, "/": 0.96}
PAPER_F_AT = "200 neurons per late layer (about 1.5% of 14,336) on Llama3-8B"
# a prompt whose metric moves less than this share of the median prompt's between the
# model and the empty circuit carries a ratio ten times the others' (faithfulness.SMALL)
SMALL = 0.1
# each prompt's terms of the headline ratio of means are clipped to this many median
# denominators (faithfulness.CLIP)
CLIP = 3.0






# ------------------------------------------------------------------ Markdown


def _f(x, digits: int = 2) -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) \
        else f"{x:.{digits}f}"


def _pm(value, se, digits: int = 2) -> str:
    return _f(value, digits) + ("" if se is None else f" ± {_f(se, digits)}")


def _layers(xs: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    if not xs:
        return "none"
    out, start, prev = [], xs[0], xs[0]
    for x in list(xs[1:]) + [None]:
        if x is not None and x == prev + 1:
            prev = x
            continue
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
        if x is not None:
            start = prev = x
    return ", ".join(out)


def warnings(d: CircuitData, s: dict) -> list[str]:
    """What a reader must know before trusting one protocol's curve."""
    found = (_small_denominators(s), _clipped(d, s), _answered_without(s),
             *(_ranking_not_shown(s, metric) for metric in ("nl", "logprob")),
             _falls(d, s))
    return [w for w in found if w]


def _small_denominators(s: dict) -> str | None:
    ld, n = s["baselines"].get("logit_diff", {}), s["n_prompts"]
    if not (n and ld.get("n_small", 0) > 0):
        return None
    return (f"{ld['n_small']} of {n} prompts move their answer's logit difference "
            f"between the model and the empty circuit by less than {SMALL:g} of the "
            "median prompt's: their per-prompt ratios are ten times the others', and "
            "the paper's mean of ratios follows them. The headline is the ratio of "
            "means.")


def _clipped(d: CircuitData, s: dict) -> str | None:
    heavy = [p for p in d.curve(s["op"], s["protocol"], "ranked", "nl") if p.get("n_clipped")]
    if not heavy:
        return None
    worst = max(heavy, key=lambda p: p.get("max_influence") or 0.0)
    return (f"At {len(heavy)} circuit size(s) some prompts' normalised-logit terms "
            f"were clipped to {CLIP:g} median denominators (up to {worst['n_clipped']} "
            f"of {worst['n']} prompts at k = {worst['k']}: a circuit value far out, or "
            "a largest number logit near 0, NL's own denominator). The headline ratio "
            "of means bounds each prompt's influence: there one prompt moves it by at "
            f"most {_f(worst.get('influence_bound'))}, and leaving one out moves it by "
            f"up to {_f(worst.get('max_influence'))}.")


def _answered_without(s: dict) -> str | None:
    lp = s["baselines"].get("logprob", {})
    if not (lp and lp.get("empty") is not None and lp["empty"] > math.log(0.2)):
        return None
    return (f"The empty circuit already gives the answer a mean log-probability of "
            f"{_f(lp['empty'])} (the model: {_f(lp.get('model'))}): the context "
            "answers without the circuit, so a faithfulness near 1 says little.")


def _ranking_not_shown(s: dict, metric: str) -> str | None:
    areas = s["areas"]
    ranked = areas.get("ranked", {}).get(metric, {}).get("ratio_of_means", {})
    rand = areas.get("random", {}).get(metric, {}).get("ratio_of_means", {})
    if ranked.get("cpr") is None or rand.get("cpr") is None:
        return None
    se = math.hypot(ranked.get("cpr_se") or 0.0, rand.get("cpr_se") or 0.0)
    if ranked["cpr"] - rand["cpr"] > 2 * se:
        return None
    return (f"By {metric}, the ranked circuits' area ({_f(ranked['cpr'])}) is not "
            f"above a random circuit's ({_f(rand['cpr'])}) by two standard errors: "
            "the ranking is not shown to matter here.")


def _falls(d: CircuitData, s: dict) -> str | None:
    pts = [p for p in d.curve(s["op"], s["protocol"], "ranked", "nl") if p["mib"]]
    if len(pts) < 2 or pts[0]["ratio_of_means"] is None \
            or pts[-2]["ratio_of_means"] is None:
        return None
    first, last = pts[0], pts[-2]  # the last MIB level keeps every neuron
    se = math.hypot(first["ratio_of_means_se"] or 0.0, last["ratio_of_means_se"] or 0.0)
    if last["ratio_of_means"] < first["ratio_of_means"] - 2 * se:
        return "The curve FALLS as neurons are added (beyond two standard errors)."
    return None


def markdown(d: CircuitData, ops: list[str]) -> list[str]:
    """The circuits sections of the report, as Markdown lines."""
    out = ["", "## Where the answer is computed (the mediation paper: late MLPs at the last "
           "position and a few heads that move the operands there)", ""]
    if not d.components and not d.residual_lens:
        out.append("No component effects stored (config component_positions empty, or no "
                   "summary).")
    for op in ops:
        out += _component_lines(d, op)
    paper = ", ".join(f"{o} {v}" for o, v in PAPER_F.items())
    out += ["", f"## Circuits and faithfulness (the paper: {paper} at {PAPER_F_AT}, rising "
            "with size)", "",
            "F = (m(circuit) - m(empty)) / (m(model) - m(empty)). The paper's statistic is "
            "the mean over prompts of this ratio for the normalised logit m = logit(answer) "
            "/ max logit; beside it, the ratio of the means (robust to small denominators), "
            "the median, and the same ratio for the answer's log-probability. Controls: a "
            "random circuit of the same size, and the reversed ranking. Standard errors "
            "over prompts (the paper's mean) and by bootstrap over prompts (ratios of "
            "means, areas). CPR is the area under the curve over the MIB levels (higher is "
            "better), CMD the area between it and 1 (lower is better)."]
    if not d.summaries:
        out += ["", "No circuits stored (no summary for this checkpoint and config)."]
    for s in d.summaries:
        out += _protocol_section(d, s)
    return out


def _component_lines(d: CircuitData, op: str) -> list[str]:
    """One operator's MLP layers, largest heads and residual lens, where stored."""
    out = []
    if d.components:
        mlp, heads = d.effects(op)
        order = np.argsort(-np.nan_to_num(np.abs(heads), nan=-1).ravel())[:5]
        out.append(f"- `{op}` MLP layers at the last position, log-space effect: "
                   + ", ".join(f"L{la} {_f(v)}" for la, v in enumerate(mlp)))
        out.append(f"- `{op}` largest heads (averaged effect at the last position): "
                   + ", ".join(f"L{i // d.n_heads}H{i % d.n_heads} "
                               f"{_f(heads.ravel()[i])}" for i in order))
    lens = d.residual_lens.get(op)
    if lens:
        out.append(f"- `{op}` residual-stream logit lens, the answer's median rank after "
                   "each layer: " + ", ".join(f"L{la} {int(r)}" for la, r in
                                              enumerate(lens["median_rank"])))
    return out


def _built(d: CircuitData, s: dict) -> str:
    """How one protocol's circuits were built, as a sentence."""
    built = (f"heads kept: {s['n_heads_kept']} of {d.n_layers * d.n_heads or '?'}; "
             f"MLP layers kept whole: {_layers(s['whole'])}; pruned to their top k: "
             f"{_layers(s['pruned'])}")
    if s["late_from"] is not None:
        built += f"; first heuristics layer {s['late_from']} ({s['late_source']})"
    where = "every position" if s["context"] == "all" else "the prompt positions"
    return built + (f"; neurons ranked by {s['ranking']}; replaced by "
                    + ("a counterfactual prompt's activations" if s["population"] is None
                       else f"means over the {s['population']} population")
                    + f" at {where}")


def _protocol_section(d: CircuitData, s: dict) -> list[str]:
    """One operator's protocol: how it was built, its baselines, its curve against the
    controls, its areas and its warnings."""
    b = s["baselines"]
    out = ["", f"### `{s['op']}`, protocol {s['protocol']}", "", _built(d, s) + ".",
           f"{s['n_prompts']} prompt draws ({s['n_unique']} distinct prompts, "
           f"{s['seeds']} seeds).", "",
           "| metric | model | empty circuit | prompts with small denominator |",
           "|---|---|---|---|"]
    for metric in ("nl", "logprob", "logit_diff"):
        m = b.get(metric, {})
        out.append(f"| {metric} | {_f(m.get('model'))} | {_f(m.get('empty'))} | "
                   f"{m.get('n_small', 'n/a')} of {s['n_prompts']} |")
    out += _curve_table(d, s["op"], s["protocol"])
    out += ["", "| areas (MIB levels) | CPR, NL | CMD, NL | CPR, log-prob | CMD, log-prob |",
            "|---|---|---|---|---|"]
    for circuit in ("ranked", "random", "reversed"):
        a = s["areas"].get(circuit, {})
        cells = []
        for metric in ("nl", "logprob"):
            r = a.get(metric, {}).get("ratio_of_means", {})
            cells += [_pm(r.get("cpr"), r.get("cpr_se")), _pm(r.get("cmd"), r.get("cmd_se"))]
        out.append(f"| {circuit} | " + " | ".join(cells) + " |")
    for w in warnings(d, s):
        out += ["", f"> **Warning.** {w}"]
    return out


def _curve_table(d: CircuitData, op: str, protocol: str) -> list[str]:
    """The ranked circuits' faithfulness per size beside the random and reversed ones."""
    out = ["", "| k per layer | share | F (paper: NL mean of ratios) | NL ratio of means | "
           "NL median | log-prob ratio of means | random (NL ratio of means) | "
           "reversed |", "|---|---|---|---|---|---|---|---|"]
    lp = {p["k"]: p for p in d.curve(op, protocol, "ranked", "logprob")}
    rnd = {p["k"]: p for p in d.curve(op, protocol, "random", "nl")}
    rev = {p["k"]: p for p in d.curve(op, protocol, "reversed", "nl")}
    for p in d.curve(op, protocol, "ranked", "nl"):
        k = p["k"]
        ctrl = [(rnd.get(k) or {}), (rev.get(k) or {})]
        lk = lp.get(k, {})
        out.append(f"| {k} | {p['fraction']:.2%} | {_pm(p['mean_ratio'], p['mean_ratio_se'])} "
                   f"| {_pm(p['ratio_of_means'], p['ratio_of_means_se'])} | "
                   f"{_f(p['median_ratio'])} | "
                   f"{_pm(lk.get('ratio_of_means'), lk.get('ratio_of_means_se'))} | "
                   + " | ".join(_pm(c.get("ratio_of_means"), c.get("ratio_of_means_se"))
                                if c else "-" for c in ctrl) + " |")
    return out


# ------------------------------------------------------------------ figures


def figures(d: CircuitData, ops: list[str]) -> list[go.Figure]:
    """Component effects (MLP bars, a layer x head heatmap) and each protocol's curves."""
    figs = []
    if d.components:
        figs.append(mlp_bars(d, ops))
        figs += [head_heatmap(d, op) for op in ops]
    figs += [curve_figure(d, s["op"], s["protocol"]) for s in d.summaries]
    return figs


def mlp_bars(d: CircuitData, ops: list[str]) -> go.Figure:
    """Each whole MLP layer's effect at the last position, a bar group per operator."""
    fig = go.Figure([go.Bar(name=op, x=[f"L{la}" for la in range(d.n_layers)],
                            y=d.effects(op)[0]) for op in ops])
    fig.update_layout(title="Whole-MLP effect at the last position (log-space)",
                      barmode="group", height=320, xaxis_title="layer",
                      yaxis_title="effect")
    return fig


def head_heatmap(d: CircuitData, op: str) -> go.Figure:
    """Every head's effect at the last position, layers down, heads across."""
    fig = go.Figure(go.Heatmap(z=d.effects(op)[1], x=[f"H{h}" for h in range(d.n_heads)],
                               y=[f"L{la}" for la in range(d.n_layers)], colorscale="RdBu",
                               zmid=0, hovertemplate="%{y} %{x}: %{z:.3f}<extra></extra>"))
    fig.update_layout(title=f"{op}: each head's effect at the last position",
                      height=max(300, 18 * d.n_layers))
    fig.update_yaxes(autorange="reversed")
    return fig


def curve_figure(d: CircuitData, op: str, protocol: str, metric: str = "nl") -> go.Figure:
    """One protocol's faithfulness (ratio of means, ± SE) against neurons per pruned layer,
    with the paper's mean of ratios and both controls."""
    fig = go.Figure()
    for circuit, stat, dash in (("ranked", "ratio_of_means", "solid"),
                                ("ranked", "mean_ratio", "dot"),
                                ("random", "ratio_of_means", "dash"),
                                ("reversed", "ratio_of_means", "dashdot")):
        pts = d.curve(op, protocol, circuit, metric)
        if not pts:
            continue
        fig.add_trace(go.Scatter(
            x=[p["k"] for p in pts], y=[p[stat] for p in pts], mode="lines+markers",
            name=f"{circuit}, {stat.replace('_', ' ')}", line={"dash": dash},
            error_y={"type": "data", "array": [p[f"{stat}_se"] or 0 for p in pts]}))
    if op in PAPER_F:
        fig.add_hline(y=PAPER_F[op], line_dash="dot", annotation_text="paper, Llama3-8B")
    fig.update_layout(title=f"{op}, protocol {protocol}: faithfulness ({metric})", height=340,
                      xaxis={"type": "log", "title": "neurons per pruned layer"},
                      yaxis_title="faithfulness")
    return fig
