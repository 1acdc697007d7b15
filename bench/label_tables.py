"""docs/labels.md's tables of catalog 0.10.0's label rule, from the recorded runs:
bench/recorded/cpu_label_power.json (bench/label_power.py) and
bench/recorded/cpu_qwen2.5_label_mechanism.json (bench/label_mechanism.py).

Run: .venv/bin/python bench/label_tables.py   (prints Markdown)
     .venv/bin/python bench/label_tables.py cpu_qwen2.5_label_rule_cost_all_layers_after.json
     (one recorded Qwen run's tables: there, every layer of the model)
"""

from __future__ import annotations

import json

from catalog.core.stats import wilson

from _common import ROOT

RECORDED = ROOT / "bench" / "recorded"
def share(k: int, n: int) -> str:
    lo, hi = wilson(k, n)
    return f"{k:,}/{n:,} = {k / n:.3f} [{lo:.3f}, {hi:.3f}]" if n else "n/a"


def rate(x: float, n: int) -> str:
    k = round(x * n)
    lo, hi = wilson(k, n)
    return f"{k}/{n} [{lo:.2f}, {hi:.2f}]"


def power() -> list[str]:
    d = json.loads((RECORDED / "cpu_label_power.json").read_text())
    out = ["False labels: maps with no arithmetic of the operator, the share given a result "
           f"label (any label in brackets), {d['maps_per_point']} maps per row unless said, "
           "Wilson 95% intervals of the result-label count:", "",
           "| op | grid | maps | before 0.10.0 | 0.10.0 |", "|---|---|---|---|---|"]
    for r in d["false_labels"]:
        b, a = r["before"], r["after"]
        out.append(f"| `{r['op']}` | [0, {r['hi']}) | {r['maps']} (n = {r['n']}) | "
                   f"{rate(b['result'], r['n'])} (any {b['any']:.2f}) | "
                   f"{rate(a['result'], r['n'])} (any {a['any']:.2f}) |")
    sig = [f"sigma={s}" for s in d["sigmas"]]
    out += ["", "Recall: planted sets (0/1) plus Gaussian noise of standard deviation sigma, "
            f"{d['maps_per_point']} maps per point, the share labelled with the planted "
            "heuristic (or an alias), before 0.10.0 / 0.10.0; 'mixed': a random increasing "
            "f(op1) + g(op2) of the set's own spread added:", "",
            "| op | grid | heuristic | " + " | ".join(s.replace("sigma=", "sigma ")
                                                      for s in sig) + " |",
            "|---|---|---|" + "---|" * len(sig)]
    for r in d["recall"]:
        name = r["heuristic"] + (", mixed" if r["mixed_operands"] else "")
        out.append(f"| `{r['op']}` | [0, {r['hi']}) | {name} | " + " | ".join(
            f"{r[s]['before']:.2f} / {r[s]['after']:.2f}" for s in sig) + " |")
    return out


def qwen(name: str = "cpu_qwen2.5_label_mechanism.json") -> list[str]:
    path = RECORDED / name
    if not path.exists():
        return ["(no recorded Qwen run)"]
    d = json.loads(path.read_text())
    out = [f"Qwen2.5-Coder-0.5B, `+` on [0, {d['config']['hi']}), {d['config']['shots']} "
           f"shots, layers {d['layers'][0]}-{d['layers'][-1]} ({len(d['layers'])}), accuracy "
           f"{d['accuracy']:.3f}; top set = 5% of each layer by rank "
           f"({d['config']['ranking']}), random set = as many other neurons of the same "
           "layer (seeded); pooled over the layers; Wilson 95% intervals; p: one-sided "
           "Fisher exact test top > random:", "",
           "| labels | rule | top set | random set | whole layers | top - random | p |",
           "|---|---|---|---|---|---|---|"]
    for fam in ("any", "result target", "operand target", "range", "modulo", "pattern",
                "identical"):
        for name in ("old", "new"):
            rows = [r for r in d["pooled"][name] if r["family"] == fam]
            if not rows:
                continue
            r = rows[0]
            lo, hi = r["ci_difference"]
            out.append(f"| {fam} | {'before 0.10.0' if name == 'old' else '0.10.0'} | "
                       f"{share(r['labelled_top'], r['n_top'])} | "
                       f"{share(r['labelled_random'], r['n_random'])} | "
                       f"{share(r['labelled_layer'], r['n_layer'])} | "
                       f"{r['difference']:+.3f} [{lo:+.3f}, {hi:+.3f}] | "
                       f"{r['fisher_p']:.2g} |")
    mv = d["old_result_labels_moved"]
    n = mv["old_result"]
    out += ["", f"Where the {n:,} neurons with a result label under the old rule went: "
            f"{share(mv['keeps_result'], n)} keep a result label, "
            f"{share(mv['operand_only'], n)} keep only operand labels, "
            f"{share(mv['none'], n)} lose every label."]
    c = d["controls_new_rule"]
    out += ["", f"Controls under 0.10.0: relabelled values {share(c['labelled'], c['n'])} "
            f"of maps labelled; token-format maps {share(c['format_labelled'], c['format_n'])}"
            f" with any label, {share(c['format_result'], c['format_n'])} with a result "
            "label."]
    t = d["labelling_seconds"]
    # the timed layers are those of --time-layers that the run measured
    timed = ",".join(x for x in str(t["layers"]).split(",") if int(x) in set(d["layers"]))
    out += ["", f"Cost (layers {timed}, median of {t['repeat']} runs per layer, "
            f"summed): the labelling (scores, value rule, gate) {t['new_median_sum']} s "
            f"against {t['old_median_sum']} s before, **{100 * t['added_share']:+.0f}%** "
            f"(totals per run: {t['new_totals']} against {t['old_totals']})."]
    return out


def rivals() -> list[str]:
    """Catalog 0.11.0's tables (docs/labels.md): the rival maps' false labels under the
    three rules, recall under 0.10.0 and 0.11.0, the stored comparison of windows of
    another operator's result, and Qwen2.5-Coder-0.5B's enrichment under both."""
    new = json.loads((RECORDED / "cpu_label_power_rivals.json").read_text())
    old = json.loads((RECORDED / "cpu_label_power_0.10.0.json").read_text())
    old_false = {(r["op"], r["hi"], r["maps"]): r for r in old["false_labels"]}
    out = ["False labels on maps that follow an interaction of the operands (not the "
           "operator's result), the share given a result label (any label in brackets), "
           f"{new['maps_per_point']} maps per row ([0, 100): 20), Wilson 95% intervals:", "",
           "| op | grid | maps | before 0.10.0 | 0.10.0 | 0.11.0 |", "|---|---|---|---|---|---|"]
    pooled: dict[str, list[int]] = {}
    for r in new["false_labels"]:
        if not r["maps"].startswith("rival: "):
            continue
        o = old_false.get((r["op"], r["hi"], r["maps"]), {}).get("after")
        b, a = r["before"], r["after"]
        ten = f"{rate(o['result'], r['n'])} (any {o['any']:.2f})" if o else "n/a"
        out.append(f"| `{r['op']}` | [0, {r['hi']}) | {r['maps'][7:]} | "
                   f"{rate(b['result'], r['n'])} (any {b['any']:.2f}) | {ten} | "
                   f"{rate(a['result'], r['n'])} (any {a['any']:.2f}) |")
        got = pooled.setdefault(f"`{r['op']}` [0, {r['hi']})", [0, 0])
        got[0] += round(a["result"] * r["n"])
        got[1] += r["n"]
    k = sum(v[0] for v in pooled.values())
    n = sum(v[1] for v in pooled.values())
    out += ["", "Pooled under 0.11.0: " + "; ".join(f"{g} {rate(v[0] / v[1], v[1])}"
                                                     for g, v in pooled.items())
            + f"; all {rate(k / n, n)}.", ""]
    sig = [f"sigma={x}" for x in new["sigmas"]]
    old_recall = {(r["op"], r["heuristic"], r["mixed_operands"]): r for r in old["recall"]}
    out += ["Recall: planted sets plus Gaussian noise of standard deviation sigma (signal to "
            "noise 1 / sigma), the share labelled with the planted heuristic, 0.10.0 / "
            "0.11.0 on the same maps:", "",
            "| op | grid | heuristic | " + " | ".join(x.replace("sigma=", "sigma ")
                                                      for x in sig) + " |",
            "|---|---|---|" + "---|" * len(sig)]
    for r in new["recall"]:
        o = old_recall[(r["op"], r["heuristic"], r["mixed_operands"])]
        name = r["heuristic"] + (", mixed" if r["mixed_operands"] else "")
        out.append(f"| `{r['op']}` | [0, {r['hi']}) | {name} | " + " | ".join(
            f"{o[x]['after']:.2f} / {r[x]['after']:.2f}" for x in sig) + " |")
    cmp_ = json.loads((RECORDED / "cpu_label_comparison.json").read_text())["comparison"]
    out += ["", "Windows of another operator's result: the share of maps whose stored "
            "comparison names that result as the best rival, and finds it better than this "
            "operator's own (held out):", "",
            "| op | grid | windows of | named | better |", "|---|---|---|---|---|"]
    for r in cmp_:
        out.append(f"| `{r['op']}` | [0, {r['hi']}) | {r['windows_of']} | "
                   f"{rate(r['named'], r['n'])} | {rate(r['better'], r['n'])} |")
    ten = json.loads((RECORDED / "cpu_qwen2.5_label_mechanism.json").read_text())
    elf = json.loads((RECORDED / "cpu_qwen2.5_label_rivals.json").read_text())
    out += ["", "Qwen2.5-Coder-0.5B, `+` on [0, 30), 3 shots, layers 12-23, top 5% of each "
            "layer against as many random neurons of the same layers (n = 2,928 each):", "",
            "| labels | rule | top set | random set | whole layers | top - random | p |",
            "|---|---|---|---|---|---|---|"]
    for fam in ("any", "result target", "operand target", "range", "modulo"):
        for rule, d in (("0.10.0", ten), ("0.11.0", elf)):
            r = next(x for x in d["pooled"]["new"] if x["family"] == fam)
            lo, hi = r["ci_difference"]
            out.append(f"| {fam} | {rule} | {share(r['labelled_top'], r['n_top'])} | "
                       f"{share(r['labelled_random'], r['n_random'])} | "
                       f"{share(r['labelled_layer'], r['n_layer'])} | "
                       f"{r['difference']:+.3f} [{lo:+.3f}, {hi:+.3f}] | "
                       f"{r['fisher_p']:.2g} |")
    mv, ag = elf["old_result_labels_moved"], elf["new_rule_label_agrees_with_stored_comparison"]
    n = mv["old_result"]
    out += ["", f"Of the {n:,} result labels before 0.10.0, under 0.11.0 "
            f"{share(mv['keeps_result'], n)} keep a result label (0.10.0: "
            f"{share(ten['old_result_labels_moved']['keeps_result'], n)}), "
            f"{share(mv['none'], n)} lose every label. The label agrees with the stored "
            f"comparison on {share(ag['agree'], ag['labelled'])} maps with a result label."]
    c = elf["controls_new_rule"]
    out += ["", f"Controls under 0.11.0: relabelled values {share(c['labelled'], c['n'])}; "
            f"token-format maps {share(c['format_result'], c['format_n'])} with a result "
            "label."]
    return out


if __name__ == "__main__":
    import sys

    # a file under bench/recorded: that Qwen run's tables alone (the whole model's, say);
    # "rivals": catalog 0.11.0's tables
    if len(sys.argv) > 1 and sys.argv[1] == "rivals":
        print("\n".join(rivals()))
    else:
        print("\n".join(qwen(sys.argv[1]) if len(sys.argv) > 1 else power() + [""] + qwen()))
