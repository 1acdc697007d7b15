"""True result sets with additive operand effects mixed in, before catalog 0.10.0 and
under it: the recall docs/labels.md quotes (its mixture table).

The maps and seeds of tests/unit/test_operand_labels.py
(``test_result_heuristics_keep_their_labels_under_the_new_rule``): each planted result
set (0/1) plus Gaussian noise (sigma 0.3), alone and with an additive operand effect of
the set's own spread (a step per operand at 10, a random increasing f(op1) + g(op2), a
random function of each operand's token format), 40 maps per case, labelled through the
catalog's own labelling (``catalog.labels.operator_labels.label_operator``, rule 'values',
level 0.05). Per case: the maps labelled with the planted heuristic (or an alias) under
each rule, the maps given another result label under the new rule, and the share of
the set's own variance on the grid that the operands' additive fit leaves (sets under
one half are nearly additive: the test holds them to the old rule's recall).

Written to bench/results and, with --record, bench/recorded/cpu_label_mixtures.json.

Run: .venv/bin/python bench/label_mixtures.py [--record]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from _common import ROOT, save

N = 40


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()

    import torch
    from labelling import (
        TRUE_RESULT,
        additive_maps,
        cells_of,
        labelled_with_fit,
        noise_maps,
    )

    from catalog.config import ScienceConfig
    from catalog.labels.additive import AdditiveOperands

    def labelled(op, cells, maps, beyond, h):
        cfg = ScienceConfig(operand_hi=cells.hi, significance_level=0.05,
                            result_beyond_operands=beyond)
        m = labelled_with_fit(op, cells, maps.astype(np.float32), maps.astype(np.float32),
                              cfg).matches
        hit = np.array([h.key == x.key or h.key in x.aliases for x in m.heuristics]
                       or [False])[m.heuristic]
        result = np.array([x.target == "result" for x in m.heuristics] or [False])[m.heuristic]
        own = set(np.unique(m.neuron[m.implements & hit]).tolist())
        other = set(np.unique(m.neuron[m.implements & result & ~hit]).tolist())
        return len(own), len(other)

    planted = TRUE_RESULT
    t0 = time.perf_counter()
    rows = []
    for op, h in planted:
        hi = 30 if op == "+" else 50
        cells = cells_of(op, hi)
        rng = np.random.default_rng([7, ord(op)])
        s = h.contains(cells.a, cells.b, cells.result).astype(float)
        fit = AdditiveOperands.of(cells.a, cells.b)
        r = s - fit.fitted(torch.from_numpy(s[None]))[0].numpy()
        beyond_share = float((r ** 2).sum() / ((s - s.mean()) ** 2).sum())
        cases = {"alone": s + noise_maps(cells, N, rng)}
        for kind in ("two-digit", "monotone", "format"):
            add = additive_maps(kind, cells, N, rng)
            add = (add - add.mean(1, keepdims=True)) / add.std(1, keepdims=True) * s.std()
            cases[kind] = s + add + noise_maps(cells, N, rng)
        for name, maps in cases.items():
            before, _ = labelled(op, cells, maps, False, h)
            after, other = labelled(op, cells, maps, True, h)
            row = {"op": op, "hi": hi, "heuristic": h.label, "mixed": name, "n": N,
                   "before": before, "after": after, "other_result_label_after": other,
                   "set_share_beyond_operands": round(beyond_share, 3)}
            rows.append(row)
            print(row, flush=True)
    out = {"noise_sigma": 0.3, "level": 0.05, "rows": rows,
           "seconds": round(time.perf_counter() - t0, 1)}
    save("label_mixtures", out)
    if args.record:
        path = ROOT / "bench" / "recorded" / "cpu_label_mixtures.json"
        path.write_text(json.dumps(out, indent=1) + "\n")
        print(f"recorded {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
