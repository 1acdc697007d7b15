"""``python -m jobs.cli``: the same as ``ncat``."""

import sys

from jobs.cli import main

sys.exit(main())
