"""The label rule's second pass, scored per (map, set) pair against scoring every result
heuristic of each pair's map and keeping its set's rows.

The second pass (catalog.labels.operator_labels.rescued) makes one map per (map, set)
pair: the KV map less the operands' part of its joint fit with that one set, of which
only that set's heuristics' rows are kept. It used to score every result heuristic of
every labelable partition on each such map (``score_partitions``, the naive reference
here: sorts and value histograms of every partition); it now counts the top cells of the
pair's own heuristics alone (``catalog.labels.pair_scores``). Both run in this process on
the same pairs, alternating which goes first, median of ``--repeat``; every row (score,
p-value, side, order) must be equal, or the bench stops.

Built-in model (the demo's config: + - * / on [0, 100), final checkpoint, one math thread
as in the tests) by default; ``--model qwen2.5-coder-0.5b --hi 30 --ops + --layers
16,20,23`` for the issue-45 cost layers.

Run: .venv/bin/python bench/second_pass.py [--threads 1] [--repeat 3] [--record]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import numpy as np

from _common import ROOT, plain, save


def one_operator(run, config, o: int, op: str, acts, answer, repeat: int
                 ) -> tuple[dict[str, list[float]], int, int]:
    """Both ways of the second pass on one operator's live maps of a layer, alternating
    which runs first, ``repeat`` times: (seconds per way, pairs screened in, rows). Stops
    the bench where the rows differ."""
    import torch

    from catalog.core.maps import kv_map
    from catalog.labels import gate, operator_labels, value_null
    from catalog.labels.matches import Matches
    from catalog.run.checkpoint import constant_maps

    idx = run.table.op_index(op)
    k_all = acts[idx].T
    live = np.nonzero(~constant_maps(k_all))[0]
    k_t = torch.as_tensor(k_all[live])
    kv_t = torch.as_tensor(kv_map(k_all[live], answer[live][:, idx]))
    fit, null, n_tests = run.fits[op], run.nulls[op], run.n_tests[op]

    def pairs_score(k, kv, orders, rescue):
        return Matches.concat(run._match(o, op, k, kv, orders, None if rescue else kv_t,
                                         rescue))

    def every_score(k, kv, orders, rescue):
        if rescue and getattr(rescue, "pairs", None) is not None:
            rescue = dataclasses.replace(rescue, pairs=None)
        return pairs_score(k, kv, orders, rescue)

    orders: dict = {}
    m = pairs_score(k_t, kv_t, orders, False)
    m = value_null.label(m, config, n_tests, null, k_t, kv_t, orders)
    reach = config.significance_level / max(n_tests, 1)
    per: dict[str, list[float]] = {"pairs": [], "every": []}
    fit.hold(kv_t, k_t)
    try:
        m, fitting = gate.gate(m, fit, kv_t, k_t, reach)
        got = {}
        for rep in range(repeat):
            for name in ("pairs", "every") if rep % 2 == 0 else ("every", "pairs"):
                score = pairs_score if name == "pairs" else every_score
                t = time.perf_counter()
                got[name] = operator_labels.rescued(fitting, config, kv_t, k_t, score,
                                                    n_tests, null, fit, reach)
                per[name].append(time.perf_counter() - t)
        todo = np.setdiff1d(np.arange(len(kv_t)), fitting)
        pairs = fit.may_label(kv_t, k_t, reach, todo) if len(todo) else None
    finally:
        fit.release()
    a, b = got["pairs"], got["every"]
    for f in ("neuron", "heuristic", "score", "bottom", "p_value", "implements"):
        if not np.array_equal(getattr(a, f), getattr(b, f)):
            raise SystemExit(f"{op}: rows differ in {f}")
    if [h.key for h in a.heuristics] != [h.key for h in b.heuristics]:
        raise SystemExit(f"{op}: heuristic lists differ")
    return per, 0 if pairs is None else int(pairs.sum()), len(a)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin")
    parser.add_argument("--hi", type=int, default=100)
    parser.add_argument("--ops", default="+-*/")
    parser.add_argument("--layers", default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()

    import torch

    from catalog.config import ScienceConfig
    from catalog.measuring.lens import lens_at
    from catalog.run.checkpoint import CheckpointRun
    from catalog.sources import load_model

    torch.set_num_threads(args.threads)
    ops = tuple(args.ops)
    config = ScienceConfig(operators=ops, operand_hi=args.hi)
    if args.model != "builtin":
        config = dataclasses.replace(config, shots=3, pairs_per_op=50,
                                     patching=("attribution",), exact="none", spectra=False,
                                     faithfulness_protocols=("paper",))
    lm = load_model(args.model, progress=False)
    layers = None if args.layers is None else [int(x) for x in args.layers.split(",")]
    run = CheckpointRun(lm.model, lm.tokenizer, config, layers=layers).prepare()
    times: dict[str, list[float]] = {"pairs": [], "every": []}
    n_pairs = n_rows = 0
    for layer in run.layers:
        acts = run.activations(layer)
        answer = lens_at(run.model, layer, run.table.answer)
        per: dict[str, list[float]] = {"pairs": [], "every": []}
        for o, op in enumerate(ops):
            got, pairs, rows = one_operator(run, config, o, op, acts, answer, args.repeat)
            for name in per:
                per[name].extend(got[name])
            n_pairs, n_rows = n_pairs + pairs, n_rows + rows
        for name in times:
            # per layer: the median over repeats of the operators' sum
            reps = np.array(per[name]).reshape(len(ops), args.repeat).sum(0)
            times[name].append(float(statistics.median(reps)))
        run.release(layer)
        print(f"layer {layer}: pairs {times['pairs'][-1]:.3f} s, "
              f"every heuristic {times['every'][-1]:.3f} s", flush=True)
    total = {k: sum(v) for k, v in times.items()}
    result = {
        "model": args.model, "ops": args.ops, "hi": args.hi, "layers": run.layers,
        "threads": args.threads, "repeat": args.repeat, "pairs_screened_in": n_pairs,
        "rows_labelled": n_rows,
        "seconds_per_layer": {k: [round(x, 3) for x in v] for k, v in times.items()},
        "seconds": {k: round(v, 3) for k, v in total.items()},
        "speedup": round(total["every"] / max(total["pairs"], 1e-9), 2),
        "rows_equal": True,
    }
    print(json.dumps(result, indent=1))
    if args.record:
        name = f"cpu_second_pass_{args.model.split('-')[0]}.json"
        (ROOT / "bench" / "recorded" / name).write_text(
            json.dumps(result, indent=1, default=plain) + "\n")
    save("second_pass", result)


if __name__ == "__main__":
    main()
