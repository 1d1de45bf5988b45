"""The runner: failing runs, SIGTERM + --resume, Dask LocalCluster against the local pool.

Runs are small slow-loop windows (a few tenths of a second); no assertion
depends on wall-clock time, only on which runs finished and on the
deterministic columns of the results.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import tomli_w
from conftest import ROOT, small_table

from comoe_opt.bench import (
    NONDETERMINISTIC,
    ResultStore,
    deterministic_columns,
    load_suite,
    results_frame,
    run_one,
)
from comoe_opt.bench.columns import documented
from comoe_opt.bench.report import write_report

SUITE = """
name = "tiny"
instance = "inst.toml"
work_limits = true
methods = ["milp", "greedy"]
seeds = [0, 1]
[vary]
"trace.zipf_alpha" = [0.6, 1.2]
"""


def tiny_instance() -> dict[str, Any]:
    """Runs of ~0.1-0.3 s: long enough that a signal lands mid-suite, short enough for a fast test."""
    table = copy.deepcopy(small_table())
    table["model"].update(layers=8, experts_per_layer=16)
    table["hardware"]["capacity_gb"] = 16
    table["trace"]["micro_batches"] = 1000
    table["policy"]["window_batches"] = 1000
    return table  # the suites plan on work limits: runs in any process and order give the same results


def write_suite(folder: Path, text: str = SUITE) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "inst.toml").write_text(tomli_w.dumps(tiny_instance()), encoding="utf-8")
    path = folder / "suite.toml"
    path.write_text(text, encoding="utf-8")
    return path


def same_results(a: pd.DataFrame, b: pd.DataFrame) -> None:
    columns = deterministic_columns(a)
    assert columns == deterministic_columns(b)
    pd.testing.assert_frame_equal(a[columns], b[columns])


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> pd.DataFrame:
    """The tiny suite run once, uninterrupted, in the local pool with two workers."""
    from comoe_opt.cli import main

    folder = tmp_path_factory.mktemp("reference")
    suite = write_suite(folder)
    assert main(["bench", str(suite), "--jobs", "2", "--out", str(folder / "out"), "--no-plots"]) == 0
    return pd.read_parquet(folder / "out" / "results.parquet")


def test_uninterrupted_run_stores_every_run(reference: pd.DataFrame, tmp_path: Path) -> None:
    assert len(reference) == 8 and (reference["run_status"] == "ok").all()
    assert list(reference["run_id"]) == sorted(reference["run_id"])
    assert set(reference["method"]) == {"milp", "greedy"}
    assert reference["objective"].notna().all() and reference["commit"].notna().all()
    milp = reference[reference["method"] == "milp"]
    assert milp["bound"].notna().all() and (milp["bound"] <= milp["objective"] + 1e-6).all()
    assert all(documented(c) for c in reference.columns), [c for c in reference.columns if not documented(c)]
    assert set(NONDETERMINISTIC) <= set(reference.columns)


def test_sigterm_then_resume_gives_the_uninterrupted_results(reference: pd.DataFrame, tmp_path: Path) -> None:
    """SIGTERM lands as the first run is stored, while the second waits on a gate nothing opens
    (tests/bench_gate.py): exactly one run is kept, whatever the machine's speed."""
    suite = write_suite(tmp_path)
    out = tmp_path / "out"
    runs = out / "runs"
    args = ["bench", str(suite), "--jobs", "1", "--out", str(out)]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]),
    }
    gated = [sys.executable, str(ROOT / "tests" / "bench_gate.py"), str(tmp_path / "gate"), *args]
    stopped = subprocess.run(gated, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    err = stopped.stderr
    assert stopped.returncode == 128 + signal.SIGTERM, err
    assert "SIGTERM" in err and "Traceback" not in err
    after = {p.name for p in runs.glob("*.json")}
    assert len(after) == 1  # the stored run is kept; the waiting and queued ones are dropped
    assert "7 unfinished runs dropped" in stopped.stdout + err
    partial = pd.read_parquet(out / "results.parquet")
    assert sorted(partial["run_id"] + ".json") == sorted(after)
    assert (out / "report.md").is_file()

    command = [sys.executable, "-m", "comoe_opt.cli", *args]
    resumed = subprocess.run([*command, "--resume"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{len(after)} finished before, {8 - len(after)} run now" in resumed.stdout
    same_results(pd.read_parquet(out / "results.parquet"), reference)


def test_dask_local_cluster_matches_the_local_pool(reference: pd.DataFrame, tmp_path: Path, cli) -> None:
    distributed = pytest.importorskip("distributed")
    suite = write_suite(tmp_path)
    cluster = distributed.LocalCluster(
        n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None, host="127.0.0.1"
    )
    try:
        result = cli(
            "bench",
            suite,
            "--scheduler",
            cluster.scheduler_address,
            "--out",
            tmp_path / "out",
            "--no-plots",
            "--json",
        )
    finally:
        cluster.close()
    assert result.code == 0, result.err
    assert result.json()["executor"].startswith("Dask scheduler tcp://127.0.0.1:")
    same_results(pd.read_parquet(tmp_path / "out" / "results.parquet"), reference)


def test_failing_run_is_recorded_and_the_suite_goes_on(cli, tmp_path: Path) -> None:
    text = (
        SUITE
        + """
[[group]]
name = "fine"
[[group]]
name = "impossible"
methods = ["greedy"]
seeds = [0]
set = { "policy.all_resident" = true, "hardware.capacity_gb" = 8 }
"""
    )
    suite = write_suite(tmp_path, text)
    out = tmp_path / "out"
    first = cli("bench", suite, "--jobs", "2", "--out", out, "--json")
    assert first.code == 1, first.err
    assert "2 runs failed" in first.err
    frame = pd.read_parquet(out / "results.parquet")
    assert len(frame) == 8 + 2  # both alpha points of the inherited sweep
    bad = frame[frame["group"] == "impossible"]
    assert (bad["run_status"] == "error").all()
    assert (frame[frame["group"] == "fine"]["run_status"] == "ok").all()
    assert (
        bad["error"].str.startswith("every expert resident needs 128 pages but the capacity allows 32").all()
    )
    assert bad["traceback"].str.contains("Traceback").all()
    assert "## Failed runs" in (out / "report.md").read_text(encoding="utf-8")

    again = cli("bench", suite, "--jobs", "1", "--out", out, "--json")
    again.assert_user_error("already holds 10 results", "--resume")
    resumed = cli("bench", suite, "--jobs", "1", "--out", out, "--resume", "--json")
    assert resumed.code == 1 and resumed.json()["ran"] == 2 and resumed.json()["skipped"] == 8


def test_run_one_never_raises_and_is_deterministic(tmp_path: Path) -> None:
    suite = load_suite(write_suite(tmp_path))
    spec = next(s for s in suite.specs if s.method == "greedy")
    a, b = run_one(spec), run_one(spec)
    keep = [k for k in a if k not in NONDETERMINISTIC]
    assert {k: a[k] for k in keep} == {k: b[k] for k in keep}
    broken = dataclasses.replace(spec, window=99)
    row = run_one(broken)
    assert row["run_status"] == "error" and row["error"] == "window 99 is outside the trace's 1 windows"


def test_store_writes_runs_atomically_and_ignores_foreign_files(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    store.save({"run_id": "abc", "run_status": "ok", "x": float("nan"), "group": "g"})
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["abc.json"]  # no temporary file left
    assert store.load("abc")["x"] is None
    (tmp_path / "runs" / "bad.json").write_text("{not json", encoding="utf-8")
    assert store.load("bad") is None and store.finished_ok(["abc", "bad", "zzz"]) == {"abc"}
    assert os.access(tmp_path / "runs" / "abc.json", os.R_OK)


def test_evaluate_kind_runs_a_strategy_and_documents_its_columns(tmp_path: Path) -> None:
    text = 'instance = "inst.toml"\nkind = "evaluate"\nmethods = ["static"]\n'
    text += 'set = { "trace.micro_batches" = 20 }\n'
    (spec,) = load_suite(write_suite(tmp_path, text)).specs
    row = run_one(spec)
    assert row["run_status"] == "ok", row["error"]
    assert row["micro_batches"] == 20 and row["p95_ms"] >= row["mean_ms"] > 0
    assert all(documented(c) for c in row), [c for c in row if not documented(c)]


def test_report_and_plots_of_mixed_run_kinds(tmp_path: Path) -> None:
    text = """
instance = "inst.toml"
work_limits = true
set = { "trace.micro_batches" = 20, "policy.window_batches" = 10 }
[[group]]
name = "solve"
methods = ["milp", "greedy"]
vary = { "trace.zipf_alpha" = [0.6, 1.2] }
[[group]]
name = "eval"
kind = "evaluate"
methods = ["static", "hot"]
vary = { "trace.zipf_alpha" = [0.6, 1.2] }
"""
    suite = load_suite(write_suite(tmp_path, text))
    frame = results_frame([run_one(spec) for spec in suite.specs])
    report = write_report(suite, frame, tmp_path / "out").read_text(encoding="utf-8")
    assert "## Group `solve`" in report and "## Group `eval`" in report and "P95 per-layer latency" in report
    plots = {p.name for p in (tmp_path / "out" / "plots").iterdir()}
    assert plots == {
        "gap-distribution.png",
        "time-vs-size-slow-loop.png",
        "time-vs-size-evaluate.png",
        "solve-trace-zipf-alpha.png",
        "eval-trace-zipf-alpha.png",
    }
