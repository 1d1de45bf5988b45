"""Reference documentation generated from the code, so it cannot drift."""

from __future__ import annotations

from comoe_opt.instance import (
    MAX_PLACEMENT_CELLS,
    MAX_TRACE_ROUTES,
    CountsTrace,
    FileTrace,
    Hardware,
    ModelShape,
    Policy,
    Runtime,
    SyntheticTrace,
)
from comoe_opt.schema import describe

_TABLES = [
    ("[model]", ModelShape),
    ("[hardware]", Hardware),
    ('[trace] with kind = "synthetic"', SyntheticTrace),
    ('[trace] with kind = "file"', FileTrace),
    ('[trace] with kind = "counts"', CountsTrace),
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
    return "\n".join(out + size_limits())


def size_limits() -> list[str]:
    """The upper limits on sizes, each with its reason."""
    out = [
        "### Size limits",
        "",
        "Every size allocates arrays, so each has an upper limit far beyond real deployments: a",
        "slip of a digit is a one-line error, not an attempt to allocate terabytes.",
        "",
        "| key | limit | why |",
        "|---|---|---|",
    ]
    seen = set()
    for title, cls in _TABLES:
        section = title.split("]")[0] + "]"
        for row in describe(cls):
            if row["why"] and (section, row["key"]) not in seen:
                seen.add((section, row["key"]))
                out.append(f"| `{section[1:-1]}.{row['key']}` | {row['limit']} | {row['why']} |")
    out += [
        f"| layers x experts_per_layer x chiplets | <= {MAX_PLACEMENT_CELLS:,} | the slow loop keeps"
        " arrays over every (layer, expert, chiplet) |",
        f"| synthetic micro_batches x tokens_per_batch x layers x top_k | <= {MAX_TRACE_ROUTES:,} |"
        " the generated trace holds one expert id per route |",
        "| an array in an `.npz` file | <= 8 GiB, and no larger than the bytes the file holds |"
        " declared shapes are checked before anything is allocated |",
        "",
    ]
    return out


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
