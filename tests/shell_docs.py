"""The shell lines that README.md and the pages of docs/ show, as a reader would type them."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# in the order a reader meets them (the README's links), then every other page
_READING_ORDER = ["store.md", "jobs.md", "explorer.md", "queries.md"]
DOCS = [ROOT / "README.md"] + [ROOT / "docs" / name for name in _READING_ORDER] + sorted(
    p for p in (ROOT / "docs").glob("*.md") if p.name not in _READING_ORDER)


def shell_lines(path: Path) -> list[str]:
    """Every command of the file's ```bash blocks, comments dropped, split at ';'."""
    blocks = re.findall(r"```bash\n(.*?)```", path.read_text(), flags=re.S)
    lines = []
    for block in blocks:
        for line in block.splitlines():
            line = line.split("  #")[0].strip()
            lines.extend(part.strip() for part in line.split(";") if part.strip())
    return lines


def documented_lines() -> list[str]:
    """Each distinct line of every doc, in order of first appearance."""
    return list(dict.fromkeys(line for path in DOCS for line in shell_lines(path)))
