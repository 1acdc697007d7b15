"""``ncat counterparts``: match the MLP neurons of one checkpoint to another's and store
the match (issue 83; catalog.counterparts.match, schema.counterparts).

Both checkpoints (and the null's models) are loaded and profiled on one config's grid;
each neuron of the first gets its best match and one-to-one partner in the second, and
"has a counterpart" where its best similarity exceeds the null's threshold: the
``1 - level`` quantile of the same neurons' best similarities in unrelated models (by
default the untrained checkpoints, step 0, of the models matched). Both checkpoints and
the config are registered in the catalog if new; matching the same pair again replaces
its rows."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from catalog.config import ScienceConfig


@dataclass(frozen=True)
class Side:
    """A model and checkpoint as the command names them (step None: its only weights)."""

    model: str
    step: int | None

    def __str__(self) -> str:
        return self.model + ("" if self.step is None else f"@{self.step}")


def parse_side(text: str, flag: str = "--null") -> Side:
    """``MODEL@STEP`` (the part after the last '@' a whole number: the built-in model's
    variants have an '@' in their names) or ``MODEL`` (its only or final weights);
    ValueError naming the flag and the text."""
    model, at, step = text.rpartition("@")
    if at and step.isdigit():
        if not model:
            raise ValueError(f"{flag} {text!r}: write MODEL@STEP or MODEL")
        return Side(model, int(step))
    if not text.strip():
        raise ValueError(f"{flag} is empty: write MODEL@STEP or MODEL")
    return Side(text, None)


def default_nulls(a: Side, b: Side) -> list[Side]:
    """The untrained checkpoints (step 0) of the models matched; ValueError when a model
    has no steps (its weights are all there is: name unrelated models with --null)."""
    out = []
    for side in (a, b):
        if side.step is None:
            raise ValueError(f"{side.model} has no training steps, so no untrained checkpoint "
                             "for the null: name unrelated models of the same grid with "
                             "--null MODEL@STEP")
        if Side(side.model, 0) not in out:
            out.append(Side(side.model, 0))
    return out


def match_checkpoints(url: str, a: Side, b: Side, config: ScienceConfig, nulls: list[Side],
                      level: float = 0.01, layers: list[int] | None = None,
                      progress: bool = False, say=None) -> dict:
    """Profile, match, judge against the null and store (module doc); returns the figures:
    the threshold, how many of A's neurons have a counterpart (with a Wilson interval), how
    many are matched to their own index, and the ids written under. ``layers``: those of
    every model (default all; a profile holds a float32 per neuron and cell, so on a large
    model or grid a few layers at a time bound the memory); ``say``: told each stage."""
    from catalog.counterparts.match import counterparts, profiles, shared_cells
    from catalog.sources import load_model
    from jobs.store_results import register
    from schema import store
    from schema.counterparts import CounterpartRows, write_counterparts

    if not 0 < level < 1:
        raise ValueError(f"--level must be in (0, 1), got {level}")
    if not nulls:
        raise ValueError("the null needs at least one unrelated model (--null MODEL@STEP)")
    loaded = {}
    todo = list(dict.fromkeys((a, b, *nulls)))
    for i, side in enumerate(todo):
        if say is not None:
            say(f"profiling {side} ({i + 1} of {len(todo)})")
        lm = load_model(side.model, side.step, dtype=config.torch_dtype(), progress=progress)
        bad = [la for la in layers or [] if not 0 <= la < lm.model.cfg.n_layers]
        if bad:
            raise ValueError(f"--layers {bad}: {side} has layers 0..{lm.model.cfg.n_layers - 1}")
        loaded[side] = (lm, profiles(lm.model, lm.tokenizer, config, layers))
    if say is not None:
        say("matching")
    (lm_a, pa), (lm_b, pb) = loaded[a], loaded[b]
    got = counterparts(pa, pb, [loaded[n][1] for n in nulls], level)
    m = got["match"]
    one = np.where((m.one_to_one >= 0)[:, None], pb.neurons[np.maximum(m.one_to_one, 0)], -1)
    rows = CounterpartRows(
        neurons=pa.neurons, best=pb.neurons[m.best], best_similarity=m.best_similarity,
        one_to_one=one, one_to_one_similarity=m.one_to_one_similarity, has=got["has"],
        threshold=got["threshold"], level=level,
        null_models=", ".join(_named(loaded[n][0]) for n in nulls),
        n_cells=len(shared_cells(pa, pb)))
    with store.connect(url) as conn:
        ids_a, ids_b = register(conn, lm_a, config), register(conn, lm_b, config)
        written = write_counterparts(conn, from_checkpoint_id=ids_a.checkpoint_id,
                                     to_checkpoint_id=ids_b.checkpoint_id,
                                     config_id=ids_a.config_id, rows=rows)
    same = (rows.best == pa.neurons).all(1)
    return {"from": _named(lm_a), "to": _named(lm_b), "null": rows.null_models, "level": level,
            "threshold": got["threshold"], "count": got["count"], "n": got["n"],
            "share": got["share"], "ci": got["ci"], "same_index": int(same.sum()),
            "one_to_one_is_best": got["one_to_one_is_best"], "n_cells": rows.n_cells,
            "rows": written, "from_checkpoint_id": ids_a.checkpoint_id,
            "to_checkpoint_id": ids_b.checkpoint_id, "config_id": ids_a.config_id}


def _named(lm) -> str:
    """A loaded checkpoint as the catalog names it: MODEL@STEP, or MODEL for a model
    without steps."""
    step = lm.info.checkpoint
    return lm.info.name + ("" if step is None else f"@{step}")
