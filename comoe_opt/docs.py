"""Reference documentation generated from the code, so it cannot drift."""

from __future__ import annotations

from comoe_opt.instance import FileTrace, Hardware, ModelShape, Policy, Runtime, SyntheticTrace
from comoe_opt.schema import describe

_TABLES = [
    ("[model]", ModelShape),
    ("[hardware]", Hardware),
    ('[trace] with kind = "synthetic"', SyntheticTrace),
    ('[trace] with kind = "file"', FileTrace),
    ("[policy]", Policy),
    ("[runtime]", Runtime),
]


def instance_reference() -> str:
    """Markdown tables of every instance key: unit, default, meaning."""
    out = []
    for title, cls in _TABLES:
        out += [f"### {title}", "", "| key | unit | default | meaning |", "|---|---|---|---|"]
        for row in describe(cls):
            unit = row["unit"] or "–"
            out.append(f"| `{row['key']}` | {unit} | {row['default']} | {row['doc']} |")
        out.append("")
    return "\n".join(out)


def update(path: str) -> None:
    """Rewrite the generated block of a Markdown file in place."""
    from pathlib import Path

    begin, end = "<!-- generated: begin -->\n", "<!-- generated: end -->"
    text = Path(path).read_text(encoding="utf-8")
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1]
    Path(path).write_text(head + begin + instance_reference() + "\n" + end + tail, encoding="utf-8")


if __name__ == "__main__":
    import sys

    update(sys.argv[1])
