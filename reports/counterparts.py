"""The report's section on counterparts in other runs (issue 83): for each checkpoint the
reported one's neurons were matched in (``ncat counterparts``, ``neuron_counterpart``), how
many neurons have a counterpart beyond the null of unrelated models, and per heuristic
family whether a labelled neuron's counterpart carries the same family, beside the share
of the other checkpoint's neurons that carry it (the rate a counterpart drawn at random
would meet)."""

from __future__ import annotations

from reports.labels import share_ci

COMMAND = "ncat counterparts MODEL --checkpoint STEP --in OTHER@STEP"


def markdown(rows: list[dict]) -> list[str]:
    out = ["", "## Counterparts in other runs and checkpoints", ""]
    if not rows:
        return out + [f"No counterparts stored for this checkpoint (`{COMMAND}` stores "
                      "them; docs/training.md shows the built-in model's three seeds)."]
    out += ["A neuron has a counterpart where its best match's similarity (the mean "
            "per-operator correlation of the two neurons' activations over the grid) is "
            "above the null's threshold: the given quantile of the best similarities to "
            "unrelated models' neurons, so that about that share of neurons would have "
            "one by chance. Shares with Wilson 95% intervals.", "",
            "| other checkpoint | layers | neurons | with a counterpart | one-to-one beyond "
            "the null | same index | null (threshold, level, models) |",
            "|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['model']}@{r['step']} | {r['layers']} | {r['n']} | "
                   f"{share_ci(r['has'], r['n'])} | {share_ci(r['one_to_one'], r['n'])} | "
                   f"{share_ci(r['same_index'], r['n'])} | {r['threshold']:.3f}, "
                   f"{r['level']:g}, {r['null_models']} |")
    out += ["", "Per family (a neuron carries a family where a label of it holds for any "
            "operator): its labelled neurons with a counterpart, and of those, the ones "
            "whose counterpart carries the family too, against the family's share among "
            "the other checkpoint's neurons (the chance rate).", "",
            "| other checkpoint | family | labelled | with a counterpart | counterpart "
            "carries it | chance rate | ratio |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        for family, f in sorted(r["families"].items()):
            k, n, base = f["same_family"], f["with_counterpart"], f["base_rate"]
            ratio = (f"{(k / n) / base:.1f}x" if n and base else "n/a")
            out.append(f"| {r['model']}@{r['step']} | {family} | {f['labelled']} | "
                       f"{share_ci(n, f['labelled'])} | {share_ci(k, n)} | "
                       f"{'n/a' if base is None else f'{base:.3f}'} | {ratio} |")
        if not r["families"]:
            out.append(f"| {r['model']}@{r['step']} | (no labelled neuron matched) | 0 | "
                       "n/a | n/a | n/a | n/a |")
    return out
