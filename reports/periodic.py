"""The report's periodic-structure section (issue 34, docs/periodic.md): the Fourier and
helix accounts beside the heuristic one, for the checkpoint reported. Read from the views
``period_distribution`` and ``period_label_overlap``; empty where the config measured no
spectra."""

from __future__ import annotations

from dataclasses import dataclass, field

from catalog.core.stats import wilson

AXES = ("op1", "op2", "result", "kv")


@dataclass
class PeriodicData:
    # (layer, axis) -> [periodic maps, live maps] over every operator
    counts: dict[tuple[int, str], list[int]] = field(default_factory=dict)
    # (layer, axis) -> {period: maps}
    periods: dict[tuple[int, str], dict[int, int]] = field(default_factory=dict)
    # rows of period_label_overlap: (op, family, target, n_labelled, n_agree, n_live, n_base)
    overlap: list[tuple] = field(default_factory=list)


def gather(conn, model_id: int, checkpoint_id: int, config_id: int) -> PeriodicData:
    d = PeriodicData()
    key = (model_id, checkpoint_id, config_id)
    per_op: dict[tuple[int, str], dict[str, tuple[int, int]]] = {}
    for layer, op, axis, period, n, n_periodic, n_live in conn.execute(
            "SELECT layer, op, axis, period, n, n_periodic, n_live FROM period_distribution "
            "WHERE model_id = %s AND checkpoint_id = %s AND config_id = %s", key):
        per_op.setdefault((layer, axis), {})[op] = (n_periodic, n_live)
        if period is not None:  # None: the row of an axis without periodic maps
            periods = d.periods.setdefault((layer, axis), {})
            periods[period] = periods.get(period, 0) + n
    d.counts = {k: [sum(v[0] for v in ops.values()), sum(v[1] for v in ops.values())]
                for k, ops in per_op.items()}
    d.overlap = [tuple(r) for r in conn.execute(
        "SELECT op, family, target, n_labelled, n_agree, n_live, n_base "
        "FROM period_label_overlap WHERE model_id = %s AND checkpoint_id = %s "
        "AND config_id = %s ORDER BY op, family, target", key)]
    return d


def share_text(k: int, n: int) -> str:
    if not n:
        return "-"
    lo, hi = wilson(k, n)
    return f"{k}/{n} ({100 * k / n:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}])"


def markdown(d: PeriodicData) -> list[str]:
    if not d.counts:
        return []
    out = ["", "## Periodic structure (Zhou et al. 2024: Fourier features of periods 2, 5, "
           "10; Kantamneni & Tegmark 2025: a helix with periods 2, 5, 10, 100)", "",
           "Maps whose dominant period beats the null of the other operands' effects "
           "(p = 0.01 per axis: about 1% of maps without periodic structure), of the live "
           "maps of every operator, with a Wilson 95% interval and the commonest periods "
           "(docs/method.md section 11):", "",
           "| layer | " + " | ".join(AXES) + " |", "|---|" + "---|" * len(AXES)]
    for layer in sorted({k[0] for k in d.counts}):
        cells = []
        for x in AXES:
            k, n = d.counts.get((layer, x), [0, 0])
            top = sorted(d.periods.get((layer, x), {}).items(), key=lambda tm: (-tm[1], tm[0]))
            cells.append(share_text(k, n) + ("; " + ", ".join(f"T={t}: {m}" for t, m in top[:3])
                                         if top else ""))
        out.append(f"| {layer} | " + " | ".join(cells) + " |")
    if d.overlap:
        out += ["", "Labels beside the periodic account: a modulo-n label agrees when the map "
                "is periodic on its number with a period dividing n, a range label when a "
                "line explains more than any period; the base rate is that agreement among "
                "all live maps of the same layers:", "",
                "| op | labels | target | agree | base rate |", "|---|---|---|---|---|"]
        for op, family, target, n_lab, n_agree, n_live, n_base in d.overlap:
            out.append(f"| {op} | {family} | {target} | {share_text(n_agree, n_lab)} | "
                       f"{share_text(n_base, n_live)} |")
    return out


def numbers(d: PeriodicData) -> dict:
    return {"counts": {f"{layer}/{x}": v for (layer, x), v in sorted(d.counts.items())},
            "periods": {f"{layer}/{x}": {str(t): m for t, m in sorted(p.items())}
                        for (layer, x), p in sorted(d.periods.items())},
            "overlap": [list(r) for r in d.overlap]}
