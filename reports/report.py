"""``ncat report``: one checkpoint of the catalog set beside the heuristics paper's claims.

Every number is computed from the catalog's rows (``gather``), so the report says exactly
what the database holds: an HTML page (plotly, self-contained, readable offline) and a
Markdown summary with the same numbers. Claims carry their sample sizes and standard
errors, and base rates where a share could arise by chance:

- accuracy per operator under the config's template and shots (n = valid prompts);
- the share of the total |rank_value| (the ranking effect) carried by each layer, per
  operator (the paper: late layers carry it);
- where the answer is computed (component effects, the residual stream's logit lens) and
  each faithfulness protocol's curve with its controls, areas and warnings
  (``reports.circuits``);
- the share of the top neurons (``rank < top_n`` per layer and operator) labelled with a
  heuristic, overall and per family, beside the same share among all measured neurons
  (the paper: 91% of the top 200 per layer of Llama3-8B);
- heuristic knockouts from the summary; prompts explained (each answer's logit split over
  the labelled neurons, aggregated) and the prompt knockout (``reports.prompts``);
- the K maps of the top neurons.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
from markdown_it import MarkdownIt

from catalog.core.stats import share_se, wilson
from catalog.sources.base import transformers_check
from reports import circuits as report_circuits
from reports import counterparts as report_counterparts
from reports import labels as report_labels
from reports import periodic as report_periodic
from reports import prompts as report_prompts
from reports import training as report_training
from schema.report_reads import ReportData
from schema.report_reads import gather_report as gather

PAPER = {
    "top_share": 0.91,
    "faithfulness": {"+": 0.97, "-": 0.98, "*": 0.90, "/": 0.96},
    "accuracy": {"+": 0.97, "-": 0.96, "*": 0.84, "/": 0.92},
}






def _share_ci(k: int, n: int) -> str:
    """k / n with its Wilson 95% interval (a zero count has a non-zero upper end)."""
    if not n:
        return "n/a"
    lo, hi = wilson(k, n)
    return f"{k / n:.3f} [{lo:.3f}, {hi:.3f}]"




# ------------------------------------------------------------------ rendering


def _fmt(x, digits=3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) \
        else f"{x:.{digits}f}"


def markdown(d: ReportData) -> str:
    cfg = d.config
    ops = list(cfg["operators"])
    out = _head_lines(d, ops)
    out += report_circuits.markdown(d.circuits, ops) + _old_faithfulness_lines(d, ops)
    out += report_labels.markdown(d.labels, ops, cfg.get("label_rule", "paper"))
    out += _top_label_lines(d, ops)
    out += report_periodic.markdown(d.periodic)
    out += _knockout_lines(d)
    out += report_prompts.markdown(d.prompt_explanations, d.prompt_knockouts, ops)
    out += _spearman_lines(d.spearman)
    out += report_training.markdown(d.training)
    out += report_counterparts.markdown(d.counterparts)
    out += ["", "## Top neurons by |effect|", ""]
    for op, layer, neuron, value, label in d.top_neurons:
        out.append(f"- `{op}` L{layer} N{neuron}: {_fmt(value, 4)} {label or '(no label)'}")
    return "\n".join(out) + "\n"


def _old_faithfulness_lines(d: ReportData, ops: list[str]) -> list[str]:
    """The faithfulness points of a catalog stored before 0.5.0 (none where its summaries
    have curves, or where there are no points)."""
    if d.circuits.summaries or not any(d.faithfulness.values()):
        return []
    out = ["", "Stored before catalog 0.5.0 (every measured layer pruned, heads kept, "
           "the paper's mean of ratios only):", ""]
    for op in ops:
        curve = d.faithfulness.get(op) or []
        out.append(f"- `{op}`: " + ", ".join(f"{k} -> {_fmt(f, 2)}" for k, f in curve))
    return out


def _spearman_lines(spearman: dict) -> list[str]:
    """Attribution against exact patching per layer and operator (none: no lines)."""
    if not spearman:
        return []
    out = ["", "## Attribution against exact patching (Spearman on the exact set)", ""]
    for layer, facts in sorted(spearman.items()):
        out.append(f"- layer {layer}: " + ", ".join(
            f"{op} n={f.get('n_exact')} rho={_fmt(f.get('spearman'), 2)}"
            for op, f in facts.items()))
    return out


def _head_lines(d: ReportData, ops: list[str]) -> list[str]:
    """The title, the config, the accuracy and the share of the effect per layer."""
    cfg = d.config
    where = f"step {d.step}" if d.step is not None else "its only checkpoint"
    out = [f"# {d.model}, {where}", "",
           f"Config {d.config_id}: operators {''.join(ops)}, operands [{cfg['operand_lo']}, "
           f"{cfg['operand_hi']}), template `{cfg['template']!r}`, {cfg.get('shots', 0)} shots, "
           f"label rule {cfg.get('label_rule', 'paper')}, ranked by "
           f"{cfg.get('rank_statistic', 'mean')} ({cfg.get('rank_sign', 'signed')}). "
           f"Layers measured: {d.layers}; the summary covers "
           f"{d.summary_layers if d.summary_layers is not None else 'none'}. The model's "
           f"load: {transformers_check(d.transformers_nats)}.", "",
           "## Accuracy (the paper, Llama3-8B: + 0.97, - 0.96, * 0.84, / 0.92)", "",
           "| op | accuracy | ± SE | prompts | pairs used |", "|---|---|---|---|---|"]
    for op in ops:
        acc, n = d.accuracy.get(op), d.n_prompts.get(op, 0)
        se = share_se(acc, n) if acc is not None and n else None
        out.append(f"| {op} | {_fmt(acc)} | {_fmt(se)} | {n} | {d.n_pairs.get(op, 'n/a')} |")
    covered = (f"over the {len(d.layers)} layers measured of the model's {d.n_model_layers}: "
               "the layers not measured are not in the total" if d.n_model_layers
               and len(d.layers) < d.n_model_layers else "over every layer of the model")
    out += ["", "## Share of the total |effect| per layer (the paper: late layers carry it)",
            "", f"Shares of the summed |effect| {covered}.",
            "", "| op | " + " | ".join(f"L{la}" for la in d.layers) + " |",
            "|---|" + "---|" * len(d.layers)]
    for op in ops:
        shares = d.layer_share.get(op, {})
        out.append(f"| {op} | " + " | ".join(_fmt(shares.get(la), 2) for la in d.layers) + " |")
    return out


def _top_label_lines(d: ReportData, ops: list[str]) -> list[str]:
    out = ["", f"### Labels among the {d.top_n} neurons of highest rank per layer", "",
           "| op | top labelled | share [Wilson 95%] | all labelled | share [Wilson 95%] | "
           "families (top) |",
           "|---|---|---|---|---|---|"]
    for op in ops:
        tk, tn = d.top_labelled.get(op, (0, 0))
        ak, an = d.all_labelled.get(op, (0, 0))
        fam = ", ".join(f"{f} {k}" for f, k in sorted(d.top_by_family.get(op, {}).items()))
        out.append(f"| {op} | {tk}/{tn} | {_share_ci(tk, tn)} | {ak}/{an} | "
                   f"{_share_ci(ak, an)} | {fam or '-'} |")
    return out


def _knockout_lines(d: ReportData) -> list[str]:
    out = ["", "## Knockouts", ""]
    for row in d.heuristic_knockouts[:10]:
        out.append(f"- `{row.get('op')}` {row.get('label')}: {row.get('n_neurons')} neurons "
                   f"zeroed; accuracy on the {row.get('n_associated')} prompts it is about / "
                   f"the others: {_fmt(row.get('acc_associated'))} / "
                   f"{_fmt(row.get('acc_other'))} (the paper: about 0.56-0.80 / 0.86-0.91): "
                   f"{row.get('verdict', 'no verdict stored')}")
    if not d.heuristic_knockouts:
        out.append("- no heuristic knockout stored (no summary, or no labelled top-set "
                   "neurons)")
    return out


def _figures(d: ReportData) -> list[go.Figure]:
    from reports.plots import heatmap

    ops = list(d.config["operators"])
    figs = []
    share = go.Figure([go.Bar(name=op, x=[f"L{la}" for la in d.layers],
                              y=[d.layer_share.get(op, {}).get(la) for la in d.layers])
                       for op in ops])
    share.update_layout(title="Share of total |effect| per layer", barmode="group",
                        height=320)
    figs.append(share)
    figs += report_circuits.figures(d.circuits, ops)
    figs += report_training.figures(d.training)
    sketch = d.sketch or [False] * len(d.grids)
    for (op, layer, neuron, _, label), grid, sk in zip(d.top_neurons, d.grids, sketch,
                                                        strict=False):
        figs.append(heatmap(grid, d.config["operand_lo"],
                            f"{op} L{layer} N{neuron}: {label or 'no label'}"
                            + (" (sketch: block means)" if sk else "")))
    return figs


STYLE = ("body{font-family:sans-serif;max-width:1100px;margin:auto;padding:0 1em}"
         "table{border-collapse:collapse;margin:.5em 0}"
         "th,td{border:1px solid #ccc;padding:2px 8px;text-align:right}"
         "th{background:#f3f3f3}"
         "blockquote{border-left:4px solid #d9822b;background:#fff4e5;margin:.5em 0;"
         "padding:.3em 1em}")


def render(d: ReportData, out_dir: Path) -> tuple[Path, Path]:
    """Write ``report.html`` (self-contained) and ``report.md`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    md = markdown(d)
    parts = [fig.to_html(full_html=False, include_plotlyjs=(i == 0))
             for i, fig in enumerate(_figures(d))]
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>"
            f"{html.escape(d.model)} report</title><style>{STYLE}</style></head><body>"
            + MarkdownIt("commonmark", {"html": False}).enable("table").render(md)
            + "<h2>Figures</h2>" + "".join(parts)
            + f"<script type='application/json' id='report-data'>"
            f"{html.escape(json.dumps(numbers(d)))}</script></body></html>")
    html_path, md_path = out_dir / "report.html", out_dir / "report.md"
    html_path.write_text(page)
    md_path.write_text(md)
    return html_path, md_path


def numbers(d: ReportData) -> dict:
    """The report's numbers as JSON (embedded in the HTML page)."""
    return {"model": d.model, "step": d.step, "config_id": d.config_id, "layers": d.layers,
            "accuracy": d.accuracy, "layer_share": {op: {str(k): v for k, v in s.items()}
                                                    for op, s in d.layer_share.items()},
            "top_labelled": d.top_labelled, "all_labelled": d.all_labelled,
            "top_by_family": d.top_by_family, "enrichment": d.labels.enrichment,
            "label_control": d.labels.control, "untrained_labelled": d.labels.untrained,
            "periodic": report_periodic.numbers(d.periodic),
            "training": report_training.numbers(d.training),
            "counterparts": [{k: v for k, v in r.items() if k != "to_checkpoint_id"}
                             for r in d.counterparts],
            "prompt_explanations": d.prompt_explanations,
            "prompt_knockouts": d.prompt_knockouts,
            "circuits": [{k: v for k, v in row.items() if not k.endswith("_id")}
                         for row in d.circuits.summaries],
            "top_neurons": [list(map(lambda x: float(x) if isinstance(x, np.floating) else x, t))
                            for t in d.top_neurons]}


def report(url: str, model: str, step: int | None, out_dir: Path, top_n: int = 20,
           config_id: int | None = None) -> tuple[Path, Path]:
    return render(gather(url, model, step, top_n, config_id), out_dir)

