"""The generated tables of docs/bench.md (suite keys, result columns), so they cannot drift.

.venv/bin/python -m comoe_opt.bench.docs docs/bench.md    # rewrite the generated sections
"""

from __future__ import annotations

import sys
from pathlib import Path

from comoe_opt.bench.columns import column_reference
from comoe_opt.bench.suite import suite_reference

SECTIONS = {"suite keys": suite_reference, "columns": column_reference}


def generated(text: str, name: str) -> str:
    """The current content of section `name` of a document."""
    begin, end = _markers(name)
    return text.split(begin, 1)[1].split(end, 1)[0]


def refresh(text: str) -> str:
    """The document with every generated section rewritten from the code."""
    for name, make in SECTIONS.items():
        begin, end = _markers(name)
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = f"{head}{begin}{make()}\n{end}{tail}"
    return text


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- generated: {name} begin -->\n", f"<!-- generated: {name} end -->"


if __name__ == "__main__":
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/bench.md")
    path.write_text(refresh(path.read_text(encoding="utf-8")), encoding="utf-8")
