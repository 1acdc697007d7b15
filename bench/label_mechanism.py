"""Labels under catalog 0.10.0's rule beside the rule before it, on a real model.

Qwen2.5-Coder-0.5B-Instruct (`ncat fetch qwen2.5-coder-0.5b`), `+` on [0, 30), 3 solved
examples, every layer (or --layers): one checkpoint run ranks the neurons (attribution
patching, the trimmed log-space statistic, 50 pairs) and labels every live map with the
new rule (result labels must explain the K and KV maps beyond both operands' additive
effects and the layout, and no other operator's result set may explain the KV map
clearly better), with its controls
(relabelled values; the token-format maps). The same maps are labelled again with the
rule before 0.10.0 (`result_beyond_operands` off). Written to bench/results and, with
--record, bench/recorded/cpu_qwen2.5_label_mechanism.json:

- per rule: the labelled share of the top set (5% of each layer by rank) against a random
  set of as many other neurons of the same layer, pooled and per layer, per family and per
  target (result / operand), with Wilson intervals and one-sided Fisher p-values
  (catalog.labels.enrichment);
- where the old result labels went: neurons with an old result label that keep a result
  label, keep only operand labels, or lose every label;
- the controls' shares (any label; result label for the token-format maps);
- the time of each rule on the same maps: the labelling (scores, value rule, gate, second
  pass, explanations), median of --repeat runs per layer on --time-layers, summed over
  them, and the share the new rule adds: by its steps that decide labels, by its
  labelling less the explanations (which the run clocks as a phase of their own), and
  with them; the explanations' matrix-product FLOPs against the float32 matrix product
  peak measured in the same run (``explain_flops``, ``matmul_peak``).

Run: .venv/bin/python bench/label_mechanism.py [--layers 16,17] [--repeat 3] [--record]
[--record-to cpu_qwen2.5_label_rule_cost.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from _common import ROOT, matmul_peak, plain, save

MODEL = "qwen2.5-coder-0.5b"
# the label rule's steps (catalog.labels.operator_labels.label_operator), by the function timed
STEPS = {"score": "scores", "label": "value rule", "hold": "residuals", "gate": "gate",
         "rescued": "second pass (scores, value rule)", "explain_maps": "explanations"}
# the steps only the new rule runs: those that decide its labels, and the explanations it
# stores (descriptive: no label depends on them)
DECIDING = ("residuals", "gate", "second pass (scores, value rule)")


def explain_flops(fit, n_maps: int) -> float:
    """The FLOPs of the matrix products that ``OperandFit.explain`` runs on ``n_maps`` maps
    (``catalog.labels.fit_models.held_out_all``): per fold and map, a narrow model's
    [A_f | A_f G_f A_f]' t_f (4 w^2), a wide one's P_f t_f (2 w x the largest fold's
    cells); the sums per level and fold (scatters) and the fold means are left out."""
    total = 0.0
    for m in fit.models.values():
        folds, w = m.inverse.shape[0], m.width
        total += folds * (2.0 * m.inverse.shape[2] * w if m.wide else 4.0 * w * w)
    return total * n_maps


def main() -> None:  # noqa: C901
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hi", type=int, default=30)
    parser.add_argument("--shots", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=50)
    parser.add_argument("--layers", default=None)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--time-layers", default="0,8,16,20,23",
                        help="layers labelled --repeat times for the timing (once elsewhere)")
    parser.add_argument("--warmup", type=int, default=1,
                        help="untimed runs of both rules per timed layer before the timed ones")
    parser.add_argument("--record", action="store_true")
    parser.add_argument("--record-to", default="cpu_qwen2.5_label_mechanism.json",
                        help="the file under bench/recorded that --record writes")
    args = parser.parse_args()

    from catalog.config import ScienceConfig
    from catalog.core.maps import kv_map
    from catalog.labels import enrichment, operator_labels
    from catalog.labels.matches import Matches
    from catalog.run.checkpoint import CheckpointRun, constant_maps
    from catalog.sources import load_model

    config = ScienceConfig(operators=("+",), operand_hi=args.hi, shots=args.shots,
                           pairs_per_op=args.pairs, patching=("attribution",), exact="none",
                           spectra=False, faithfulness_protocols=("paper",))
    before = dataclasses.replace(config, result_beyond_operands=False)
    t0 = time.perf_counter()
    lm = load_model(MODEL)
    layers = None if args.layers is None else [int(x) for x in args.layers.split(",")]
    run = CheckpointRun(lm.model, lm.tokenizer, config, layers=layers).prepare(progress=True)
    idx = run.table.op_index("+")
    prepared_s = time.perf_counter() - t0
    ranks, labels = {}, {"new": {}, "old": {}}
    moved = {"old_result": 0, "keeps_result": 0, "operand_only": 0, "none": 0}
    control = {"labelled": 0, "n": 0, "format_labelled": 0, "format_result": 0,
               "format_n": 0}
    # "rule": each run of the new rule less its explanations (a phase of their own)
    timing: dict[str, list] = {"new": [], "old": [], "rule": []}
    step_timing: dict[str, dict[str, float]] = {"new": {}, "old": {}}
    best_explanation = {"operands": 0, "result": 0, "rival": 0}
    agreement = {"labelled": 0, "agree": 0}
    explained_flops = 0.0  # the explanations' matrix products on the timed layers (one run)
    for layer in run.layers:
        res = run.run_layer(layer)
        d_mlp = res.rank.shape[0]
        ranks[layer] = res.rank
        c = res.label_control["+"]
        for k in control:
            control[k] += int(c[k])
        k_all = res.acts[idx].T
        live = np.nonzero(~constant_maps(k_all))[0]
        k_t = torch.as_tensor(k_all[live])
        kv_t = torch.as_tensor(kv_map(k_all[live], res.answer_lens[live][:, idx]))

        def label(cfg, fit, steps, k_t=k_t, kv_t=kv_t):
            def score(k_scored, kv_scored, orders, rescue):
                return Matches.concat(run._match(0, "+", k_scored, kv_scored, orders,
                                                 None if rescue else kv_t, rescue))

            def timed(phase, fn, *a):  # each step of the rule, by its function
                t = time.perf_counter()
                out = fn(*a)
                name = STEPS.get(getattr(fn, "__name__", phase), phase)
                steps[name] = steps.get(name, 0.0) + time.perf_counter() - t
                return out
            return operator_labels.label_operator(cfg, k_t, kv_t, score, run.n_tests["+"],
                                                  run.nulls["+"], fit, timed)
        per = {"new": [], "old": []}
        per_step: dict[str, dict[str, list[float]]] = {"new": {}, "old": {}}
        outs = {}
        timed_layer = layer in {int(x) for x in args.time_layers.split(",")}
        rules = [("new", config, run.fits["+"]), ("old", before, None)]
        # the first call on a layer's maps pays what later calls do not (pages touched
        # for the first time, allocations): whichever rule ran first paid it, and with an
        # odd --repeat the alternation gives one rule two first runs of three
        for _ in range(args.warmup if timed_layer else 0):
            for _name, cfg, fit in rules:
                label(cfg, fit, {})
        for rep in range(args.repeat if timed_layer else 1):
            # the rules alternate which runs first (the second of a pair ran up to 10%
            # faster in one process)
            for name, cfg, fit in (rules if rep % 2 == 0 else rules[::-1]):
                steps: dict[str, float] = {}
                t = time.perf_counter()
                outs[name] = label(cfg, fit, steps)
                per[name].append(time.perf_counter() - t)
                for k, v in steps.items():
                    per_step[name].setdefault(k, []).append(v)
        if timed_layer:  # K and KV maps of each explained map
            explained_flops += explain_flops(run.fits["+"], 2 * len(outs["new"].labelled))
            for name in per:
                timing[name].append(per[name])
                for k, v in per_step[name].items():
                    step_timing[name][k] = step_timing[name].get(k, 0.0) + statistics.median(v)
            ex_runs = per_step["new"].get("explanations", [0.0] * len(per["new"]))
            timing["rule"].append([t - e for t, e in zip(per["new"], ex_runs, strict=True)])
        # the label against the comparison stored beside it (issue 78): every map with a
        # result label must have no rival that predicts it better, held out
        out = outs["new"]
        m = out.matches
        is_r = np.array([h.target == "result" for h in m.heuristics] or [False])[m.heuristic]
        standing = np.unique(m.neuron[m.implements & is_r])
        at = np.searchsorted(out.labelled, standing)
        assert np.all(out.labelled[at] == standing)
        ok = (np.nan_to_num(out.kv.other[at], nan=-np.inf).astype(np.float32)
              <= np.nan_to_num(out.kv.joint[at], nan=-np.inf).astype(np.float32))
        agreement["labelled"] += int(len(standing))
        agreement["agree"] += int(ok.sum())
        masks = {}
        for name, out in outs.items():
            m = out.matches
            m.neuron = live[m.neuron]
            mask = enrichment.label_masks(m, d_mlp, 1)
            target = np.array([h.target for h in m.heuristics] or [""])[m.heuristic]
            for t_name, sel in (("result target", target == "result"),
                                ("operand target", target != "result")):
                mk = np.zeros((d_mlp, 1), dtype=bool)
                mk[m.neuron[m.implements & sel], 0] = True
                mask[t_name] = mk
            labels[name][layer] = mask
            masks[name] = mask
        old_r = masks["old"]["result target"][:, 0]
        new_r = masks["new"]["result target"][:, 0]
        new_any = masks["new"]["any"][:, 0]
        moved["old_result"] += int(old_r.sum())
        moved["keeps_result"] += int((old_r & new_r).sum())
        moved["operand_only"] += int((old_r & ~new_r & new_any).sum())
        moved["none"] += int((old_r & ~new_any).sum())
        ex = outs["new"].kv  # descriptive: the held-out R^2 of each explanation
        best = np.where(np.nan_to_num(ex.other, nan=-np.inf) > ex.joint, "rival",
                        np.where(ex.joint - ex.operands < 0.01, "operands", "result"))
        for k in best_explanation:
            best_explanation[k] += int((best == k).sum())
        run.release(layer)
        print(f"layer {layer}: old result labels {int(old_r.sum())}, kept "
              f"{int((old_r & new_r).sum())}; new any {int(new_any.sum())}; "
              f"labelling {statistics.median(per['new']):.1f} s new, "
              f"{statistics.median(per['old']):.1f} s old", flush=True)
    tables = {name: enrichment.enrichment(ranks, labels[name], ("+",),
                                          config.top_set_fraction, config.seed)
              for name in labels}
    peak = matmul_peak("cpu", torch.float32)  # after the timing: it heats the cores
    explain_s = step_timing["new"].get("explanations", 0.0)
    new_s = sum(statistics.median(x) for x in timing["new"])
    old_s = sum(statistics.median(x) for x in timing["old"])
    rule_s = sum(statistics.median(x) for x in timing["rule"])
    totals = {name: [sum(x[i] for x in timing[name]) for i in range(args.repeat)]
              for name in timing}
    result = {
        "model": MODEL, "config": {"ops": "+", "hi": args.hi, "shots": args.shots,
                                   "pairs": args.pairs, "ranking": "attribution, trimmed"},
        "layers": run.layers, "accuracy": float(run.table.correct[idx].mean()),
        "prepare_s": round(prepared_s, 1),
        "pooled": {name: [r for r in rows if r["layer"] == "all"]
                   for name, rows in tables.items()},
        "per_layer_any": {name: [{k: r[k] for k in ("layer", "share_top", "share_random",
                                                     "fisher_p", "n_top")}
                                 for r in rows if r["family"] == "any" and r["layer"] != "all"]
                          for name, rows in tables.items()},
        "old_result_labels_moved": moved,
        "new_rule_kv_best_held_out_explanation_of_value_labelled_maps": best_explanation,
        "new_rule_label_agrees_with_stored_comparison": agreement,
        "controls_new_rule": control,
        "labelling_seconds": {"new_median_sum": round(new_s, 2),
                              "old_median_sum": round(old_s, 2),
                              "added_share": round(new_s / old_s - 1, 3),
                              # the rule as the run clocks it: the labelling less the
                              # explanations (their own phase of the run, "explanations")
                              "rule_median_sum": round(rule_s, 2),
                              "rule_added_share": round(rule_s / old_s - 1, 3),
                              "new_totals": [round(x, 2) for x in totals["new"]],
                              "rule_totals": [round(x, 2) for x in totals["rule"]],
                              "old_totals": [round(x, 2) for x in totals["old"]],
                              "repeat": args.repeat, "layers": args.time_layers,
                              "steps_median_sum": {n: {k: round(v, 2) for k, v in st.items()}
                                                   for n, st in step_timing.items()},
                              # the new rule's own steps (medians summed) over the old
                              # rule's labelling: steady where the shared steps, timed
                              # twice, are not
                              "added_share_of_steps": round(sum(
                                  v for k, v in step_timing["new"].items()
                                  if k in DECIDING or k == "explanations") / old_s, 3),
                              "deciding_share": round(sum(
                                  step_timing["new"].get(k, 0.0) for k in DECIDING) / old_s, 3),
                              "explanations_share": round(
                                  step_timing["new"].get("explanations", 0.0) / old_s, 3),
                              "warmup": args.warmup,
                              "explanations_gflop": round(explained_flops / 1e9, 2),
                              "explanations_gflops": round(explained_flops / 1e9
                                                           / max(explain_s, 1e-9), 1),
                              "float32_matmul_peak_gflops": round(peak / 1e9, 1),
                              "explanations_share_of_peak": round(
                                  explained_flops / max(explain_s, 1e-9) / peak, 3)},
        "threads": torch.get_num_threads(),
    }
    if args.record:
        path = ROOT / "bench" / "recorded" / args.record_to
        path.write_text(json.dumps(result, indent=1, default=plain) + "\n")
        print(f"recorded {Path(path).relative_to(ROOT)}")
    save("label_mechanism", result)


if __name__ == "__main__":
    main()
