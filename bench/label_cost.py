"""What the label rule adds to the matching of a real model, every layer, one run.

Qwen2.5-Coder-0.5B-Instruct (the GGUF that `ncat fetch qwen2.5-coder-0.5b` brings), `+` on
[0, 30), 3 solved examples: the grid pass, then per layer the matching phase of a
checkpoint run (scoring every live map, top and bottom: the model's MLP is gated) and,
timed apart on the same rows, the 'values' label rule with its relabelled-values control
and the cell rule; and, for comparison, the matching phase of catalog 0.5.0 (every
heuristic scored, duplicates of a cell set included, then the cell rule). The target:
the values rule adds at most 50% to matching.

Run: .venv/bin/python bench/label_cost.py [--hi 30] [--layers 0,1,...]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from _common import save

MODEL = "qwen2.5-coder-0.5b"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hi", type=int, default=30)
    parser.add_argument("--shots", type=int, default=3)
    parser.add_argument("--layers", default=None)
    args = parser.parse_args()

    import dataclasses

    from catalog.config import ScienceConfig
    from catalog.core.maps import kv_map
    from catalog.labels import value_null
    from catalog.labels.heuristics import n_tests, partitions_for
    from catalog.labels.matches import Matches
    from catalog.labels.matching import score_partitions
    from catalog.measuring.lens import lens_at
    from catalog.run.checkpoint import CheckpointRun, constant_maps
    from catalog.sources import load_model

    config = ScienceConfig(operators=("+",), operand_hi=args.hi, shots=args.shots,
                           patching=("attribution",))
    cells_rule = ScienceConfig(operators=("+",), operand_hi=args.hi, shots=args.shots,
                               patching=("attribution",), label_rule="significant")
    lm = load_model(MODEL)
    layers = None if args.layers is None else [int(x) for x in args.layers.split(",")]
    run = CheckpointRun(lm.model, lm.tokenizer, config, layers=layers).prepare()
    idx = run.table.op_index("+")
    old_parts = partitions_for(run.cells["+"], dataclasses.replace(config,
                                                                  dedupe_heuristics=False))
    rows = []
    for layer in run.layers:
        k_all = run.activations(layer)[idx].T
        live = np.nonzero(~constant_maps(k_all))[0]
        k_map = k_all[live]
        kv = kv_map(k_map, lens_at(lm.model, layer, run.table.answer)[live][:, idx])
        t = time.perf_counter()
        orders: dict = {}
        m = Matches.concat(run._match(0, "+", torch.as_tensor(k_map), torch.as_tensor(kv),
                                      orders))
        match_s = time.perf_counter() - t

        def copy(m=m):
            return Matches(m.neuron, m.op, m.heuristic, m.score, m.bottom, m.heuristics,
                           m.base_rate, m.p_value.copy(), m.implements.copy())
        t = time.perf_counter()
        values = value_null.label(copy(), config, run.n_tests["+"], run.nulls["+"],
                             torch.as_tensor(k_map), torch.as_tensor(kv), orders)
        rule_s = time.perf_counter() - t
        t = time.perf_counter()
        run._label_control(layer, 0, "+", k_map, kv)
        control_s = time.perf_counter() - t
        t = time.perf_counter()
        cells = value_null.label(copy(), cells_rule, m_cells(run), None, torch.as_tensor(k_map),
                            torch.as_tensor(kv))
        cell_s = time.perf_counter() - t
        # the matching phase of catalog 0.5.0: every heuristic (duplicates of a cell set
        # included) scored, then the cell rule
        t = time.perf_counter()
        old = score_partitions(torch.as_tensor(k_map), torch.as_tensor(kv), old_parts,
                               config.score_floor, run.with_bottom, config.pattern_top_k,
                               cells=run.cells["+"])
        old.label(config.match_threshold, "significant", config.significance_level,
                  n_tests(old_parts, run.with_bottom, False)).compact(
                      config.scores_per_family)
        before_s = time.perf_counter() - t
        row = {"layer": layer, "live": int(len(live)), "rows_scored": len(m),
               "matching_s": match_s, "values_rule_s": rule_s, "control_s": control_s,
               "cell_rule_s": cell_s, "matching_0_5_0_s": before_s,
               "labelled_values": int(len(np.unique(values.neuron[values.implements]))),
               "labelled_cells": int(len(np.unique(cells.neuron[cells.implements])))}
        rows.append(row)
        print(row, flush=True)
    total = {k: sum(r[k] for r in rows) for k in ("matching_s", "values_rule_s", "control_s",
                                                  "cell_rule_s", "matching_0_5_0_s")}
    total["added_share"] = (total["values_rule_s"] + total["control_s"]) / total["matching_s"]
    total["against_0_5_0"] = (total["matching_s"] + total["values_rule_s"]
                              + total["control_s"]) / total["matching_0_5_0_s"] - 1
    save("label_cost", {"model": MODEL, "hi": args.hi, "shots": args.shots, "layers": rows,
                        "total": total, "threads": torch.get_num_threads()})


def m_cells(run) -> int:
    from catalog.labels.heuristics import n_tests
    return n_tests(run.partitions["+"], run.with_bottom, False)


if __name__ == "__main__":
    main()
