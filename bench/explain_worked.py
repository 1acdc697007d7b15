"""The worked prompts of bench/explain_grid.py again, from the labels that run saved
(bench/results/explain_grid_<model>_labels.pkl): each explained with its knockout (5 random
draws), as ``ncat explain`` prints it, without measuring the model's layers again.

Run: .venv/bin/python bench/explain_worked.py 23+29= 8+2= 13+27= [--model qwen2.5-coder-0.5b]
     [--hi 30] [--shots 3] [--record]
(rewrites the record's worked prompts: bench/recorded/cpu_explain_grid_<model>.json, .txt)
"""

from __future__ import annotations

import argparse
import json
import pickle

from _common import RESULTS, ROOT


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prompts", nargs="+")
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--op", default="+")
    parser.add_argument("--hi", type=int, default=30)
    parser.add_argument("--shots", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=50)
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()

    from catalog.config import ScienceConfig
    from catalog.explain.prompt import explain
    from catalog.sources import load_model
    from jobs.cli.explaining import render

    name = args.model.replace("/", "_")
    with open(RESULTS / f"explain_grid_{name}_labels.pkl", "rb") as f:
        labels = pickle.load(f)  # noqa: S301 (written by bench/explain_grid.py here)
    config = ScienceConfig(operators=(args.op,), operand_hi=args.hi, shots=args.shots,
                           pairs_per_op=args.pairs, patching=("attribution",), exact="none",
                           spectra=False, faithfulness_protocols=("paper",))
    lm = load_model(args.model)
    layers = sorted({layer for layer, _ in labels})
    where = ROOT / "bench" / "recorded" if args.record else RESULTS
    record = json.loads((where / f"cpu_explain_grid_{name}.json").read_text()) \
        if args.record else {}
    kinds = list(record.get("worked", {})) or [f"prompt {i + 1}" for i in
                                               range(len(args.prompts))]
    worked, texts = {}, []
    for kind, text in zip(kinds, args.prompts, strict=True):
        e = explain(lm.model, lm.tokenizer, text, config, labels=labels, top=8, seeds=5)
        d = e.to_dict()
        worked[kind] = {"prompt": d["prompt"], "correct": d["correct"], "shares": d["shares"],
                        "n_for": d["n_for"], "knockout": d["knockout"]}
        texts.append(f"## {kind}: {text}\n\n" + render(
            e, lm.info.name, f"labels of {len(labels)} neurons, layers {layers}"))
    print("\n\n".join(texts))
    if args.record:
        record["worked"] = worked
        (where / f"cpu_explain_grid_{name}.json").write_text(json.dumps(record, indent=2))
        (where / f"cpu_explain_grid_{name}.txt").write_text("\n\n".join(texts) + "\n")


if __name__ == "__main__":
    main()
