"""``python -m catalog.labels.families [--write]``: the families' table of docs/method.md
(section 7), printed, or written between its markers."""

from __future__ import annotations

import sys
from pathlib import Path

from catalog.labels.families import docs_table

DOC = Path(__file__).resolve().parents[3] / "docs" / "method.md"
BEGIN, END = "<!-- families: begin -->", "<!-- families: end -->"


def rendered(text: str) -> str:
    """``text`` (docs/labels.md) with the table between its markers written anew."""
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{docs_table()}{END}{tail}"


if __name__ == "__main__":
    if "--write" in sys.argv[1:]:
        DOC.write_text(rendered(DOC.read_text()))
    else:
        print(docs_table(), end="")
