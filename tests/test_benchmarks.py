"""The benchmark scripts stay runnable and stand alone: every top-level script runs on its tiny
input (`--smoke`), and no script imports another (shared set-up lives in the package or in
benchmarks/_common.py; settled studies in benchmarks/studies/)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
SCRIPTS = sorted(p for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))
STUDIES = sorted(p for p in (BENCHMARKS / "studies").glob("*.py") if p.name != "__init__.py")
OUTPUT_FLAG = {"regime_map.py": "--out"}  # its output is a folder


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_every_script_runs_on_its_tiny_input(script: Path, tmp_path: Path) -> None:
    out = tmp_path / ("out" if script.name in OUTPUT_FLAG else f"{script.stem}.md")
    flag = OUTPUT_FLAG.get(script.name, "--output")
    done = subprocess.run(
        [sys.executable, str(script), "--smoke", flag, str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert out.exists(), f"{script.name} --smoke wrote nothing to {out}"


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_no_script_imports_another() -> None:
    scripts = {p.stem for p in SCRIPTS}
    study_scripts = {
        p.stem for p in STUDIES if p.stem.startswith(("bench_", "regime", "dropin", "engine", "sparse"))
    }
    for path in [*SCRIPTS, *STUDIES]:
        wrong = _imported(path) & (scripts | study_scripts) - {path.stem}
        assert not wrong, f"{path.relative_to(ROOT)} imports the script(s) {sorted(wrong)}"


def test_every_script_says_how_it_is_run() -> None:
    """Each script's docstring gives its command (and so the results file it writes, by default)."""
    for path in [*SCRIPTS, *STUDIES]:
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        if path.parent.name == "studies" and not path.stem.startswith(
            ("bench_", "regime", "dropin", "engine", "sparse")
        ):
            continue  # a study's module, not a script
        assert f"python benchmarks/{path.relative_to(BENCHMARKS)}" in doc, path.name


def test_make_bench_runs_every_script() -> None:
    """`make bench`, `make bench-long` and `make calibrate` between them run every top-level script
    (the README says so)."""
    lists: set[str] = set()
    for line in (ROOT / "Makefile").read_text(encoding="utf-8").splitlines():
        if line.startswith(("BENCHMARKS :=", "LONG_BENCHMARKS :=")):
            lists |= set(line.split(":=", 1)[1].split())
    assert "benchmarks/calibrate_static.py" in (ROOT / "Makefile").read_text(encoding="utf-8")
    assert lists | {"calibrate_static"} == {p.stem for p in SCRIPTS}
