"""The report's periodic-structure section (issue 34, docs/periodic.md): the Fourier and
helix accounts beside the heuristic one, for the checkpoint reported. Read from the views
``period_distribution`` and ``period_label_overlap``; empty where the config measured no
spectra."""

from __future__ import annotations

from catalog.core.stats import wilson
from schema.report_reads import AXES, PeriodicData


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
