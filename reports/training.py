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
  the circuit size nearest 10% of the layer, as the mean over seeds and its spread.

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

SIZE = 0.1  # the circuit size shown: the k nearest this share of the layer


def births(d: TrainingData, over: str = "all") -> dict[str, dict[int, dict[str, int | None]]]:
    """op -> seed -> family -> birth step, over every neuron (``all``) or the top set."""
    series: dict[tuple, list] = defaultdict(list)
    for _, seed, step, op, family, k_top, n_top, k_all, n_all in d.shares:
        if step is None or family == "any":
            continue
        series[(op, seed, family)].append((step, k_all, n_all) if over == "all"
                                          else (step, k_top, n_top))
    out: dict[str, dict[int, dict[str, int | None]]] = defaultdict(dict)
    for (op, seed, family), s in series.items():
        out[op].setdefault(seed, {})[family] = birth_step(s)
    return dict(out)


def final_rows(d: TrainingData) -> dict[str, list[dict]]:
    """op -> per step, the mean over seeds (and the standard deviation when several) of the
    own circuit, the final circuit and the random control at the size nearest ``SIZE``."""
    by: dict[tuple, list] = defaultdict(list)
    for _, seed, step, op, k, fraction, own, _ose, fin, _fse, rnd, _rse, n, fstep in d.final:
        by[(op, seed, step)].append((abs(fraction - SIZE), k, own, fin, rnd, n, fstep))
    per: dict[tuple, list] = defaultdict(list)
    for (op, seed, step), rows in by.items():
        _, k, own, fin, rnd, n, fstep = min(rows, key=lambda r: r[0])
        per[(op, step)].append((seed, k, own, fin, rnd, n, fstep))
    out: dict[str, list[dict]] = defaultdict(list)
    for (op, step), rows in sorted(per.items(), key=lambda x: (x[0][0], x[0][1])):
        out[op].append({"step": step, "seeds": len(rows), "k": rows[0][1],
                        "own": _stat(rows, 2), "final": _stat(rows, 3),
                        "random": _stat(rows, 4),
                        "n": int(np.median([r[5] for r in rows])), "final_step": rows[0][6]})
    return dict(out)


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
    if fr:
        out += ["", "### The final circuit at earlier steps (normalised logit, ratio of means; "
                "mean ± sd over seeds; k nearest 10% of the layer)", "",
                "| op | step | k | own circuit | final circuit | random (final's plan) | "
                "prompts |", "|---|---|---|---|---|---|---|"]
        for op, rows in sorted(fr.items()):
            for r in rows:
                out.append(f"| {op} | {r['step']} | {r['k']} | {_ms(r['own'])} | "
                           f"{_ms(r['final'])} | {_ms(r['random'])} | {r['n']} |")
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
    if d is None:
        return []
    figs = []
    colors = {"own": "#1f77b4", "final": "#d62728", "random": "#7f7f7f"}
    for op, rows in sorted(final_rows(d).items()):
        fig = go.Figure()
        xs = [_x(r["step"]) for r in rows]
        for key, name in (("own", "own circuit"), ("final", "final circuit"),
                          ("random", "random (final's plan)")):
            m = np.array([r[key][0] for r in rows])
            s = np.nan_to_num(np.array([r[key][1] for r in rows]))
            fig.add_trace(go.Scatter(x=xs + xs[::-1], y=list(m + s) + list((m - s)[::-1]),
                                     fill="toself", line={"width": 0}, opacity=0.2,
                                     fillcolor=colors[key], showlegend=False,
                                     hoverinfo="skip"))
            fig.add_trace(go.Scatter(x=xs, y=m, name=name, mode="lines+markers",
                                     line={"color": colors[key]}))
        fig.update_layout(title=f"{op}: the final circuit across training (band: ± sd over "
                                f"{len(d.seeds)} seed(s); step 0 at 0.5)",
                          xaxis={"type": "log", "title": "step"},
                          yaxis={"title": "faithfulness (NL, ratio of means)"}, height=340)
        figs.append(fig)
    share = go.Figure()
    series: dict[tuple, list] = defaultdict(list)
    for _, seed, step, op, family, _kt, _nt, k_all, n_all in d.shares:
        if family != "any" and step is not None and n_all:
            series[(op, family)].append((step, seed, k_all / n_all))
    for (op, family), pts in sorted(series.items()):
        steps = sorted({p[0] for p in pts})
        mean = [float(np.mean([p[2] for p in pts if p[0] == s])) for s in steps]
        share.add_trace(go.Scatter(x=[_x(s) for s in steps], y=mean, mode="lines",
                                   name=f"{op} {family}"))
    share.update_layout(title="Labelled share of all measured neurons per family (mean over "
                              "seeds)", xaxis={"type": "log", "title": "step"},
                        yaxis={"title": "share"}, height=340)
    figs.append(share)
    return figs


def numbers(d: TrainingData | None) -> dict:
    if d is None:
        return {}
    return {"group": d.group, "config_id": d.config_id, "seeds": d.seeds,
            "births": births(d), "births_top": births(d, "top"),
            "orders": {op: [p.as_dict() for p in seed_orders(v)]
                       for op, v in births(d).items()},
            "final": final_rows(d)}
