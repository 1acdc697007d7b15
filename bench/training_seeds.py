"""The training figures of a model and its seeds (issue 48), from a catalog that holds them:
births per family and seed, the order across seeds, the final circuit at every step and
its share of the own circuit beside the paper's 79%.

    ncat train-builtin --seeds 0,1,2
    ncat catalog builtin --checkpoints all --hi 100          # and @seed1, @seed2
    python bench/training_seeds.py builtin-arith [--database-url URL]

Writes bench/results/training_<model>.json (``reports.training.numbers``, the training
section's Markdown and the per-seed accuracy) and prints the Markdown.
"""

import argparse
import sys

import _common  # noqa: F401  (sets the offline Hugging Face cache first)
from _common import save


def main() -> int:
    from reports import training as rt
    from schema import store
    from schema.database import resolve_database_url, with_driver
    from schema.training import gather_training

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", default="builtin-arith")
    p.add_argument("--config-id", type=int, default=None)
    p.add_argument("--database-url", default=None)
    args = p.parse_args()
    url = with_driver(args.database_url) if args.database_url else resolve_database_url()
    with store.connect(url) as conn:
        d = gather_training(conn, model=args.model, config_id=args.config_id)
    if d is None:
        print(f"error: no summary of {args.model}'s group in the catalog", file=sys.stderr)
        return 2
    md = "\n".join(rt.markdown(d))
    acc: dict = {}
    for _, seed, step, op, value in d.accuracy:
        acc.setdefault(str(seed), {}).setdefault(op, {})[str(step)] = value
    save(f"training_{d.group.replace('/', '_')}",
         {**rt.numbers(d), "accuracy": acc, "markdown": md})
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
