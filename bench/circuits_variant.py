"""A checkpoint's circuits again under other circuit settings, from a stored catalog.

The layers (effects, attribution, labels) are read back from the catalog that
``bench/real_model.py`` (or ``ncat catalog``) wrote; only the summary runs again, with the
circuit fields changed (``--heads``, ``--late-from``, ``--protocols``, ``--context``,
``--population``), and is timed by phase. Nothing is written. It answers "is this curve
capped by the heads the protocol ablates?" without measuring the layers again.

Run: .venv/bin/python bench/circuits_variant.py DATABASE_URL [--model qwen2.5-coder-0.5b]
     [--hi 30] [--ops +] [--shots 3] [--pairs 50] [--exact top:50] --heads 336
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("url")
    p.add_argument("--model", default="qwen2.5-coder-0.5b")
    p.add_argument("--hi", type=int, default=30)
    p.add_argument("--ops", default="+")
    p.add_argument("--shots", type=int, default=3)
    p.add_argument("--pairs", type=int, default=50)
    p.add_argument("--exact", default="top:50")
    p.add_argument("--config-id", type=int, default=None,
                   help="the stored config to read (default: the one the flags above make)")
    p.add_argument("--stored-protocols", default="paper,all-layers",
                   help="the protocols of the stored config (it is part of its hash)")
    p.add_argument("--mean-prompts", type=int, default=None)
    p.add_argument("--protocols", default="paper")
    p.add_argument("--heads", default="auto")
    p.add_argument("--late-from", default="auto")
    p.add_argument("--context", default="all")
    p.add_argument("--population", default="grid")
    args = p.parse_args()

    from catalog.config import ScienceConfig
    from catalog.run.checkpoint import CheckpointRun
    from catalog.sources import load_model
    from jobs.store_results import register, stored_digests
    from schema import reads, store

    t = time.perf_counter()
    stored = ScienceConfig(operators=tuple(args.ops), operand_hi=args.hi, shots=args.shots,
                           pairs_per_op=args.pairs, exact=args.exact,
                           faithfulness_protocols=tuple(args.stored_protocols.split(",")))
    lm = load_model(args.model)
    load_s = time.perf_counter() - t
    with store.connect(args.url) as conn:
        if args.config_id is not None:
            stored = ScienceConfig.from_dict(store.scalar(conn.execute(
                "SELECT config FROM measure_config WHERE id = %s", (args.config_id,))))
        ids = register(conn, lm, stored)
        layers = sorted(reads.stored_layers(conn, checkpoint_id=ids.checkpoint_id,
                                            config_id=ids.config_id))
        if not layers:
            raise SystemExit(f"nothing stored for {args.model} under that config at {args.url}")
        digests = stored_digests(conn, ids, stored, layers, lm.model.cfg.d_mlp)
    variant = dataclasses.replace(
        stored, faithfulness_protocols=tuple(args.protocols.split(",")), heads_kept=args.heads,
        late_from=args.late_from, ablate_context=args.context, mean_population=args.population,
        mean_prompts=stored.mean_prompts if args.mean_prompts is None else args.mean_prompts)
    run = CheckpointRun(lm.model, lm.tokenizer, variant, layers=layers)
    t = time.perf_counter()
    run.prepare(progress=False)
    prepare_s = time.perf_counter() - t
    t = time.perf_counter()
    summary = run.summarize_digests(digests)
    summary_s = time.perf_counter() - t
    out = {"load_s": round(load_s, 1), "prepare_s": round(prepare_s, 1),
           "summary_s": round(summary_s, 1),
           "summary_phases_s": {k: round(v, 1) for k, v in summary.seconds.items()},
           "curves": []}
    for c in summary.curves:
        d = c.as_dict()
        out["curves"].append({
            "op": c.op, "protocol": c.protocol, "late_from": d["late_from"],
            "late_source": d["late_source"], "pruned": d["pruned"],
            "n_heads_kept": d["n_heads_kept"], "baselines": d["baselines"],
            "ranked_nl": c.curve("nl", "ratio_of_means"),
            "ranked_logprob": c.curve("logprob", "ratio_of_means"),
            "random_nl": c.curve("nl", "ratio_of_means", "random"),
            "reversed_nl": c.curve("nl", "ratio_of_means", "reversed"),
            "se_nl": [p["ratio_of_means_se"] for p in c.points
                      if p["metric"] == "nl" and p["circuit"] == "ranked"],
            "areas_nl": {k: v["nl"]["ratio_of_means"] for k, v in c.areas.items()}})
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
