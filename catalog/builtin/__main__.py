"""``python -m catalog.builtin SPEC``: the built-in trainer's child process.

SPEC is JSON: {"config": TrainConfig fields, "root": cache root, "progress": bool,
"parent": the pid of the process holding the training lock}.
``catalog.builtin.train`` starts it with pinned numerics; run by hand it trains
without them.
"""

import json
import os
import sys
import threading
import time
from pathlib import Path


def _exit_with_parent(parent: int) -> None:
    """The parent holds the cache folder's training lock: if it dies, stop too, so that no
    orphaned trainer writes into a folder another trainer may then take."""
    if os.getppid() != parent:
        os._exit(1)  # it died while this process was starting

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    _exit_with_parent(int(spec["parent"]))
    from catalog.builtin.model import TrainConfig
    from catalog.builtin.training import train_here

    config = spec["config"]
    config["extra_steps"] = tuple(config.get("extra_steps", ()))
    train_here(TrainConfig(**config), Path(spec["root"]), bool(spec["progress"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
