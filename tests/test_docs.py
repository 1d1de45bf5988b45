"""The generated reference in docs/instances.md matches the code."""

from pathlib import Path

from comoe_opt.docs import instance_reference

ROOT = Path(__file__).resolve().parents[1]


def test_instance_reference_is_current():
    text = (ROOT / "docs" / "instances.md").read_text(encoding="utf-8")
    begin, end = "<!-- generated: begin -->\n", "<!-- generated: end -->"
    generated = text.split(begin, 1)[1].split(end, 1)[0]
    assert generated.strip() == instance_reference().strip()


def test_every_instance_key_has_doc_and_unit_column():
    keys, limits = instance_reference().split("### Size limits")
    for line in keys.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            assert len(cells) == 4 and cells[3], line
    rows = [line for line in limits.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) >= 10
    for line in rows:  # every limit has its value and its reason
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert len(cells) == 3 and "<=" in cells[1] and cells[2], line
