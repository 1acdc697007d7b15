"""What a checkpoint of a run on the paper's grid pays for the label rule's fits.

Each run on one operator's cells needs an ``OperandFit`` (catalog.labels.operand_fit) for
the operator and one for its relabelled-values control: eight for + - * / on [0, 300),
built from pseudo-inverses per fold of models up to 1,633 levels wide. A worker keeps
them for the next checkpoint (catalog.labels.operator_labels.operand_fit). This bench
asks for them as consecutive checkpoints of one run do (each operator's fit, its
explanations' models, then each control's fit) under two policies in one process:

- before: every fit's explanation models built with it, and at most 2 GiB of fits kept
  whatever the config (the eight hold about 6.5 GiB, so each checkpoint built all eight
  again while asking for the next);
- now: the controls' fits build no explanation models (they count labels and never
  explain), fits on the same cells share the models of the same groupings, and the
  config asked for last keeps its fits up to ``FAMILY_KEPT_BYTES``.

Reports each checkpoint's seconds per policy (the first builds everything under both)
and the bytes the kept fits hold. One run per policy: each checkpoint takes minutes
under the old policy; the times are of numpy's and torch's pseudo-inverses and products,
stable to a few percent between runs on an idle machine.

Run: .venv/bin/python bench/fit_reuse.py [--hi 300] [--checkpoints 3] [--record]
"""

from __future__ import annotations

import argparse
import gc
import json
import time

import numpy as np

from _common import ROOT, plain, save


def checkpoints(policy: str, hi: int, n: int, family_bytes: int) -> dict:
    """``n`` checkpoints' fits under ``policy``; ``family_bytes``: the run's cap now."""
    from catalog.config import ScienceConfig
    from catalog.core.arith import OPERATORS, apply_op, is_valid
    from catalog.labels import fit_models, value_null
    from catalog.labels import operator_labels as ol
    from catalog.labels.heuristics import Cells
    from catalog.measuring.prompts import UNLIMITED

    ol._FITS.clear()
    gc.collect()
    assert not len(fit_models._MODELS)
    old = policy == "before"
    ol.FAMILY_KEPT_BYTES = ol.FITS_KEPT_BYTES if old else family_bytes
    config = ScienceConfig(operand_hi=hi)
    a, b = np.meshgrid(np.arange(hi), np.arange(hi), indexing="ij")
    a, b = a.ravel(), b.ravel()
    own, relabelled = {}, {}
    for o, op in enumerate(OPERATORS):
        ok = is_valid(op, a, b, UNLIMITED)
        own[op] = Cells(op, a[ok], b[ok], apply_op(op, a[ok], b[ok]), 0, hi)
        relabelled[op] = value_null.relabelled(own[op], config.null_strata,
                                               np.random.default_rng([config.seed, o, 1]))
    seconds, built = [], []
    for _ in range(n):
        t, before = time.perf_counter(), set(map(id, ol._FITS.values()))
        held = []  # what the run holds while it lasts
        for op in OPERATORS:
            fit = ol.operand_fit(config, own[op])
            fit.models  # noqa: B018 (the explanations build them)
            held.append(fit)
        for op in OPERATORS:
            fit = ol.operand_fit(config, relabelled[op])
            if old:
                fit.models  # noqa: B018 (built with every fit before)
            held.append(fit)
        seconds.append(round(time.perf_counter() - t, 1))
        built.append(sum(id(f) not in before for f in held))
        kept = sum(ol.held_bytes(f) for f in ol._FITS.values())
        del held
    return {"seconds_per_checkpoint": seconds, "fits_built_per_checkpoint": built,
            "kept_gib_after": round(kept / 2**30, 2)}


def summarize(out: dict) -> None:
    """Each policy's median seconds of a checkpoint after the first (with the spread),
    and the first checkpoint's ratio: a later checkpoint builds nothing now, so its ratio
    would be a time over zero."""
    for p in ("before", "now"):
        later = out[p]["seconds_per_checkpoint"][1:]
        out[p]["later_checkpoints_median_s"] = float(np.median(later)) if later else None
        out[p]["later_checkpoints_spread_s"] = [min(later), max(later)] if later else None
    first = [out[p]["seconds_per_checkpoint"][0] for p in ("before", "now")]
    out["first_checkpoint_ratio"] = round(first[0] / max(first[1], 1e-9), 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hi", type=int, default=300)
    parser.add_argument("--checkpoints", type=int, default=3)
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()
    import torch

    from catalog.labels.operator_labels import FAMILY_KEPT_BYTES  # the policy now

    out = {"grid": f"[0, {args.hi})", "operators": "+-*/", "threads": torch.get_num_threads()}
    for policy in ("before", "now"):
        out[policy] = checkpoints(policy, args.hi, args.checkpoints, FAMILY_KEPT_BYTES)
        print(policy, out[policy], flush=True)
    summarize(out)
    save("fit_reuse", out)
    if args.record:
        path = ROOT / "bench" / "recorded" / "cpu_fit_reuse_300.json"
        path.write_text(json.dumps(out, indent=2, default=plain) + "\n")


if __name__ == "__main__":
    main()
