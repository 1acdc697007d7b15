"""The command-line reference (docs/cli.md), generated from the parser itself.

`python -m jobs.cli_reference --write` rewrites the section between the markers; a test
fails when the page and the parser disagree.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jobs.cli import build_parser

DOC = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
START, END = "<!-- cli-reference:start -->", "<!-- cli-reference:end -->"


def reference() -> str:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    helps = {a.dest: a.help for a in sub._choices_actions}
    parts = []
    for name, p in sub.choices.items():
        p.prog = f"ncat {name}"
        # a fixed width: the reference must not depend on the terminal it was made in
        p.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=100)
        parts.append(f"#### `ncat {name}`: {helps.get(name, '')}\n\n```\n"
                     f"{p.format_usage().strip()}\n```")
    return "\n\n".join(parts)


def section(text: str) -> str:
    return text[text.index(START) + len(START):text.index(END)].strip()


def write() -> None:
    text = DOC.read_text()
    DOC.write_text(text[:text.index(START) + len(START)] + "\n\n" + reference() + "\n\n"
                      + text[text.index(END):])


if __name__ == "__main__":
    if "--write" in sys.argv:
        write()
    else:
        print(reference())
