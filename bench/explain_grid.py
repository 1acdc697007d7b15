"""Prompts explained over a whole grid (catalog.explain.grid): the figures issue 47 asks for,
on a real model and on the built-in one.

One checkpoint run (attribution patching, the config's label rule, every layer unless
--layers), then:

- the checkpoint summary's aggregate (``Summary.prompt_explanations``: the knockout's
  prompts, as every catalogued checkpoint stores it) and the paper's prompt knockout;
- the same aggregate over EVERY correct prompt of the operator that no solved example
  answers (the grid-wide figure);
- three worked prompts, one per outcome: the correct prompt whose answer the labelled
  neurons that hold carry most, the correct prompt they carry least, and a prompt the
  model answers wrong; each explained with its knockout (5 random draws), as
  ``ncat explain`` prints it.

Run: .venv/bin/python bench/explain_grid.py [--model qwen2.5-coder-0.5b] [--hi 30]
     [--shots 3] [--layers 12,13] [--record]
(writes bench/results/explain_grid_<model>.json and .txt; --record also to bench/recorded/)
"""

from __future__ import annotations

import argparse
import pickle
import shutil
import time

import numpy as np

from _common import RESULTS, ROOT, save


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--op", default="+")
    parser.add_argument("--hi", type=int, default=30)
    parser.add_argument("--shots", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=50)
    parser.add_argument("--layers", default=None)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--grid-prompts", type=int, default=None,
                        help="explain at most this many correct prompts grid-wide (evenly "
                             "spaced, at least 1; default: all)")
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()

    from catalog.circuits import paper
    from catalog.circuits.knockouts import widen, zeroed_answers
    from catalog.config import ScienceConfig
    from catalog.config.settings import get_settings
    from catalog.explain.grid import PARTS, explain_prompts, summarize_prompts
    from catalog.explain.holds import labels_of, typical_of
    from catalog.explain.prompt import explain
    from catalog.measuring.grids import PrefixRunner
    from catalog.run.checkpoint import CheckpointRun
    from catalog.sources import load_model, registry
    from jobs.cli.explaining import render

    if args.model in registry.KNOWN:
        registry.fetch(args.model, get_settings().ncat_home)
    config = ScienceConfig(operators=(args.op,), operand_hi=args.hi, shots=args.shots,
                           pairs_per_op=args.pairs, patching=("attribution",), exact="none",
                           spectra=False, faithfulness_protocols=("paper",))
    t0 = time.perf_counter()
    lm = load_model(args.model)
    load_s = time.perf_counter() - t0
    layers = None if args.layers is None else [int(x) for x in args.layers.split(",")]
    t0 = time.perf_counter()
    run = CheckpointRun(lm.model, lm.tokenizer, config, layers=layers).prepare(progress=True)
    digests = {}
    for layer in run.layers:
        digests[layer] = run.run_layer(layer).digest(config.rank_sign)
        print(f"layer {layer} done, {time.perf_counter() - t0:.0f} s", flush=True)
    layers_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    summary = run.summarize_digests(digests)
    summary_s = time.perf_counter() - t0
    labels = labels_of({k: d.matches for k, d in digests.items()}, 0)
    typical, typical_kv = typical_of(digests, 0)
    n_layers = lm.model.cfg.n_layers
    eff = np.full((n_layers, run.d_mlp), -np.inf)
    for layer, d in digests.items():
        eff[layer] = np.nan_to_num(d.effect[:, 0], nan=-np.inf)
    top_set = paper.top_k_mask(eff, paper.circuit_sizes(run.d_mlp, (
        config.top_set_fraction,))[0])
    top_set &= np.isin(np.arange(n_layers), list(digests))[:, None]
    RESULTS.mkdir(parents=True, exist_ok=True)
    with open(RESULTS / f"explain_grid_{args.model.replace('/', '_')}_labels.pkl", "wb") as f:
        pickle.dump(labels, f)  # for a later look at the same labels
    table = run.table
    idx = table.op_index(args.op)
    assert table.correct is not None and table.is_shot is not None
    correct = idx[table.correct[idx] & ~table.is_shot[idx]]
    n_correct = len(correct)
    if args.grid_prompts is not None and args.grid_prompts < len(correct):
        keep = np.linspace(0, len(correct) - 1, max(args.grid_prompts, 1)).round()
        correct = correct[np.unique(keep.astype(int))]
    wrong = idx[~table.correct[idx] & ~table.is_shot[idx]]
    t0 = time.perf_counter()
    runner = PrefixRunner(lm.model, table)

    def evaluate(mask, values=None, rows=None):
        mask, values = widen(mask, values, rows, len(correct))
        got = zeroed_answers(lm.model, table, correct, mask, runner, values)
        return got if rows is None else tuple(x[rows] for x in got)

    terms = explain_prompts(lm.model, lm.tokenizer, config, args.op, table.a[correct],
                            table.b[correct], labels, typical=typical, typical_kv=typical_kv,
                            evaluate=evaluate, top_set=top_set, batch=args.batch)
    grid_s = time.perf_counter() - t0
    grid = summarize_prompts(terms, run.layers)
    share = terms.shares[PARTS[0]]
    ok = terms.target > 0
    picks = {"carried by labelled neurons that hold":
             int(np.nanargmax(np.where(ok, share, -np.inf))),
             "carried least by them": int(np.nanargmin(np.where(ok, share, np.inf)))}
    worked, texts = {}, []
    prompts = {k: f"{terms.a[i]}{args.op}{terms.b[i]}=" for k, i in picks.items()}
    if len(wrong):
        w = wrong[len(wrong) // 2]
        prompts["answered wrong"] = f"{table.a[w]}{args.op}{table.b[w]}="
    for kind, text in prompts.items():
        e = explain(lm.model, lm.tokenizer, text, config, labels=labels, top=8, seeds=5,
                    typical=typical, typical_kv=typical_kv, top_set=top_set)
        worked[kind] = e.to_dict()
        texts.append(f"## {kind}: {text}\n\n" + render(
            e, f"{lm.info.name}", f"labels of {len(labels)} neurons, layers {run.layers}"))
    name = args.model.replace("/", "_")
    out = {"model": lm.info.name, "config": {"op": args.op, "hi": args.hi,
                                             "shots": args.shots, "pairs": args.pairs},
           "layers": run.layers, "accuracy": summary.accuracy,
           "n_correct": int(n_correct), "n_grid_prompts": int(len(correct)),
           "n_wrong": int(len(wrong)),
           "summary_prompt_explanations": summary.prompt_explanations,
           "prompt_knockout": summary.prompt_knockouts,
           "grid_prompt_explanations": grid,
           "worked": {k: {"prompt": v["prompt"], "correct": v["correct"],
                          "shares": v["shares"], "n_for": v["n_for"],
                          "shares_total": v["shares_total"], "share_adds": v["share_adds"],
                          "knockout": v["knockout"]} for k, v in worked.items()},
           "seconds": {"load": round(load_s, 1), "prepare and layers": round(layers_s, 1),
                       "summary": round(summary_s, 1),
                       "grid explanations": round(grid_s, 1),
                       **{f"summary: {k}": round(v, 1) for k, v in summary.seconds.items()}},
           "threads": __import__("torch").get_num_threads()}
    save(f"explain_grid_{name}", out)
    path = RESULTS / f"explain_grid_{name}.json"
    txt = RESULTS / f"explain_grid_{name}.txt"
    txt.write_text("\n\n".join(texts) + "\n")
    print(txt.read_text())
    if args.record:
        rec = ROOT / "bench" / "recorded"
        shutil.copy(path, rec / f"cpu_explain_grid_{name}.json")
        shutil.copy(txt, rec / f"cpu_explain_grid_{name}.txt")


if __name__ == "__main__":
    main()
