"""Imports follow use: a verb loads Pyomo (and HiGHS) only when it solves a model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w

CHECK = (
    "import sys\n"
    "from comoe_opt.cli import main\n"
    "try:\n"
    "    main(sys.argv[1:])\n"
    "except SystemExit as exc:\n"
    "    assert not exc.code, exc.code\n"
    "print([m for m in ('pyomo', 'highspy') if m in sys.modules], file=sys.stderr)\n"
)


def _loaded(*argv: str) -> str:
    done = subprocess.run([sys.executable, "-c", CHECK, *argv], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stderr.strip().splitlines()[-1]


@pytest.fixture
def instance(tmp_path: Path, table) -> Path:
    table["hardware"]["capacity_gb"] = 8  # every expert resident: the engine export needs it
    table["policy"] = {"window_batches": 4, "all_resident": True, "balance_scenarios": 3}
    path = tmp_path / "inst.toml"
    path.write_text(tomli_w.dumps(table))
    return path


def test_heuristics_exports_and_trace_info_load_no_milp_stack(instance: Path, tmp_path: Path) -> None:
    assert _loaded("solve", str(instance), "--method", "greedy") == "[]"
    out = str(tmp_path / "loc.json")
    assert _loaded("solve", str(instance), "--method", "eplb", "--export", "sglang", "-o", out) == "[]"
    assert _loaded("trace", "info", str(instance)) == "[]"


def test_a_model_loads_it(instance: Path) -> None:
    """The check above can fail: `milp` does load Pyomo."""
    assert "pyomo" in _loaded("solve", str(instance), "--method", "milp")
