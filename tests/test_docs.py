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
    for line in instance_reference().splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            assert len(cells) == 4 and cells[3], line
