"""``ncat explain``: prompts of one checkpoint, explained (catalog.explain.prompt); several
prompts (arguments, or a file with one per line) share one model load."""

from __future__ import annotations

import json
import sys

from jobs.cli.common import (
    database_option,
    fail,
    loads_model,
    parse_layers,
    science_from,
    science_options,
)
from jobs.cli.measuring import MODEL_HELP


def add_commands(sub) -> None:
    s = sub.add_parser("explain", help="which neurons and heads carry one prompt's answer, "
                                       "with their labels where the checkpoint is catalogued")
    s.add_argument("model", help=MODEL_HELP)
    s.add_argument("prompt", nargs="*",
                   help="the arithmetic, e.g. '21+17=' (written under the config's template "
                        "and few-shot prefix, as the catalog measures it); several share "
                        "one model load")
    s.add_argument("--prompts-file", default=None,
                   help="a file with one prompt per line (blank lines and lines starting "
                        "with # skipped), explained after the prompts given as arguments")
    s.add_argument("--checkpoint", type=int, default=None, help="training step")
    s.add_argument("--config", default=None, metavar="ID|HASH",
                   help="the catalogued config to explain under, by id or hash prefix "
                        "(default: the one the catalog holds for the model and step, when "
                        "no measurement flag is given; flags given override its fields)")
    s.add_argument("--json", action="store_true", help="the explanation as JSON")
    s.add_argument("--top", type=int, default=10, help="neurons shown each way (default 10)")
    s.add_argument("--seeds", type=int, default=5,
                   help="random draws of each of the knockout's random controls "
                        "(0: no knockout)")
    s.add_argument("--ranking", choices=("direct", "total"), default="direct",
                   help="what picks the knockout's neurons on the prompt: their direct "
                        "terms of T, or their first-order total effects (default direct)")
    s.add_argument("--store", action="store_true",
                   help="store the explanation in the catalog (table prompt_explanation, "
                        "view prompt_explanations; replaces the prompt's earlier row at "
                        "this checkpoint and config)")
    database_option(s)
    science_options(s)
    loads_model(s)
    s.set_defaults(fn=cmd_explain)

    c = sub.add_parser("counterparts", help="match every MLP neuron of a checkpoint to "
                                            "another's by what it computes, against a null, "
                                            "and store the match")
    c.add_argument("model", help=MODEL_HELP)
    c.add_argument("--checkpoint", type=int, default=None, help="its training step")
    c.add_argument("--in", dest="other", required=True, metavar="MODEL[@STEP]",
                   help="the checkpoint to find counterparts in: another seed, another step "
                        "of the same run, another model on the same grid")
    c.add_argument("--null", action="append", default=None, metavar="MODEL[@STEP]",
                   help="an unrelated model whose best similarities make the null "
                        "(repeatable; default: step 0, untrained, of the models matched)")
    c.add_argument("--level", type=float, default=0.01,
                   help="the share of an unrelated model's neurons that pass the null "
                        "(default 0.01)")
    c.add_argument("--config", default=None, metavar="ID|HASH",
                   help="the catalogued config whose grid profiles the neurons (as for "
                        "explain; default: the one the catalog holds for the model)")
    c.add_argument("--json", action="store_true", help="the figures as JSON")
    database_option(c)
    science_options(c)
    loads_model(c)
    c.set_defaults(fn=cmd_counterparts)


def cmd_counterparts(args) -> int:
    """``ncat counterparts`` (jobs.counterparts)."""
    from catalog.sources.names import ModelSourceError, check_model_name
    from jobs.cli.common import database_url
    from jobs.counterparts import Side, default_nulls, match_checkpoints, parse_side

    try:
        if not 0 < args.level < 1:
            raise ValueError(f"--level must be in (0, 1), got {args.level}")
        a, b = Side(args.model, args.checkpoint), parse_side(args.other, "--in")
        nulls = [parse_side(x) for x in args.null] if args.null else default_nulls(a, b)
        for side in (b, *nulls):
            check_model_name(side.model)
        config, _ = config_of(args)
        got = match_checkpoints(database_url(args), a, b, config, nulls, args.level,
                                layers=parse_layers(args.layers), progress=not args.quiet,
                                say=None if args.quiet else _stage)
    except (ModelSourceError, ValueError) as exc:
        return fail(str(exc))
    if args.json:
        from jobs.cli.common import plain

        print(json.dumps(plain(got)))
        return 0
    lo, hi = got["ci"]
    print(f"{got['from']} in {got['to']}: {got['count']} of {got['n']} neurons have a "
          f"counterpart ({got['share']:.1%}, Wilson 95% [{lo:.3f}, {hi:.3f}]): a best "
          f"similarity above {got['threshold']:.3f}, the null's {1 - got['level']:.0%} "
          f"quantile ({got['null']}; an unrelated model passes {got['level']:.0%} of the "
          f"time); {got['same_index']} matched to their own index; the one-to-one partner "
          f"is the best match for {got['one_to_one_is_best']:.1%}; {got['n_cells']} shared "
          f"cells. {got['rows']} rows stored (view neuron_counterparts).")
    return 0


def _stage(text: str) -> None:
    print(f"counterparts: {text}", file=sys.stderr, flush=True)


def _labels(args, lm, config, op: str):
    """The catalog's labels of ``op`` at this checkpoint, when a database is named and
    holds the checkpoint under the config; (None, None, why) otherwise."""
    from catalog.config.settings import get_settings
    from catalog.explain.prompt import labels_from_rows
    from jobs.cli.common import database_url
    from schema import store
    from schema.explanations import catalogued_labels

    if not (args.database_url or get_settings().database_url):
        return None, None, "no database named (--database-url or DATABASE_URL): no labels"
    with store.connect(database_url(args)) as conn:
        got = catalogued_labels(conn, model_name=lm.info.name, step=lm.info.checkpoint,
                                config_hash=config.config_hash(), op=op)
    if got is None:
        return None, None, (f"{lm.info.name} step {lm.info.checkpoint} is not catalogued under "
                            "this config: no labels (catalog it, or pass its config's flags)")
    labels = labels_from_rows(got.rows)
    return labels, got, f"labels of {len(labels)} neurons from the catalog"


def _store(args, lm, config, explanation: dict) -> str:
    """Write the explanation (registering the model, checkpoint and config if new)."""
    from jobs.cli.common import database_url
    from jobs.store_results import register
    from schema import store
    from schema.engine import migrate
    from schema.explanations import write_explanation

    with store.connect(migrate(database_url(args))) as conn:
        ids = register(conn, lm, config)
        with conn.transaction():
            write_explanation(conn, model_id=ids.model_id, checkpoint_id=ids.checkpoint_id,
                              config_id=ids.config_id, explanation=explanation)
    return (f"prompt_explanation (model {ids.model_id}, checkpoint {ids.checkpoint_id}, "
            f"config {ids.config_id})")


def _described(config_id: int, config_hash: str, d: dict, steps: list[int]) -> str:
    at = f"steps {', '.join(map(str, steps))}" if steps else "no step"
    return (f"  --config {config_hash[:12]} (id {config_id}): operators "
            f"{''.join(d.get('operators', []))} on [{d.get('operand_lo')}, "
            f"{d.get('operand_hi')}), {d.get('shots', 0)} shots, template "
            f"{d.get('template')!r}; {at}")


def config_of(args):
    """(the request's science config, where it came from). With no measurement flag and
    no --config, the config the catalog holds for the model (at --checkpoint when given):
    the one there is, or a ValueError listing them when there are several; --config picks
    one by id or hash prefix; flags given override the chosen config's fields. Reads no
    weights: prompts are checked against the config before the model loads."""
    from catalog.config import ScienceConfig
    from catalog.config.flags import specs
    from catalog.config.settings import get_settings

    flagged = any(getattr(args, x.name, None) is not None for x in specs(ScienceConfig))
    named_db = bool(args.database_url or get_settings().database_url)
    if args.config is None and (flagged or not named_db):
        return science_from(args), None
    if not named_db:
        raise ValueError("--config names a catalogued config: name the database too "
                         "(--database-url or DATABASE_URL)")
    from jobs.cli.common import database_url
    from jobs.cli.serving import stored_name
    from schema import store
    from schema.explanations import catalogued_configs

    name = stored_name(args.model)
    with store.connect(database_url(args)) as conn:
        held = catalogued_configs(conn, model_name=name, step=args.checkpoint)
    where = name + ("" if args.checkpoint is None else f" step {args.checkpoint}")
    listing = "\n".join(_described(*x) for x in held)
    if args.config is not None:
        want = args.config.strip().lower()
        hits = [x for x in held if str(x[0]) == want or x[1].startswith(want)]
        if len(hits) != 1:
            what = "matches none" if not hits else "matches several"
            raise ValueError(f"--config {args.config} {what} of the configs {where} is "
                             "catalogued under" + (f":\n{listing}" if held else " (none)"))
        chosen = hits[0]
    elif not held:
        return science_from(args), f"{where} is not catalogued: the default config"
    elif len(held) > 1:
        raise ValueError(f"{where} is catalogued under {len(held)} configs; name one with "
                         f"--config (or give the measurement flags):\n{listing}")
    else:
        chosen = held[0]
    base = ScienceConfig.from_dict(chosen[2])
    return science_from(args, base), f"config {chosen[1][:12]} (id {chosen[0]})"


def prompts_of(args) -> list[str]:
    """The prompts asked for: the arguments, then the file's lines (ValueError naming
    what is missing)."""
    out = list(args.prompt)
    if args.prompts_file:
        from pathlib import Path

        path = Path(args.prompts_file)
        if not path.is_file():
            raise ValueError(f"--prompts-file {args.prompts_file}: no such file")
        out += [x.strip() for x in path.read_text().splitlines()
                if x.strip() and not x.strip().startswith("#")]
    if not out:
        raise ValueError("no prompt given: name one (e.g. '21+17=') or --prompts-file")
    return out


def cmd_explain(args) -> int:
    from catalog.explain.syntax import PromptError, parse  # no torch: refusals come first
    from catalog.sources.names import ModelSourceError

    if args.top < 1 or args.seeds < 0:
        return fail("--top must be at least 1 and --seeds at least 0")
    try:
        config, config_note = config_of(args)
        prompts = prompts_of(args)
        ops = {}
        for prompt in prompts:  # every prompt checked before the model loads
            try:
                ops[prompt] = parse(prompt, config)[1]
            except PromptError as exc:
                raise PromptError(f"{exc}" if len(prompts) == 1 else f"{prompt!r}: {exc}") \
                    from None
        from catalog.explain.holds import catalog_context
        from catalog.explain.prompt import explain
        from catalog.sources import load_model

        lm = load_model(args.model, args.checkpoint, dtype=config.torch_dtype(),
                        progress=not args.quiet)
        labelled = {}  # the catalog's labels, read once per operator
        for prompt in prompts:
            op = ops[prompt]
            if op not in labelled:
                labelled[op] = _labels(args, lm, config, op)
            labels, got, note = labelled[op]
            if config_note:
                note = f"{note}; {config_note}"
            e = explain(lm.model, lm.tokenizer, prompt, config, labels=labels,
                        top=args.top, seeds=args.seeds, ranking=args.ranking,
                        **catalog_context(got, lm.model, config))
            if args.store:
                note = f"{note}; stored as {_store(args, lm, config, e.to_dict())}"
            if args.json:  # one JSON object per prompt, one per line
                print(json.dumps({"model": lm.info.name, "checkpoint": lm.info.checkpoint,
                                  "config_hash": config.config_hash(), "labels": note,
                                  **e.to_dict()}, default=float))
            else:
                print(render(e, f"{lm.info.name} step {lm.info.checkpoint}", note)
                      + ("\n" if len(prompts) > 1 else ""))
    except (PromptError, ModelSourceError, ValueError) as exc:
        return fail(str(exc))
    return 0


CONTROLS = {"unlabelled": "unlabelled neurons, the prompt's labels placed on them",
            "not holding": "labelled neurons whose sets exclude the prompt, same placing",
            "same ranking": "the same ranking, labels ignored",
            "random": "random neurons of the same layers"}


def render(e, where: str, note: str) -> str:
    """The explanation as a readable terminal table."""
    out = _header_lines(e, where, note) + _share_adds_lines(e.share_adds)
    for title, rows in (("toward the answer", e.toward), ("away from it", e.away)):
        out += _neuron_rows(title, rows)
    out.append("\nheads: " + ", ".join(f"L{la}H{h} {c:+.3f}" for la, h, c in e.heads[:5]))
    if e.by_family:
        out.append("by family (labels that hold): "
                   + ", ".join(f"{k} {v:+.3f}" for k, v in sorted(e.by_family.items())))
    if e.knockout is not None:
        out += _knockout_lines(e.knockout)
    return "\n".join(out)


def _header_lines(e, where: str, note: str) -> list[str]:
    """The prompt, the answer and what the model writes, the lens, T and its shares."""
    return [f"{e.prompt} on {where} ({note})",
            f"answer {e.result}: the model writes {e.written!r} "
            f"({'correct' if e.correct else 'wrong'}); the answer's first token "
            f"{e.answer_token!r}: p = {e.p_answer:.3f}, rank {e.rank_answer} (1 = top)",
            "logit lens, the answer's first token's rank by layer (1 = top): "
            + " ".join(f"L{la}:{rank}" for la, rank, _ in e.lens),
            f"T (the answer's logit minus the competing numbers' mean) = {e.target:.3f}: "
            f"neurons {e.neurons_total:+.3f}, heads {e.heads_total:+.3f}, embeddings "
            f"{e.embed:+.3f}, biases {e.biases:+.3f} (rest {e.error:+.1e}; direct effects, "
            "the norms' scales frozen)",
            "shares of T (direct): " + ", ".join(f"{k} {v:.1%}" for k, v in e.shares.items()),
            "shares of T (total effects, first order): "
            + ", ".join(f"{k} {v:.1%}" for k, v in e.shares_total.items()),
            f"neurons to reach 50% / 80% of T: {e.n_for['50%']} / {e.n_for['80%']} direct, "
            f"{e.n_for_total['50%']} / {e.n_for_total['80%']} total (-1: never), carrying "
            f"{e.heuristics_in_80} distinct heuristics that hold here"]


def _share_adds_lines(share_adds: dict) -> list[str]:
    """What the label adds to the share of T, per ranking and control (none: no line)."""
    if not share_adds:
        return []
    return ["what the label adds to the share of T (labelled neurons that hold, less "
            "what the prompt's labels placed at random would carry): " + "; ".join(
                f"{r} " + ", ".join(f"vs {c} {v:+.1%}" for c, v in by.items())
                for r, by in share_adds.items())]


def _neuron_rows(title: str, rows) -> list[str]:
    """A table of neurons (toward the answer, or away from it) with their labels."""
    out = [f"\nneurons {title}:",
           f"  {'layer':>5} {'neuron':>6} {'term':>8} {'total':>8} {'share':>7} "
           f"{'act':>7} {'typical':>7}  labels (✓ holds here; side)  promotes"]
    for r in rows:
        labs = "; ".join(f"{'✓' if x.holds else '✗'} {x.label} ({x.side})"
                         for x in r.labels) or "-"
        typ = "-" if r.typical is None else f"{r.typical:.3f}"
        out.append(f"  {r.layer:>5} {r.neuron:>6} {r.contribution:>+8.3f} {r.total:>+8.3f} "
                   f"{r.share:>7.1%} {r.activation:>7.3f} {typ:>7}  {labs}  "
                   f"{' '.join(r.promotes)}")
        out += [f"      note: {n}" for n in r.notes]
    return out


def _knockout_lines(k) -> list[str]:
    """The prompt's knockout beside its controls, and what the label adds."""
    out = [f"\nknockout of {len(k.neurons)} labelled neurons whose label holds (per "
           "layer at most --knockout-neurons, ranked first on this prompt by "
           f"{k.ranking} effect; zeroed at the last position): p {k.p_clean:.3f} -> "
           f"{k.p_knocked:.3f} (top token: "
           f"{'still the answer' if k.top_after else 'no longer the answer'})"]
    for name, c in k.controls.items():
        lo, hi = c.top_ci
        se = f" ± {c.p_se:.3f}" if c.p_se == c.p_se else ""
        out.append(f"  control, {CONTROLS.get(name, name)} ({len(c.p)} draw"
                   f"{'s' if len(c.p) != 1 else ''}): p {c.p_mean:.3f}{se}, answer on top "
                   f"in {sum(c.top)}/{len(c.top)} [{lo:.2f}, {hi:.2f}]")
    if k.label_adds:
        out.append("  what the label adds (a matched control's p minus the knockout's): "
                   + ", ".join(f"{n} {v:+.3f}" for n, v in k.label_adds.items()))
    return out
