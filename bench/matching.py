"""Heuristic matching of one layer: partition-wise vectorised scoring vs per-neuron loops.

All three compute the same tie-aware Algorithm 1 scores for every heuristic of one operator:
- straightforward: the tests' reference, Algorithm 1 as written: for each neuron and each
  heuristic, sort the map and count the heuristic's cells among the top k;
- sort-once loop: a tuned per-neuron loop that sorts each neuron's map once and then
  counts every heuristic with numpy.
The loops run on a sample of neurons; their time is scaled to the whole layer.
Run: .venv/bin/python bench/matching.py [--runs N]   (target: >= 50x over the straightforward
loop). Each run times every way back to back; the report gives medians over the runs and
the spread (min-max) of each time and of the per-run ratios.
"""

import numpy as np
import torch

from catalog.config import ScienceConfig
from catalog.core.arith import apply_op, is_valid
from catalog.labels.heuristics import Cells, partitions_for
from catalog.labels.matching import score_partitions

from _common import over_runs, runs_option, save, timed
from reference import per_neuron_scores, reference_score


def cells_for(op, hi):
    a, b = np.meshgrid(np.arange(hi), np.arange(hi), indexing="ij")
    a, b = a.ravel(), b.ravel()
    ok = is_valid(op, a, b, 999)
    return Cells(op, a[ok], b[ok], apply_op(op, a[ok], b[ok]), 0, hi)


def fast_scores(maps, parts, cells):
    """Every score as a dense (neurons, heuristics) array; K and KV maps are the same here."""
    rows = score_partitions(maps, maps, parts, floor=0.0, with_bottom=False, cells=cells)
    dense = np.zeros((len(maps), len(rows.heuristics)))
    dense[rows.neuron, rows.heuristic] = rows.score
    return dense


def straightforward(maps, members):
    return np.array([[reference_score(m, member) for member in members] for m in maps])


def main(runs=3, neurons=512, sample=8, hi=100):
    per_run = [(one_run(neurons, sample, hi), tie_heavy(neurons, hi)) for _ in range(runs)]
    times = ("vectorised_s", "straightforward_s_scaled", "sort_once_loop_s_scaled",
             "speedup_vs_straightforward", "speedup_vs_sort_once_loop")
    rows = [{**{k: v for k, v in row.items() if k not in times},
             **over_runs([r[0][i] for r in per_run], times)}
            for i, row in enumerate(per_run[0][0])]
    ties = ("around_the_run_s", "scanning_the_run_s", "speedup", "checkpoint_run_s")
    tie_rows = [{**{k: v for k, v in row.items() if k not in ties},
                 **over_runs([r[1][i] for r in per_run], ties)}
                for i, row in enumerate(per_run[0][1])]
    rule_runs = [label_rule_cost(neurons=4864, hi=30) for _ in range(runs)]
    rule_keys = ("scoring_s", "cell_rule_s", "value_rule_s", "value_rule_added_share")
    rule = {**{k: v for k, v in rule_runs[0].items() if k not in rule_keys},
            **over_runs(rule_runs, rule_keys)}
    save("matching", {"runs": runs, "rows": rows, "tie_heavy": tie_rows, "label_rule": rule,
                      "threads": torch.get_num_threads()})


def one_run(neurons, sample, hi):
    rows = []
    for op in ("+", "/"):
        cells = cells_for(op, hi)
        parts = partitions_for(cells, ScienceConfig(operand_hi=hi))
        members = [h.contains(cells.a, cells.b, cells.result) for p in parts for h in p.heuristics]
        maps = torch.from_numpy(np.random.default_rng(0).standard_normal(
            (neurons, len(cells.a))).astype(np.float32))
        fast_s, fast = timed(fast_scores, maps, parts, cells, repeat=2)
        loop_s, loop = timed(per_neuron_scores, maps[:sample].numpy(), members)
        plain_s, plain = timed(straightforward, maps[:2].numpy(), members)
        # same numbers before comparing speed
        assert np.abs(fast[:sample] - loop).max() < 1e-6  # scores are stored as float32
        assert np.abs(fast[:2] - plain).max() < 1e-6
        loop_s *= neurons / sample
        plain_s *= neurons / 2
        rows.append({"op": op, "cells": len(cells.a), "heuristics": len(members),
                     "neurons": neurons, "vectorised_s": fast_s,
                     "straightforward_s_scaled": plain_s, "sort_once_loop_s_scaled": loop_s,
                     "speedup_vs_straightforward": plain_s / fast_s,
                     "speedup_vs_sort_once_loop": loop_s / fast_s})
    return rows


def tie_heavy(neurons=512, hi=100):
    """Layers whose maps are mostly one value: Pythia's layer 0 (constant maps, every cell
    tied), ReLU-sparse maps (95% zeros) and maps of four levels, top and bottom scored as for
    a gated model. Counting around the long run (the default) vs scanning it (the previous
    code, still reachable by turning the run path off); same scores first. A constant layer
    is not scored at all by a checkpoint run (its neurons are never labelled): the last
    column is that path, detection included."""
    from catalog.labels import matching
    from catalog.run.checkpoint import constant_maps

    cells = cells_for("+", hi)
    parts = partitions_for(cells, ScienceConfig(operand_hi=hi))
    c = len(cells.a)
    rng = np.random.default_rng(0)
    kinds = {
        "constant (Pythia layer 0)": np.full((neurons, c), 0.25),
        "ReLU-sparse, 95% zeros": np.where(rng.random((neurons, c)) < 0.95, 0.0,
                                           rng.standard_normal((neurons, c))),
        "four levels": rng.integers(0, 4, (neurons, c)),
    }
    out = []
    for name, k in kinds.items():
        k_map = torch.from_numpy(k.astype(np.float32))
        kv = k_map * torch.from_numpy(rng.standard_normal(c).astype(np.float32))

        def score(k_map=k_map, kv=kv, floor=0.3):
            return score_partitions(k_map, kv, parts, floor, True, cells=cells)

        new_s, _ = timed(score, repeat=2)
        share, matching.AROUND_RUN_SHARE = matching.AROUND_RUN_SHARE, 2.0
        try:
            old_s, _ = timed(score)
            old = score(floor=0.0)  # every score, so that both ways are compared on all of
        finally:  # them (a score right at a floor may round to either side of it)
            matching.AROUND_RUN_SHARE = share
        new = score(floor=0.0)
        def dense(m):
            out = np.zeros((neurons, len(m.heuristics)))
            out[m.neuron, m.heuristic] = m.score
            return out
        assert np.abs(dense(new) - dense(old)).max() < 1e-6, name
        run_s, live = timed(lambda k=k: np.nonzero(~constant_maps(k.astype(np.float32)))[0])
        out.append({"maps": name, "neurons": neurons, "cells": c,
                    "around_the_run_s": new_s, "scanning_the_run_s": old_s,
                    "speedup": old_s / new_s,
                    "checkpoint_run_s": run_s + (new_s if len(live) else 0.0)})
    return out


def label_rule_cost(neurons=4864, hi=30):
    """What the label rule adds to a layer's matching: one Qwen2.5-0.5B-wide layer (4,864
    neurons), `+` on [0, hi), top and bottom scored as for a gated model. The maps are a
    mix like a real layer's: a third random functions of op1 or of the result (plus
    noise), a third planted residues and ranges (plus noise), a third noise. Scoring alone
    (the matching phase before labels), then the cell rule ('significant') and the value
    rule ('values', the default) on the scored rows."""
    from catalog.labels import value_null
    from catalog.labels.heuristics import n_tests
    from catalog.labels.matches import Matches

    cells = cells_for("+", hi)
    config = ScienceConfig(operand_hi=hi)
    parts = partitions_for(cells, config)
    rng = np.random.default_rng(0)
    c = len(cells.a)
    third = neurons // 3
    f = rng.standard_normal((third, hi))
    structured = np.where(np.arange(third)[:, None] % 2 == 0, f[:, cells.a],
                          rng.standard_normal((third, cells.result.max() + 1))[:, cells.result])
    planted = ((cells.a[None, :] % (2 + np.arange(third)[:, None] % 5) == 0)
               | ((cells.b[None, :] // 10) == (np.arange(third)[:, None] % 3))).astype(float)
    maps = np.concatenate([structured, planted, np.zeros((neurons - 2 * third, c))])
    maps = torch.from_numpy((maps + 0.3 * rng.standard_normal((neurons, c))).astype(np.float32))
    kv = maps * torch.from_numpy(rng.standard_normal(c).astype(np.float32) * 0.1 + 1.0)
    m_tests = n_tests(parts, True, False)
    null = value_null.ValueNull.of(cells, parts, config.null_strata, 0, config.pattern_top_k,
                              m_tests, config.significance_level)
    k_values = value_null.n_value_tests(null, parts, True, config.significance_level)

    orders: dict = {}

    def score():
        return score_partitions(maps, kv, parts, config.score_floor, True, cells=cells,
                                orders=orders)

    score_s, m = timed(score)
    cell = ScienceConfig(operand_hi=hi, label_rule="significant")

    def copy(m):
        return Matches(m.neuron, m.op, m.heuristic, m.score, m.bottom, m.heuristics,
                       m.base_rate, m.p_value.copy(), m.implements.copy())
    cell_s, cm = timed(lambda: value_null.label(copy(m), cell, m_tests, None, maps, kv))
    value_s, vm = timed(lambda: value_null.label(copy(m), config, k_values, null, maps, kv, orders))
    return {"neurons": neurons, "cells": c, "heuristics": sum(len(p.heuristics) for p in parts),
            "rows_scored": len(m),
            "labelled_cell_rule": int(len(np.unique(cm.neuron[cm.implements]))),
            "labelled_value_rule": int(len(np.unique(vm.neuron[vm.implements]))),
            "scoring_s": score_s, "cell_rule_s": cell_s, "value_rule_s": value_s,
            "value_rule_added_share": value_s / score_s}


if __name__ == "__main__":
    main(runs_option(3))
