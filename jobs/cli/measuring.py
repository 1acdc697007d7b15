"""Commands that compute: train the built-in model, list checkpoints, measure, catalog."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from catalog.core.arith import OPERATORS
from jobs.cli.common import (
    Report,
    checkpoints_option,
    database_option,
    database_url,
    execution_from,
    execution_options,
    fail,
    json_option,
    loads_model,
    parse_layers,
    science_from,
    science_options,
)
from schema.jobs import at_checkpoint

MODEL_HELP = ("'builtin', a known model fetched with `ncat fetch` (e.g. qwen2.5-coder-0.5b), a "
              "hub name, a local HF directory or a .gguf file")


def print_result(res, top: int = 5, out=sys.stdout) -> None:
    """Readable summary of a CheckpointResult: accuracy, faithfulness, top neurons per layer."""
    import numpy as np

    ops = res.config.operators
    if res.summary:
        s = res.summary
        if res.numbers.digit_level:
            print("digit-level tokenizer: result heuristics are about the full result, KV maps "
                  "and patching about its first digit (the answer token)", file=out)
        print(f"summary over layers {s.layers}", file=out)
        print("accuracy:   " + "  ".join(f"{op} {s.accuracy[op]:.3f} ({s.n_correct[op]} correct)"
                                         for op in ops), file=out)
        print("pairs used: " + "  ".join(f"{op} {s.n_pairs[op]}" for op in ops)
              + "  (correct prompts only; solved examples left out: "
              + ", ".join(f"{op} {s.n_excluded[op]}" for op in ops) + ")", file=out)
        for op in ops:
            curve = ", ".join(f"k={k}: {f:.2f}" for k, f in s.faithfulness[op])
            paper = ", ".join(f"{f:.2f}" for _, f in s.faithfulness_mean_ratio.get(op, []))
            print(f"faithfulness {op} (ratio of means of the normalised logit): {curve}"
                  + (f"  [the paper's mean of ratios: {paper}]" if paper else ""), file=out)
    for layer, lr in sorted(res.layers.items()):
        m = lr.matches
        print(f"\nlayer {layer}: {len(m)} heuristic scores >= {res.config.score_floor}, "
              f"{int(m.implements.sum())} labels ((neuron, heuristic) pairs) on "
              f"{len(np.unique(m.neuron[m.implements]))} neurons "
              f"({res.config.label_rule} rule)", file=out)
        for o, op in enumerate(ops):
            facts = lr.patching[op]
            if facts.get("spearman") is not None:
                print(f"  {op}: exact on {facts['n_exact']} neurons, Spearman with "
                      f"attribution {facts['spearman']:.2f}", file=out)
            for r in top_neurons(lr, o, top):
                best = "(no label)" if not r["constant"] else "(constant: never labelled)"
                if r["label"] is not None:
                    side = "bottom-k " if r["bottom"] else ""
                    best = (f"{side}{r['label']} ({r['score']:.2f}, base rate "
                            f"{r['base_rate']:.2f}, p={r['p_value']:.1e})")
                kind = "exact" if r["exact"] else "attr"
                print(f"  {op} neuron {r['neuron']:5d}  {res.config.rank_statistic} effect "
                      f"{r['effect']:9.4f} ({kind})  {best}", file=out)


def top_neurons(lr, o: int, top: int) -> list[dict]:
    """A layer's ``top`` neurons by rank for operator index ``o``, each with its effect and
    its best label (None where it has none)."""
    import numpy as np

    m = lr.matches
    out = []
    for n in np.argsort(lr.rank[:, o])[:top]:
        sel = (m.neuron == n) & (m.op == o) & m.implements
        row = {"neuron": int(n), "effect": float(lr.rank_value[n, o]),
               "exact": bool(lr.is_exact[n, o]), "constant": bool(lr.constant[n, o]),
               "label": None}
        if sel.any():
            i = np.nonzero(sel)[0][np.argmax(m.score[sel])]
            row.update(label=m.row_heuristic(i).label, bottom=bool(m.bottom[i]),
                       score=float(m.score[i]), base_rate=float(m.base_rate[i]),
                       p_value=float(m.p_value[i]))
        out.append(row)
    return out


def result_data(res, top: int = 5) -> dict:
    """What print_result shows, as ``--json`` prints it."""
    import numpy as np

    ops = list(res.config.operators)
    s = res.summary
    summary = None if not s else {
        "layers": s.layers, "accuracy": s.accuracy, "n_correct": s.n_correct,
        "n_pairs": s.n_pairs, "n_excluded": s.n_excluded,
        "faithfulness": {op: [[k, f] for k, f in s.faithfulness[op]] for op in ops}}
    layers = {}
    for layer, lr in sorted(res.layers.items()):
        m = lr.matches
        layers[str(layer)] = {
            "scores": len(m), "labels": int(m.implements.sum()),
            "labelled_neurons": len(np.unique(m.neuron[m.implements])),
            "top": {op: top_neurons(lr, o, top) for o, op in enumerate(ops)}}
    return {"config_hash": res.config.config_hash(), "summary": summary, "layers": layers}


def parse_seeds(text: str) -> list[int]:
    """``--seeds``: '0,1,2' or '0:3' (start:stop)."""
    try:
        if ":" in text:
            lo, hi = (int(x) for x in text.split(":"))
            seeds = list(range(lo, hi))
        else:
            seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--seeds must be '0,1,2' or 'start:stop', got {text!r}") from None
    if not seeds or min(seeds) < 0:
        raise ValueError(f"--seeds must name at least one seed >= 0, got {text!r}")
    return sorted(set(seeds))


def cmd_train_builtin(args) -> int:
    try:
        seeds = parse_seeds(args.seeds) if args.seeds else [args.seed]
        if args.steps is not None and args.steps < 1:
            raise ValueError(f"--steps must be at least 1, got {args.steps}")
    except ValueError as exc:
        return fail(str(exc))
    from catalog import builtin

    out = Report(args)
    for seed in seeds:
        cfg = builtin.TrainConfig(**({"steps": args.steps} if args.steps else {}), seed=seed)
        adopted = bool(args.reuse_from and builtin.adopt(
            cfg, Path(args.reuse_from).expanduser() / "builtin"))
        if adopted:
            out.say(f"{builtin.model_name(cfg)}: the finished run in {args.reuse_from} taken "
                    "(same settings, weights checked against their record): no training")
        path = builtin.train(cfg, progress=not args.quiet)
        meta = json.loads((path / f"step{cfg.steps}.json").read_text())
        acc = meta["heldout_accuracy"]
        out.say(f"{builtin.model_name(cfg)} (seed {seed}): checkpoints in {path}: steps "
                f"{builtin.available_steps(cfg)}")
        out.say("held-out accuracy: " + "  ".join(f"{op} {acc[op]:.3f}" for op in OPERATORS))
        out.add("models", {"name": builtin.model_name(cfg), "seed": seed, "path": str(path),
                           "steps": builtin.available_steps(cfg), "adopted": adopted,
                           "heldout_accuracy": acc})
    out.emit()
    return 0


def cmd_fetch(args) -> int:
    from catalog.config.settings import get_settings
    from catalog.sources import registry

    out = Report(args)
    if args.list or not args.name:
        for m in registry.KNOWN.values():
            have = registry.fetched_path(m.name, get_settings().ncat_home)
            where = f"fetched: {have}" if have else "not fetched"
            out.say(f"{m.name}  ({m.size:,} bytes; {where})\n    {m.about}")
            out.add("models", {"name": m.name, "bytes": m.size, "about": m.about,
                               "fetched": None if not have else str(have)})
        out.emit()
        return 0
    try:
        path = registry.fetch(args.name, get_settings().ncat_home, progress=not args.quiet)
    except registry.FetchError as exc:
        return fail(str(exc))
    out.say(f"{args.name}: {path} (size and SHA-256 verified); measure it as "
            f"`ncat measure {args.name} ...`")
    out.put(name=args.name, path=str(path))
    out.emit()
    return 0


def cmd_checkpoints(args) -> int:
    from catalog.sources import ModelSourceError, list_checkpoints

    try:
        steps = list_checkpoints(args.model)
    except ModelSourceError as exc:
        return fail(str(exc))
    out = Report(args)
    out.say("no training checkpoints" if steps is None else " ".join(map(str, steps)))
    out.put(model=args.model, steps=steps)
    out.emit()
    return 0


def fitted_execution(shape, config, execution, n_layers: int, what: str):
    """``execution`` sized to the memory budget (what was lowered said on stderr);
    MemoryBudgetError (a ValueError: exit 2) where the request cannot fit."""
    from catalog.measuring.memory import fit_request

    fitted = fit_request(shape, config, execution, n_layers, what)
    if fitted.note:
        print(fitted.note, file=sys.stderr)
    return fitted.execution


def cmd_measure(args) -> int:
    from catalog.run.measurement import measure
    from catalog.sources import ModelSourceError, load_model
    from jobs.enqueue import validate_request

    try:
        config, execution = science_from(args), execution_from(args)
        layers = parse_layers(args.layers)
        # the cheap limits first, as catalog and enqueue check them (operand range against
        # the tokenizer, context length, layers): an operand range of a billion was
        # estimated for memory over 2 minutes before the token limit refused it
        (planned,) = validate_request(args.model, [args.checkpoint], config, layers)
        shape = planned.shape
        execution = fitted_execution(shape, config, execution,
                                     shape.n_layers if layers is None else len(set(layers)),
                                     f"measuring {args.model}")
        lm = load_model(args.model, args.checkpoint, device=execution.device,
                        dtype=config.torch_dtype(), progress=not args.quiet)
        t0 = time.perf_counter()
        res = measure(lm.model, lm.tokenizer, config, layers=layers, progress=not args.quiet,
                      provenance=lm.info.as_dict(), execution=execution)
    except (ModelSourceError, ValueError) as exc:
        return fail(str(exc))
    out = Report(args)
    out.say(f"{lm.info.name} step {lm.info.checkpoint}: measured in "
            f"{time.perf_counter() - t0:.1f} s ({len(res.table)} prompts); {lm.info.check}")
    print_result(res, out=sys.stderr if out.json else sys.stdout)
    out.put(model=lm.info.name, checkpoint=lm.info.checkpoint, prompts=len(res.table),
            check=lm.info.check, **result_data(res))
    out.emit()
    return 0


def cmd_catalog(args) -> int:
    """Measure checkpoints and write them to the database (no queue)."""
    from catalog.sources import ModelSourceError, load_model
    from jobs.enqueue import latest_first, validate_request
    from jobs.store_results import catalog_checkpoint
    from schema import reads, store
    from schema.engine import SchemaBehind, require_current

    out = Report(args)
    try:
        config, execution = science_from(args), execution_from(args)
        layers = parse_layers(args.layers)
        url = require_current(database_url(args))  # reads only: is the schema current?
        # every checkpoint, layer and the operand range checked (metadata and tokenizer,
        # weights' files readable) before anything is written
        planned = validate_request(args.model, args.checkpoints, config, layers)
        # latest first: every earlier checkpoint then measures the final circuit in its own
        # summary (catalog.circuits.final)
        planned = sorted(planned, key=lambda p: latest_first(p.step))
        stored = None
        def stored_before(name: str, step) -> bool:
            if args.force:
                return False
            with store.connect(url) as conn:
                have = reads.find_stored(conn, model_name=name, step=step,
                                         config_hash=config.config_hash())
            if have and have.covers(layers):
                out.say(f"{at_checkpoint(name, step)}: already in the catalog "
                        "(--force recomputes)")
                out.add("checkpoints", {"model": name, "step": step, "stored": "before"})
                return True
            return False

        for p in planned:
            name, step = p.model, p.step
            if stored_before(name, step):
                continue
            run_with = fitted_execution(p.shape, config, execution, len(p.layers),
                                        f"cataloguing {at_checkpoint(name, step)}")
            lm = load_model(args.model, step, device=execution.device,
                            dtype=config.torch_dtype(), progress=not args.quiet)
            # the final weights (no --checkpoints) are stored under the step they are
            # (the built-in model's last): known only once loaded
            if step is None and lm.info.checkpoint is not None and \
                    stored_before(name, lm.info.checkpoint):
                continue
            t0 = time.perf_counter()

            def resumed(done: list[int], _step=step, _name=name) -> None:
                out.say(f"{at_checkpoint(_name, _step)}: layers {done} are stored already "
                        "(an earlier run); computing the rest")

            ids = catalog_checkpoint(url, lm, config, layers=layers, progress=not args.quiet,
                                     execution=run_with, resume=not args.force,
                                     on_resume=resumed)
            out.say(f"{at_checkpoint(lm.info.name, step)}: stored in "
                    f"{time.perf_counter() - t0:.1f} s (checkpoint id {ids.checkpoint_id}, "
                    f"config id {ids.config_id}); {lm.info.check}")
            out.add("checkpoints", {"model": lm.info.name, "step": lm.info.checkpoint,
                                    "stored": "now",
                                    "checkpoint_id": ids.checkpoint_id,
                                    "config_id": ids.config_id, "check": lm.info.check})
            stored = ids
        if stored is not None:
            fill_final(url, stored.model_id, stored.config_id, execution, args.quiet, out)
    except (ModelSourceError, ValueError, SchemaBehind) as exc:
        return fail(str(exc))
    out.emit()
    return 0


def fill_final(url: str, model_id: int, config_id: int, execution, quiet: bool,
               out: Report) -> None:
    """The final circuit at the model's earlier checkpoints that lack it (jobs.final_circuits)."""
    from jobs import final_circuits
    from schema import store

    def said(step, seconds) -> None:
        if not quiet:
            out.say(f"step {step}: the final circuit measured in {seconds:.1f} s")

    with store.connect(url, autocommit=True) as conn:
        final_circuits.fill(conn, model_id=model_id, config_id=config_id, execution=execution,
                            on_checkpoint=said)


def cmd_final_circuit(args) -> int:
    """Measure the final checkpoint's circuit at every earlier catalogued checkpoint."""
    from catalog.sources import ModelSourceError
    from jobs.cli.serving import stored_name
    from schema import store, training
    from schema.engine import SchemaBehind, require_current

    try:
        url = require_current(database_url(args))
        name = stored_name(args.model)
        with store.connect(url) as conn:
            configs = training.circuit_configs(conn, model=name, config_id=args.config_id)
        if not configs:
            return fail(f"no catalogued checkpoint of {name!r} has a paper circuit"
                        + (f" under config {args.config_id}" if args.config_id else "")
                        + " (ncat catalog measures one)")
        out = Report(args)
        for model_id, config_id in configs:
            out.say(f"{name}, config {config_id}:")
            fill_final(url, model_id, config_id, execution_from(args), args.quiet, out)
    except (ModelSourceError, ValueError, SchemaBehind) as exc:
        return fail(str(exc))
    return 0


def add_commands(sub) -> None:
    s = sub.add_parser("train-builtin", help="train the built-in arithmetic model (cached)")
    s.add_argument("--steps", type=int, default=None, help="training steps (default 3000)")
    s.add_argument("--seed", type=int, default=0, help="seed of the training run")
    s.add_argument("--seeds", default=None,
                   help="several training runs, one model each: '0,1,2' or '0:3'; seed 0 is "
                        "builtin-arith, seed N builtin-arith@seedN (the views group them)")
    s.add_argument("--reuse-from", default=None, metavar="NCAT_HOME",
                   help="take a finished run with the same settings from this home's cache "
                        "(linked or copied, each checkpoint checked against its recorded "
                        "weights hash) instead of training; the test command passes the "
                        "user's home, so a demo's model is not trained twice")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    json_option(s)
    s.set_defaults(fn=cmd_train_builtin)

    s = sub.add_parser("final-circuit", help="measure the final checkpoint's circuit at every "
                                             "earlier catalogued checkpoint that lacks it")
    s.add_argument("model", help="the model's name in the catalog (e.g. builtin-arith)")
    s.add_argument("--config-id", type=int, default=None,
                   help="one config (default: every config with a paper circuit)")
    s.add_argument("--quiet", action="store_true", help="no progress lines")
    execution_options(s)
    database_option(s)
    s.set_defaults(fn=cmd_final_circuit)

    s = sub.add_parser("fetch", help="download, verify and cache a known model that no hub is "
                                     "needed for (ncat fetch --list shows them)")
    s.add_argument("name", nargs="?", help="a known model, e.g. qwen2.5-coder-0.5b")
    s.add_argument("--list", action="store_true", help="list the known models")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    json_option(s)
    s.set_defaults(fn=cmd_fetch)

    s = sub.add_parser("checkpoints", help="list a model's training checkpoints")
    s.add_argument("model", help=MODEL_HELP)
    json_option(s)
    loads_model(s)
    s.set_defaults(fn=cmd_checkpoints)

    s = sub.add_parser("measure", help="measure every neuron of one checkpoint, no database")
    s.add_argument("model", help=MODEL_HELP)
    s.add_argument("--checkpoint", type=int, default=None, help="training step")
    science_options(s)
    execution_options(s)
    json_option(s)
    loads_model(s)
    s.set_defaults(fn=cmd_measure)

    s = sub.add_parser("catalog", help="measure checkpoints and store them (no queue)")
    s.add_argument("model", help=MODEL_HELP)
    checkpoints_option(s)
    s.add_argument("--force", action="store_true",
                   help="recompute checkpoints the catalog holds already")
    database_option(s)
    science_options(s)
    execution_options(s)
    json_option(s)
    loads_model(s)
    s.set_defaults(fn=cmd_catalog)
