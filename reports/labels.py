"""The report's section on labels: enrichment of the top set against random neurons, and
the controls a label rate needs (docs/method.md section 7)."""

from __future__ import annotations

import math

from catalog.core.stats import wilson
from schema.report_reads import LabelData

PAPER_SHARE = 0.91  # top 200 neurons per layer of Llama3-8B that implement a heuristic


def layer_span(layers: list[int], n_layers: int | None) -> str:
    """'layers 12-23 (12 of 24 measured)': which layers a pooled figure stands on."""
    if not layers:
        return "no layers"
    runs, start = [], layers[0]
    for prev, x in zip(layers, layers[1:] + [None], strict=True):
        if x is None or x != prev + 1:
            runs.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = x
    word = "layer" if len(layers) == 1 else "layers"
    of = f" of {n_layers}" if n_layers else ""
    return f"{word} {', '.join(runs)} ({len(layers)}{of} measured)"


def beside_paper(pooled: list[dict], pct: str) -> list[str]:
    """Why a top-set share here differs from the paper's, with this run's own numbers."""
    rows = [r for r in pooled if r["family"] == "any" and r["n_top"]]
    if not rows:
        return []
    out = ["", f"Beside the paper's {PAPER_SHARE:.0%}:"]
    for r in rows:
        top = r["labelled_top"] / r["n_top"]
        rnd = r["labelled_random"] / r["n_random"] if r["n_random"] else float("nan")
        out.append(f"- `{r['op']}`: {top:.1%} of the top set here against {rnd:.1%} of "
                   f"random neurons of the same layers; the paper's figure has no random "
                   f"set beside it.")
    out += ["- The paper counts a neuron when one heuristic's matching score reaches 0.6; "
            "this rule needs a p-value against relabelled values at a family-wise corrected "
            "level, and a result label must also explain the map beyond both operands' "
            "additive effects and the prompt's token layout, on the activation too, and "
            "beat every rival that is not the result (another operator's result, max or "
            "min of the operands), held out and beyond each: a map that is a function of "
            "both the result and a rival (the sum's parity is |op1 - op2|'s) is a tie and "
            "keeps no result label. The random set's share is the base rate a count "
            "without such tests would carry.",
            f"- The paper's top set is 200 neurons per layer of Llama3-8B (about 1.4% of a "
            f"14,336-wide MLP) over all four operators and operands up to 300; here it is "
            f"the {pct} of each measured layer, on this run's operators and grid."]
    return out


def _f(x, digits=3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) \
        else f"{x:.{digits}f}"


def share_ci(k: int, n: int) -> str:
    """k/n = share [Wilson 95% interval]; 'n/a' for n = 0."""
    if not n:
        return "n/a"
    lo, hi = wilson(k, n)
    return f"{k}/{n} = {k / n:.3f} [{lo:.3f}, {hi:.3f}]"


def _p(x) -> str:
    return "n/a" if x is None else (f"{x:.2g}" if x >= 1e-3 else f"{x:.1e}")


def markdown(d: LabelData, ops: list[str], rule: str) -> list[str]:
    pct = f"{100 * d.top_set_fraction:g}%"
    out = ["", f"## Do important neurons implement heuristics? (the paper: "
           f"{PAPER_SHARE:.0%} of the top 200 per layer of Llama3-8B)", "",
           f"Label rule `{rule}`. Top set: the {pct} of each layer's neurons of highest rank; "
           "random set: as many other neurons of the same layer, drawn with the config's "
           "seed. Shares with Wilson 95% intervals; the difference top - random with "
           "Newcombe's interval; p: one-sided Fisher exact test that the top set is "
           "labelled more often than the random set.", ""]
    out += _enrichment_lines(d, pct)
    out += ["", "### Controls: how often this rule labels neurons that compute no arithmetic",
            ""]
    out += [f"- `{op}`: " + ("; ".join(parts) if (parts := _controls(d, op))
                             else "no control stored") for op in ops]
    out += ["", "A label rate means something only beside these: a rule that labels the "
            "untrained model or the relabelled maps as often as the trained one does not "
            "tell heuristics from structure."]
    if any(d.aliases.get(op) for op in ops):
        out.append("")
    for op in ops:
        same = d.aliases.get(op) or {}
        if same:
            n = sum(len(v) for v in same.values())
            examples = "; ".join(f"`{k}` also {', '.join(v)}" for k, v in list(same.items())[:4])
            out.append(f"- `{op}`: {n} heuristics have the cells of another on this grid and "
                       f"are scored once, under the simpler name ({examples})")
    return out


def _enrichment_lines(d: LabelData, pct: str) -> list[str]:
    """The top set's labelled share against the random set's, pooled and per layer."""
    pooled = [r for r in d.enrichment if r["layer"] == "all"]
    if not pooled:
        return ["No enrichment stored (no summary, or stored before catalog 0.6.0)."]
    out = [f"Pooled over {layer_span(d.layers, d.n_layers)}: the layers not measured "
           "are in no set.", "",
           "| op | family | top set labelled | random set labelled | whole layers | "
           "top - random | p |", "|---|---|---|---|---|---|---|"]
    for r in sorted(pooled, key=lambda r: (r["op"], r["family"] != "any", r["family"])):
        lo, hi = r["ci_difference"]
        out.append(f"| {r['op']} | {r['family']} | {share_ci(r['labelled_top'], r['n_top'])} "
                   f"| {share_ci(r['labelled_random'], r['n_random'])} | "
                   f"{share_ci(r['labelled_layer'], r['n_layer'])} | "
                   f"{_f(r['difference'], 3)} [{_f(lo, 3)}, {_f(hi, 3)}] | "
                   f"{_p(r['fisher_p'])} |")
    per_layer = [r for r in d.enrichment if r["layer"] != "all" and r["family"] == "any"]
    if per_layer:
        out += ["", "Per layer (any family):", "",
                "| op | layer | top | random | p |", "|---|---|---|---|---|"]
        for r in per_layer:
            out.append(f"| {r['op']} | {r['layer']} | "
                       f"{share_ci(r['labelled_top'], r['n_top'])} | "
                       f"{share_ci(r['labelled_random'], r['n_random'])} | "
                       f"{_p(r['fisher_p'])} |")
    return out + beside_paper(pooled, pct)


def _controls(d: LabelData, op: str) -> list[str]:
    """One operator's label rates where nothing is arithmetic: this checkpoint's, the
    untrained checkpoint's, relabelled maps', maps of the token format alone."""
    parts = []
    here = d.here.get(op)
    if here:
        parts.append(f"this checkpoint {share_ci(*here)} of all neurons")
    if op in d.untrained:
        parts.append(f"the untrained checkpoint (step {d.untrained_step}) "
                     f"{share_ci(*d.untrained[op])}")
    if op in d.control:
        parts.append(f"this checkpoint's maps against relabelled operand and result "
                     f"values {share_ci(*d.control[op])}")
    if op in d.format_control:
        fk, fr, fn = d.format_control[op]
        parts.append(f"maps that know only the token format (each operand's digits, "
                     f"first digit and token count, added; the answer's digits and "
                     f"tokens) {share_ci(fk, fn)} with any label, {share_ci(fr, fn)} with a "
                     f"result label")
    return parts
