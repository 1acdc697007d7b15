"""``python -m catalog.builtin SPEC``: the built-in trainer's child process.

SPEC is JSON: {"config": TrainConfig fields, "root": cache root, "progress": bool}.
``catalog.builtin.train`` starts it with pinned numerics; run by hand it trains
without them.
"""

import json
import sys
from pathlib import Path

from catalog.builtin.model import TrainConfig
from catalog.builtin.training import train_here


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    config = spec["config"]
    config["extra_steps"] = tuple(config.get("extra_steps", ()))
    config["op_weights"] = tuple(config.get("op_weights", (1, 1, 1, 1)))
    train_here(TrainConfig(**config), Path(spec["root"]), bool(spec["progress"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
