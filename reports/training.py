"""The report's training section (issue 48, docs/training.md): how the heuristic families
and the final mechanism appear over a model's checkpoints, across its training seeds.

- heuristic share per family and operator at each step, over every measured neuron and
  over the top set, with Wilson 95% intervals (view ``heuristic_share``), and each
  family's birth step per seed (catalog.core.dynamics.birth_step: the first step from
  which the share stays above the step-0 control);
- the order of births across seeds: per pair of families, how many seeds order them each
  way and the sign test (three seeds cannot reach p < 0.05: the smallest p is 0.25);
- the final checkpoint's circuit at every step against the step's own circuit and the
  random control under the final circuit's plan (view ``final_circuit_faithfulness``), at
  the circuit size nearest 2% of the layer (the paper: about 1.4%), as the mean over seeds
  and its spread.

The paper's section 5 (Pythia-6.9B, one training run): heuristic neurons appear gradually
and every family rises together, with a small deviation; the final checkpoint's circuit
neurons are increasingly present in earlier checkpoints' circuits.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import plotly.graph_objects as go

from catalog.core.dynamics import birth_step, seed_orders
from catalog.core.stats import wilson
from schema.training import TrainingData

SIZE = 0.02  # the circuit size shown: the k nearest this share of the layer (the paper's
# circuits keep about 1.4% of each late layer: 200 of Llama3-8B's 14,336 neurons)


def births(d: TrainingData, over: str = "all") -> dict[str, dict[int, dict[str, int | None]]]:
    """op -> seed -> family -> birth step, over every neuron (``all``) or the top set."""
    series: dict[tuple, dict[int, tuple]] = defaultdict(dict)
    sizes: dict[tuple, dict[int, tuple]] = defaultdict(dict)  # (op, seed) -> step -> n
    for _, seed, step, op, family, k_top, n_top, k_all, n_all in d.shares:
        if step is None:
            continue
        if family == "any":
            sizes[(op, seed)][step] = (n_all, n_top)
        else:
            series[(op, seed, family)][step] = (k_all, n_all) if over == "all" \
                else (k_top, n_top)
    out: dict[str, dict[int, dict[str, int | None]]] = defaultdict(dict)
    for (op, seed, family), got in series.items():
        # a checkpoint where no neuron carries the family has no row for it: 0 labelled
        full = [(step, *got.get(step, (0, n[0] if over == "all" else n[1])))
                for step, n in sizes[(op, seed)].items()]
        out[op].setdefault(seed, {})[family] = birth_step(full)
    return dict(out)


def final_rows(d: TrainingData) -> dict[str, list[dict]]:
    """op -> per step, the mean over seeds (and the standard deviation when several) of the
    own circuit, the final circuit and the random control at the size nearest ``SIZE``."""
    per: dict[tuple, list] = defaultdict(list)
    for (op, seed, step), (k, own, fin, rnd, n, fstep) in _nearest(d).items():
        per[(op, step)].append((seed, k, own, fin, rnd, n, fstep))
    out: dict[str, list[dict]] = defaultdict(list)
    for (op, step), rows in sorted(per.items(), key=lambda x: (x[0][0], x[0][1])):
        out[op].append({"step": step, "seeds": len(rows), "k": rows[0][1],
                        "own": _stat(rows, 2), "final": _stat(rows, 3),
                        "random": _stat(rows, 4),
                        "n": int(np.median([r[5] for r in rows])), "final_step": rows[0][6]})
    return dict(out)


PAPER_WINDOW = 23 / 143  # the paper's checkpoints: steps 23k-133k of Pythia-6.9B's 143k
PAPER_SHARED = 0.79  # neurons shared with the final checkpoint explain 79% of faithfulness


def final_share(d: TrainingData, window: float = 0.0) -> dict[str, dict]:
    """op -> how much of each step's own circuit the final circuit reaches, over the steps
    before the last with correct prompts, from ``window`` x the last step on: ``plain``,
    the ratio of the sums of their faithfulness (the paper's kind of number), and
    ``above_random``, the ratio of the sums of each one's excess over the random control
    (both None where the own circuit is not 0.05 above random on average: its neurons then
    carry little beyond a random set, and either ratio would be noise); per seed, with
    the mean and standard deviation over seeds, and the steps counted."""
    by: dict[tuple, list] = defaultdict(list)
    for op, seed, step, own, fin, rnd, fstep in final_rows_per_seed(d):
        if step < fstep and step >= window * fstep and None not in (own, fin, rnd):
            by[(op, seed)].append((own, fin, rnd))
    out: dict[str, dict] = {}
    for (op, seed), rows in sorted(by.items()):
        v = out.setdefault(op, {"plain": {}, "above_random": {}, "steps": {}})
        own = sum(o for o, _, _ in rows)
        excess = sum(o - r for o, _, r in rows)
        # both ratios only where the own circuit is 0.05 above random on average: below
        # it the normalised logit does not tell circuits apart (on `/` the empty circuit
        # already gets the small quotients) and final / own read 3.30 on the demo's `/`
        conditioned = excess > 0.05 * len(rows) and own > 0
        v["plain"][seed] = sum(f for _, f, _ in rows) / own if conditioned else None
        v["above_random"][seed] = (sum(f - r for _, f, r in rows) / excess
                                   if conditioned else None)
        v["steps"][seed] = len(rows)
    for v in out.values():
        for key in ("plain", "above_random"):
            vals = np.array([x for x in v[key].values() if x is not None])
            v[key + "_mean"] = (float(vals.mean()) if len(vals) else math.nan,
                                float(vals.std(ddof=1)) if len(vals) > 1 else math.nan)
    return out


def final_rows_per_seed(d: TrainingData) -> list[tuple]:
    """(op, seed, step, own, final, random, final step) at the size nearest ``SIZE``."""
    return [(op, seed, step, own, fin, rnd, fstep)
            for (op, seed, step), (_k, own, fin, rnd, _n, fstep) in sorted(_nearest(d).items())]


def _nearest(d: TrainingData) -> dict[tuple, tuple]:
    """(op, seed, step) -> (k, own, final, random, n, final step) of the final-circuit row
    at the circuit size nearest ``SIZE`` (the first such k on a tie)."""
    best: dict[tuple, tuple] = {}
    for _, seed, step, op, k, fraction, own, _ose, fin, _fse, rnd, _rse, n, fstep in d.final:
        if step is None or fstep is None:  # weights without a training step (a GGUF file)
            continue
        key, gap = (op, seed, step), abs(fraction - SIZE)
        if key not in best or gap < best[key][0]:
            best[key] = (gap, k, own, fin, rnd, n, fstep)
    return {key: row[1:] for key, row in best.items()}


def _stat(rows: list[tuple], i: int) -> tuple[float, float]:
    """Mean and standard deviation over seeds of column ``i`` (nan sd for one seed)."""
    v = np.array([r[i] for r in rows if r[i] is not None], dtype=float)
    if not len(v):
        return math.nan, math.nan
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else math.nan


def _ms(x: tuple[float, float]) -> str:
    m, s = x
    if not math.isfinite(m):
        return "-"
    return f"{m:.2f}" + (f" ± {s:.2f}" if math.isfinite(s) else "")


def markdown(d: TrainingData | None) -> list[str]:
    if d is None:
        return []
    seeds = d.seeds
    out = ["", f"## Training: `{d.group}` over its checkpoints, {len(seeds)} seed(s) "
           f"({', '.join(map(str, seeds))}), config {d.config_id}", "",
           "The paper (section 5, Pythia-6.9B, one run): heuristic neurons appear gradually, "
           "every family rising together; the final checkpoint's circuit neurons are more "
           "and more present in earlier circuits.", ""]
    out += _births_markdown(d, seeds)
    last = _last_shares(d)
    if last:
        out += ["", "### Labelled share at the last step, per family (Wilson 95%)", "",
                "| op | family | " + " | ".join(f"seed {s}" for s in seeds) + " |",
                "|---|---|" + "---|" * len(seeds)]
        for (op, fam), per_seed in sorted(last.items()):
            cells = []
            for s in seeds:
                k, n = per_seed.get(s, (0, 0))
                lo, hi = wilson(k, n) if n else (math.nan, math.nan)
                cells.append(f"{k}/{n} [{lo:.3f}, {hi:.3f}]" if n else "-")
            out.append(f"| {op} | {fam} | " + " | ".join(cells) + " |")
    fr = final_rows(d)
    out += _share_markdown(d, seeds)
    if fr:
        out += ["", "### The final circuit at earlier steps (normalised logit, ratio of means; "
                "mean ± sd over seeds; k nearest 2% of the layer)", "",
                "| op | step | k | own circuit | final circuit | random (final's plan) | "
                "prompts |", "|---|---|---|---|---|---|---|"]
        for op, rows in sorted(fr.items()):
            for r in rows:
                out.append(f"| {op} | {r['step']} | {r['k']} | {_ms(r['own'])} | "
                           f"{_ms(r['final'])} | {_ms(r['random'])} | {r['n']} |")
    return out


def _share_markdown(d: TrainingData, seeds: list[int]) -> list[str]:
    shares = {w: final_share(d, w) for w in (0.0, PAPER_WINDOW)}
    if not any(shares.values()):
        return []
    out = ["", "### The final circuit as a share of each step's own circuit", "",
           f"The paper: neurons shared with the final checkpoint explain {PAPER_SHARED:.0%} "
           "of faithfulness on average (Pythia-6.9B, steps 23k-133k of 143k). Here, at the "
           "size nearest 2% of the layer, over the steps before the last with correct "
           "prompts: the final circuit's faithfulness over the own circuit's (ratio of the "
           "sums), and the same for their excess over the random control (- in both where the "
           "own circuit is not 0.05 above random: its neurons then carry little beyond a "
           "random set); per seed, and mean ± sd over seeds:", "",
           "| op | steps | measure | " + " | ".join(f"seed {s}" for s in seeds)
           + " | mean ± sd |", "|---|---|---|" + "---|" * (len(seeds) + 1)]
    for w, name in ((0.0, "all"), (PAPER_WINDOW, "from 16% of training (the paper's)")):
        for op, v in sorted(shares[w].items()):
            for key, what in (("plain", "final / own"), ("above_random", "above random")):
                cells = [v[key].get(s) for s in seeds]
                counted = [v["steps"].get(s, 0) for s in seeds]
                out.append(f"| {op} | {name} ({'/'.join(map(str, counted))} steps) | {what} | "
                           + " | ".join("-" if c is None else f"{c:.2f}" for c in cells)
                           + f" | {_ms(v[key + '_mean'])} |")
    return out


def _births_markdown(d: TrainingData, seeds: list[int]) -> list[str]:
    out: list[str] = []
    b = births(d)
    if b:
        out += ["### Birth step per family (share of all measured neurons stays above the "
                "step-0 control from this step on; - = never)", "",
                "| op | family | " + " | ".join(f"seed {s}" for s in seeds) + " |",
                "|---|---|" + "---|" * len(seeds)]
        for op, per_seed in sorted(b.items()):
            for fam in sorted({f for v in per_seed.values() for f in v}):
                cells = [per_seed.get(s, {}).get(fam) for s in seeds]
                out.append(f"| {op} | {fam} | " + " | ".join(
                    "-" if c is None else str(c) for c in cells) + " |")
        out += ["", "Order of births across seeds (sign test over the seeds that order a pair; "
                "with 3 seeds the smallest two-sided p is 0.25, so no order can be "
                "established, only seen consistently):", ""]
        for op, per_seed in sorted(b.items()):
            pairs = seed_orders(per_seed)
            if not pairs:
                continue
            text = "; ".join(f"{p.first} before {p.second} in {p.before} of "
                             f"{p.before + p.after + p.tied} (p = {p.p_value:.2f}"
                             f"{', consistent' if p.consistent else ''})" for p in pairs)
            out.append(f"- `{op}`: {text}")
    return out


def _last_shares(d: TrainingData) -> dict[tuple[str, str], dict[int, tuple[int, int]]]:
    last: dict[int, int] = {}
    for _, seed, step, *_rest in d.shares:
        if step is not None:
            last[seed] = max(last.get(seed, step), step)
    out: dict[tuple[str, str], dict[int, tuple[int, int]]] = defaultdict(dict)
    for _, seed, step, op, family, _kt, _nt, k_all, n_all in d.shares:
        if step == last.get(seed):
            out[(op, family)][seed] = (k_all, n_all)
    return dict(out)


def _x(step: int) -> float:
    return max(step, 0.5)  # step 0 drawn at 0.5 on the log axis


def figures(d: TrainingData | None) -> list[go.Figure]:
    """Per operator, the final circuit's faithfulness across training beside the
    checkpoint's own circuit and a random one; then every family's labelled share."""
    if d is None:
        return []
    return [_circuit_figure(op, rows, len(d.seeds))
            for op, rows in sorted(final_rows(d).items())] + [_share_figure(d)]


def _band(xs: list, mean, sd, **style) -> go.Scatter:
    """The area mean ± sd under a line (no legend, no hover)."""
    return go.Scatter(x=xs + xs[::-1], y=list(mean + sd) + list((mean - sd)[::-1]),
                      fill="toself", line={"width": 0}, showlegend=False, hoverinfo="skip",
                      **style)


def _circuit_figure(op: str, rows: list[dict], n_seeds: int) -> go.Figure:
    colors = {"own": "#1f77b4", "final": "#d62728", "random": "#7f7f7f"}
    fig = go.Figure()
    xs = [_x(r["step"]) for r in rows]
    for key, name in (("own", "own circuit"), ("final", "final circuit"),
                      ("random", "random (final's plan)")):
        m = np.array([r[key][0] for r in rows])
        s = np.nan_to_num(np.array([r[key][1] for r in rows]))
        fig.add_trace(_band(xs, m, s, opacity=0.2, fillcolor=colors[key]))
        fig.add_trace(go.Scatter(x=xs, y=m, name=name, mode="lines+markers",
                                 line={"color": colors[key]}))
    fig.update_layout(title=f"{op}: the final circuit across training (band: ± sd over "
                            f"{n_seeds} seed(s); step 0 at 0.5)",
                      xaxis={"type": "log", "title": "step"},
                      yaxis={"title": "faithfulness (NL, ratio of means)"}, height=340)
    return fig


def _share_figure(d: TrainingData) -> go.Figure:
    share = go.Figure()
    series: dict[tuple, list] = defaultdict(list)
    for _, seed, step, op, family, _kt, _nt, k_all, n_all in d.shares:
        if family != "any" and step is not None and n_all:
            series[(op, family)].append((step, seed, k_all / n_all))
    for (op, family), pts in sorted(series.items()):
        steps = sorted({p[0] for p in pts})
        xs = [_x(s) for s in steps]
        per = [np.array([p[2] for p in pts if p[0] == s]) for s in steps]
        mean = np.array([v.mean() for v in per])
        sd = np.array([v.std(ddof=1) if len(v) > 1 else 0.0 for v in per])
        name = f"{op} {family}"
        if sd.any():  # the seeds' spread, as a band under the line
            share.add_trace(_band(xs, mean, sd, opacity=0.15, legendgroup=name))
        share.add_trace(go.Scatter(x=xs, y=mean, mode="lines", name=name, legendgroup=name))
    share.update_layout(title="Labelled share of all measured neurons per family (mean over "
                              f"seeds, band ± sd over {len(d.seeds)})",
                        xaxis={"type": "log", "title": "step"}, yaxis={"title": "share"},
                        height=340)
    return share


def numbers(d: TrainingData | None) -> dict:
    if d is None:
        return {}
    return {"group": d.group, "config_id": d.config_id, "seeds": d.seeds,
            "births": births(d), "births_top": births(d, "top"),
            "orders": {op: [p.as_dict() for p in seed_orders(v)]
                       for op, v in births(d).items()},
            "final": final_rows(d),
            "final_share": {"all": final_share(d), "paper_window": final_share(d, PAPER_WINDOW)}}
