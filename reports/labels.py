"""The report's section on labels: enrichment of the top set against random neurons, and
the controls a label rate needs (docs/method.md section 7)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from catalog.core.stats import wilson

PAPER_SHARE = 0.91  # top 200 neurons per layer of Llama3-8B that implement a heuristic


@dataclass
class LabelData:
    enrichment: list[dict] = field(default_factory=list)
    # op -> (labelled, maps) of the relabelled-values control, summed over layers
    control: dict[str, tuple[int, int]] = field(default_factory=dict)
    # op -> (labelled, result-labelled, maps) of the token-format control (catalog 0.10.0)
    format_control: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    # op -> (labelled, neurons) at this checkpoint and at the untrained one (step 0)
    here: dict[str, tuple[int, int]] = field(default_factory=dict)
    untrained: dict[str, tuple[int, int]] = field(default_factory=dict)
    untrained_step: int | None = None
    top_set_fraction: float = 0.05
    # op -> heuristic key -> labels of the heuristics with the same cells, scored once
    aliases: dict[str, dict[str, list[str]]] = field(default_factory=dict)


def gather(conn, model_id: int, checkpoint_id: int, config_id: int, config: dict) -> LabelData:
    d = LabelData(top_set_fraction=float(config.get("top_set_fraction", 0.05)))
    row = conn.execute("SELECT enrichment, aliases FROM checkpoint_summary "
                       "WHERE checkpoint_id = %s AND config_id = %s",
                       (checkpoint_id, config_id)).fetchone()
    d.enrichment = (row[0] if row else None) or []
    d.aliases = (row[1] if row else None) or {}
    for (control,) in conn.execute(
            "SELECT label_control FROM layer_result WHERE checkpoint_id = %s AND config_id = %s "
            "AND label_control IS NOT NULL", (checkpoint_id, config_id)):
        for op, c in control.items():
            k, n = d.control.get(op, (0, 0))
            d.control[op] = (k + int(c["labelled"]), n + int(c["n"]))
            if "format_n" in c:
                fk, fr, fn = d.format_control.get(op, (0, 0, 0))
                d.format_control[op] = (fk + int(c["format_labelled"]),
                                        fr + int(c["format_result"]), fn + int(c["format_n"]))
    d.here = _label_rates(conn, model_id, checkpoint_id, config_id)
    first = conn.execute(
        "SELECT c.id, c.step FROM checkpoint c JOIN layer_result r ON r.checkpoint_id = c.id "
        "WHERE c.model_id = %s AND r.config_id = %s AND c.step = 0 AND c.id <> %s LIMIT 1",
        (model_id, config_id, checkpoint_id)).fetchone()
    if first is not None:
        d.untrained = _label_rates(conn, model_id, first[0], config_id)
        d.untrained_step = first[1]
    return d


def _label_rates(conn, model_id: int, checkpoint_id: int, config_id: int) -> dict:
    out = {}
    for op, k, n in conn.execute(
            "SELECT n.op, count(*) FILTER (WHERE EXISTS (SELECT 1 FROM neuron_score s WHERE "
            "s.model_id = n.model_id AND s.checkpoint_id = n.checkpoint_id AND "
            "s.config_id = n.config_id AND s.layer = n.layer AND s.neuron = n.neuron AND "
            "s.op = n.op AND s.implements)), count(*) FROM neuron_op n WHERE n.model_id = %s "
            "AND n.checkpoint_id = %s AND n.config_id = %s GROUP BY n.op",
            (model_id, checkpoint_id, config_id)):
        out[op] = (int(k), int(n))
    return out


def _f(x, digits=3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) \
        else f"{x:.{digits}f}"


def _share(k: int, n: int) -> str:
    if not n:
        return "n/a"
    lo, hi = wilson(k, n)
    return f"{k}/{n} = {k / n:.3f} [{lo:.3f}, {hi:.3f}]"


def _p(x) -> str:
    return "n/a" if x is None else (f"{x:.2g}" if x >= 1e-3 else f"{x:.1e}")


def markdown(d: LabelData, ops: list[str], rule: str) -> list[str]:  # noqa: C901
    pct = f"{100 * d.top_set_fraction:g}%"
    out = ["", f"## Do important neurons implement heuristics? (the paper: "
           f"{PAPER_SHARE:.0%} of the top 200 per layer of Llama3-8B)", "",
           f"Label rule `{rule}`. Top set: the {pct} of each layer's neurons of highest rank; "
           "random set: as many other neurons of the same layer, drawn with the config's "
           "seed. Shares with Wilson 95% intervals; the difference top - random with "
           "Newcombe's interval; p: one-sided Fisher exact test that the top set is "
           "labelled more often than the random set.", ""]
    pooled = [r for r in d.enrichment if r["layer"] == "all"]
    if not pooled:
        out.append("No enrichment stored (no summary, or stored before catalog 0.6.0).")
    else:
        out += ["| op | family | top set labelled | random set labelled | whole layers | "
                "top - random | p |", "|---|---|---|---|---|---|---|"]
        for r in sorted(pooled, key=lambda r: (r["op"], r["family"] != "any", r["family"])):
            lo, hi = r["ci_difference"]
            out.append(f"| {r['op']} | {r['family']} | {_share(r['labelled_top'], r['n_top'])} "
                       f"| {_share(r['labelled_random'], r['n_random'])} | "
                       f"{_share(r['labelled_layer'], r['n_layer'])} | "
                       f"{_f(r['difference'], 3)} [{_f(lo, 3)}, {_f(hi, 3)}] | "
                       f"{_p(r['fisher_p'])} |")
        per_layer = [r for r in d.enrichment if r["layer"] != "all" and r["family"] == "any"]
        if per_layer:
            out += ["", "Per layer (any family):", "",
                    "| op | layer | top | random | p |", "|---|---|---|---|---|"]
            for r in per_layer:
                out.append(f"| {r['op']} | {r['layer']} | "
                           f"{_share(r['labelled_top'], r['n_top'])} | "
                           f"{_share(r['labelled_random'], r['n_random'])} | "
                           f"{_p(r['fisher_p'])} |")
    out += ["", "### Controls: how often this rule labels neurons that compute no arithmetic",
            ""]
    for op in ops:
        here = d.here.get(op)
        parts = []
        if here:
            parts.append(f"this checkpoint {_share(*here)} of all neurons")
        if op in d.untrained:
            parts.append(f"the untrained checkpoint (step {d.untrained_step}) "
                         f"{_share(*d.untrained[op])}")
        if op in d.control:
            parts.append(f"this checkpoint's maps against relabelled operand and result "
                         f"values {_share(*d.control[op])}")
        if op in d.format_control:
            fk, fr, fn = d.format_control[op]
            parts.append(f"maps that know only the token format (each operand's digits, "
                         f"first digit and token count, added; the answer's digits and "
                         f"tokens) {_share(fk, fn)} with any label, {_share(fr, fn)} with a "
                         f"result label")
        out.append(f"- `{op}`: " + ("; ".join(parts) if parts else "no control stored"))
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
