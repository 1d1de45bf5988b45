"""With `--json`, stdout is exactly one JSON object: solver and library warnings never reach it.

At the root, warm starts stay inside their variables' bounds (LP shares of 1 + 2e-16 made Pyomo
warn once per variable). At the boundary, while a verb runs, whatever else is written to stdout
(Pyomo's log handler, a print, a write to descriptor 1, a worker process) goes to stderr. The
boundary is checked in a child process: in-process, pytest's own capture hides what reaches the
descriptor, and pytest's log handler silences Pyomo's.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyomo.environ as pyo
import pytest
import tomli_w
from conftest import ROOT, make_problem, small_table

from comoe_opt.residency.models import milp
from comoe_opt.residency.models.milp import build_full_model, set_full_start, set_start

OVER = 1.0000000000000002  # what HiGHS returned for a share that is exactly 1


def test_set_start_clips_round_off_into_the_bounds(caplog: pytest.LogCaptureFixture) -> None:
    m = pyo.ConcreteModel()
    m.t = pyo.Var([0, 1, 2], bounds=(0, 1))
    m.z = pyo.Var(domain=pyo.NonNegativeReals)
    for i, value in enumerate((OVER, -1e-17, 0.25)):
        set_start(m.t[i], value)
    set_start(m.z, 7.5)
    assert [m.t[i].value for i in range(3)] == [1.0, 0.0, 0.25] and m.z.value == 7.5
    assert not [r for r in caplog.records if "outside the bounds" in r.getMessage()]


def test_scenario_warm_start_stays_in_bounds(monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    """The polish's warm start (the full model with scenarios) takes each scenario's LP shares;
    given shares just above 1, every start value is still inside its bounds, without a warning."""
    problem = make_problem([[1.0, 1.0, 1.0]], [[5.0, 3.0, 1.0]], [2, 2])
    problem = dataclasses.replace(problem, scenario_work_ms=np.full((2, 1, 3, 2), 2.0))
    resident = np.array([[[True, False], [False, True], [True, True]]])

    def rounded_up(work: np.ndarray, res: np.ndarray) -> tuple[float, float, np.ndarray]:
        shares = np.zeros(res.shape)
        shares[np.arange(res.shape[0]), res.argmax(axis=1)] = OVER
        return 4.0, 4.0, shares

    monkeypatch.setattr(milp, "share_lp", rounded_up)
    m = build_full_model(problem)
    set_full_start(m, problem, resident)
    starts = [v for v in m.component_data_objects(pyo.Var) if v.value is not None]
    assert {v.name.split("[")[0] for v in starts} >= {"t", "zs", "x", "u", "y"}
    for v in starts:
        lower, upper = v.bounds
        assert (lower is None or v.value >= lower) and (upper is None or v.value <= upper), v.name
    assert max(v.value for v in m.t.values()) == 1.0
    assert not [r for r in caplog.records if "outside the bounds" in r.getMessage()]


# ------------------------------------------------------------------ the boundary, in a child process

NOISE = '''
"""Noise on stdout from every layer a verb may meet, in this process and in worker processes."""
import os

import pyomo.environ as pyo

import comoe_opt.cli.evaluate as verb
import comoe_opt.evaluator.runs as runs


def noise(where):
    m = pyo.ConcreteModel()
    m.t = pyo.Var(bounds=(0, 1))
    m.t.set_value(1.0000000000000002)  # Pyomo's W1002, logged to stdout by Pyomo's handler
    print(f"a print in the {where}")
    os.write(1, f"a write to descriptor 1 in the {where}\\n".encode())


def noisy(real, where):
    def run(*args, **kwargs):
        noise(where)
        return real(*args, **kwargs)
    return run


runs.evaluate_strategy = noisy(runs.evaluate_strategy, "worker")  # every run, wherever it runs
verb.peer_summary = noisy(verb.peer_summary, "parent")  # only in the command's own process
'''

MAIN = """
import sys
import comoe_opt.parallel as parallel
real_context = parallel._context
parallel._context = lambda preload: real_context([*preload, "noise"])  # the fork server imports it
import noise
from comoe_opt.cli import main
sys.exit(main(sys.argv[1:]))
"""


def run_noisy(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "noise.py").write_text(NOISE, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    command = [sys.executable, "-c", MAIN, *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def tiny(folder: Path, **policy: Any) -> Path:
    table = copy.deepcopy(small_table())
    table["hardware"]["capacity_gb"] = 8  # 32 pages for 24 experts: room for replicas
    table["policy"].update(policy)
    path = folder / "tiny.toml"
    path.write_text(tomli_w.dumps(table), encoding="utf-8")
    return path


def test_noise_in_the_command_and_its_workers_goes_to_stderr(tmp_path: Path) -> None:
    done = run_noisy(tmp_path, "evaluate", str(tiny(tmp_path)), "--strategies", "static,eplb", "--jobs", "2",
                     "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)  # the whole of stdout: one JSON object
    assert [r["strategy"] for r in report["results"]] == ["static", "eplb"]
    for where in ("parent", "worker"):  # moved to stderr, not lost
        assert f"a print in the {where}" in done.stderr
        assert f"a write to descriptor 1 in the {where}" in done.stderr
    assert "W1002" in done.stderr and "Traceback" not in done.stderr


# ------------------------------------------------------------------ each verb's --json in-process


def one_object(result: Any) -> dict[str, Any]:
    assert result.code == 0, result.err
    return json.loads(result.out)


def test_solve_json_with_scenarios_and_polish(cli, tmp_path: Path, caplog) -> None:
    report = one_object(cli("solve", tiny(tmp_path, balance_scenarios=3), "--work-limits", "--json"))
    assert report["report"]["full_model_bound"] is not None  # the polish (full model, warm start) ran
    assert report["bound"] <= report["objective"] + 1e-9
    assert not [r for r in caplog.records if "outside the bounds" in r.getMessage()]


def test_evaluate_and_gap_json(cli, tmp_path: Path) -> None:
    instance = tiny(tmp_path, balance_scenarios=3)
    report = one_object(cli("evaluate", instance, "--strategies", "eplb,oracle", "--json"))
    assert [r["strategy"] for r in report["results"]] == ["eplb", "oracle"]
    gap = one_object(cli("gap", instance, "--windows", "3", "--slow-windows", "0", "--json"))
    assert gap and "slow_loop" not in gap


def test_paper_json_keeps_stdout_for_the_report(cli, tmp_path: Path, monkeypatch) -> None:
    """`paper` runs for minutes: its verb is checked with a stand-in that is as noisy as a solver."""
    import comoe_opt.cli.evaluate as verb

    def noisy_paper(*args: Any, **kwargs: Any) -> dict[str, Any]:
        print("a print during the paper")
        logging.getLogger("pyomo.core").warning("Setting Var 't[1,4,57,1]' outside the bounds (0, 1).")
        return {"instance": "tiny", "files": [], "runtime_s": 0.0, "_text": "tables"}

    monkeypatch.setattr(verb, "run_paper", noisy_paper)
    result = cli("paper", tiny(tmp_path), "--regime", "none", "--out", tmp_path / "paper", "--json")
    assert one_object(result) == {"instance": "tiny", "files": [], "runtime_s": 0.0}
    assert "a print during the paper" in result.err
