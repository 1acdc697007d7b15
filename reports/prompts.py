"""The report's section on prompts explained (catalog.explain.grid, stored in every
checkpoint summary) and the paper's prompt knockout, set beside the paper's claims.

The paper (Nikankin et al., 2025) explains a prompt's answer as the sum of several
heuristics' pushes (for 21+17=: neurons for "result above 21", for "result even", ...)
and reports that zeroing the neurons of the heuristics a prompt satisfies hurts it far
more than zeroing as many random neurons of the layer's top set. Here, per operator:
how often the labelled neurons whose heuristic holds carry most of T (beside the share of
neurons they are, the base rate), the medians of the shares and of the neurons for 50% /
80% of T, the heuristics combining in the 80%, the paired comparison of a neuron where its
heuristic holds and where not, and the prompt knockout with Wilson intervals."""

from __future__ import annotations

import math

from catalog.core.stats import wilson

PAPER = ("the paper: several heuristics combine per prompt; zeroing a prompt's heuristic "
         "neurons breaks it far more often than as many random top neurons")


def _f(x, digits: int = 2) -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) \
        else f"{x:.{digits}f}"


def _sig(x) -> str:
    """Two significant digits: a neuron's term is a few thousandths of a logit or less,
    which fixed decimals print as 0.000 +- 0.000, an exact zero it is not."""
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) \
        else f"{x:.2g}"


def _med(m: dict, digits: int = 2) -> str:
    lo, hi = (m.get("ci") or [None, None])
    return f"{_f(m.get('median'), digits)} [{_f(lo, digits)}, {_f(hi, digits)}]"


def _acc(acc, n: int) -> str:
    if acc is None or not n or (isinstance(acc, float) and not math.isfinite(acc)):
        return "n/a"
    k = round(acc * n)
    lo, hi = wilson(k, n)
    return f"{k}/{n} = {acc:.2f} [{lo:.2f}, {hi:.2f}]"


def markdown(explained: dict, knockouts: dict, ops: list[str]) -> list[str]:
    if not explained and not knockouts:
        return ["", "## Prompts explained", "",
                "None stored (no summary, or one written before migration 0029 added them)."]
    out = ["", "## Prompts explained (" + PAPER + ")", "",
           "Each prompt's T (the answer's logit minus the competing numbers' mean) split "
           "exactly over the model's components, the norms' scales frozen (direct effects). "
           "Labels come from the layers measured; neurons of other layers count as "
           "\"other\". Medians with distribution-free 95% intervals; shares of prompts with "
           "Wilson 95% intervals.", "",
           "| op | prompts | labelled-and-holding carry >= 50% of T | such neurons (base "
           "rate) | their share of T | heads' share | neurons for 50% / 80% of T | "
           "heuristics in the 80% | neuron's term, holds - does not (± SE) |",
           "|---|---|---|---|---|---|---|---|---|"]
    for op in ops:
        e = explained.get(op)
        if not e:
            continue
        m = e["mostly_labelled"]
        lo, hi = m["ci"]
        p = e["paired"]
        d = p["difference"]
        out.append(
            f"| {op} | {e['n_prompts']} | {m['count']}/{m['n']} [{_f(lo)}, {_f(hi)}] | "
            f"{_f(100 * e['neuron_base_rate'], 1)}% of {e['n_neurons']} | "
            f"{_med(e['shares']['labelled, heuristic holds'])} | {_med(e['shares']['heads'])} | "
            f"{_med(e['n_for']['50%'], 0)} / {_med(e['n_for']['80%'], 0)} "
            f"(never: {e['n_for']['80%'].get('never', 0)}) | {_med(e['heuristics_in_80'], 0)} | "
            f"{_sig(d['mean'])} ± {_sig(d['se'])} (higher in {p['higher_when_holds']} of "
            f"{p['n_neurons']} neurons) |")
    if knockouts:
        out += ["", "Prompt knockout (up to N neurons per layer of the heuristics each prompt "
                "satisfies, against as many random neurons of the layer's top set): accuracy "
                "on the prompts, Wilson 95%.", "",
                "| op | prompts | neurons zeroed (mean) | heuristic knockout | random knockout |",
                "|---|---|---|---|---|"]
        for op in ops:
            k = knockouts.get(op)
            if not k:
                continue
            n = int(k.get("n_prompts") or 0)
            out.append(f"| {op} | {n} | {_f(k.get('mean_neurons_zeroed'), 1)} | "
                       f"{_acc(k.get('acc_heuristic_knockout'), n)} | "
                       f"{_acc(k.get('acc_random_knockout'), n)} |")
    out += label_adds_tables(explained, ops)
    return out


def _adds(stat: dict | None) -> str:
    """A "what the label adds" figure: the difference from its null, the combined 95%
    interval, the verdict, and the null's mean ± spread over placements."""
    if not stat:
        return "n/a"
    a = stat["adds"]
    lo, hi = a["ci"]
    return (f"{_f(a['mean'], 3)} [{_f(lo, 3)}, {_f(hi, 3)}] **{stat['verdict']}** "
            f"(null {_f(stat['null_mean'], 3)} ± {_f(stat['null_sd'], 3)}, "
            f"{stat['placements']} placements)")


def label_adds_tables(explained: dict, ops: list[str]) -> list[str]:
    """Does the label matter? The knockout and the share of T against controls chosen the
    same way except for the label, and against the labels placed at random."""
    rows = [(op, e) for op in ops if (e := explained.get(op)) and e.get("knockouts")]
    if not rows:
        return []
    out = ["", "### Does the label matter?", "",
           "Each prompt's knockout zeroes, per layer, up to N labelled neurons whose label "
           "holds (its set contains the prompt and the neuron is on the label's side), "
           "ranked on the prompt by direct term, by total effect, or drawn at random from "
           "the top set as the paper draws them. The matched controls are chosen the same "
           "way from neurons the prompt's labels are placed on at random: unlabelled ones, "
           "or labelled ones whose sets exclude the prompt. What the label adds: a control's "
           "p(answer) minus the knockout's (positive: the label's own neurons hurt more), "
           "less the same figure with every label placed at random on the neurons of its "
           "layer; 95% interval over prompts and placements. \"nil\" means the label adds "
           "nothing a matched set does not.", "",
           "| op | ranking | p clean | p after knockout | unlabelled | not holding | same "
           "ranking | random | label adds vs unlabelled | label adds vs not holding |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for op, e in rows:
        for ranking, k in e["knockouts"].items():
            sets = k["sets"]

            def p(name, sets=sets):
                x = sets.get(name)
                return "-" if x is None else f"{_f(x['p']['mean'], 3)} ± {_f(x['p']['se'], 3)}"
            clean = k.get("p_clean") or {}
            out.append(f"| {op} | {ranking} | {_f(clean.get('mean'), 3)} | {p('knockout')} | "
                       f"{p('unlabelled')} | {p('not holding')} | {p('same ranking')} | "
                       f"{p('random')} | {_adds(k['label_adds'].get('unlabelled'))} | "
                       f"{_adds(k['label_adds'].get('not holding'))} |")
    out += ["", "What the label adds to the share of T (the labelled neurons that hold, less "
            "what the prompt's labels placed at random would carry; fractions of T):", "",
            "| op | effects | vs unlabelled | vs not holding |", "|---|---|---|---|"]
    for op, e in rows:
        for ranking, by in (e.get("share_adds") or {}).items():
            out.append(f"| {op} | {ranking} | {_adds(by.get('unlabelled'))} | "
                       f"{_adds(by.get('not holding'))} |")
    out += steering_table(explained, ops)
    return out


def steering_table(explained: dict, ops: list[str]) -> list[str]:
    """The steering test per operator, family and direction (catalog.explain.steering)."""
    rows = [(op, fam, d, r) for op in ops for fam, by in
            ((explained.get(op) or {}).get("steering") or {}).items() for d, r in by.items()]
    out = ["", "Steering: each result heuristic's labelled neurons set to their activation "
           "where the heuristic holds, on prompts outside its set (\"into\"), or to their "
           "activation outside it on prompts inside (\"out of\"); success: the top token "
           "becomes a first token of results on the predicted side only. The control makes "
           "the same edit on as many unlabelled neurons of the same layers. Wilson 95% per "
           "rate, Newcombe 95% for the difference.", ""]
    if not rows:
        return out + ["No result heuristic had enough labelled neurons and unambiguous "
                      "first tokens to steer."]
    out += ["| op | family | direction | heuristics | prompts | labelled neurons | control "
            "| difference | verdict |", "|---|---|---|---|---|---|---|---|---|"]
    for op, fam, d, r in rows:
        lo, hi = r["difference_ci"]
        out.append(f"| {op} | {fam} | {d} | {r['heuristics']} | {r['prompts']} | "
                   f"{r['success']}/{r['prompts']} = {_f(r['rate'])} [{_f(r['ci'][0])}, "
                   f"{_f(r['ci'][1])}] | {r['control_success']}/{r['control_n']} = "
                   f"{_f(r['control_rate'])} [{_f(r['control_ci'][0])}, "
                   f"{_f(r['control_ci'][1])}] | {_f(r['difference'])} [{_f(lo)}, {_f(hi)}] | "
                   f"**{r['verdict']}** |")
    return out
