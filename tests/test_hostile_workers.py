"""User errors raised in worker processes: they reach the command as the same one-line error
(exit 2), never as a broken process pool with a traceback.

Two errors that only a worker meets: a trace file that is not an archive (the instance loads;
the trace is read where the run runs), and every expert resident in too little capacity (checked
when the slow loop builds its problem). `bench` keeps its documented contract (docs/bench.md): a
failing run is recorded with its one-line error, the suite goes on, and the exit status is 1.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import tomli_w
from conftest import ROOT, small_table

from comoe_opt.errors import InputError
from comoe_opt.instance import load_instance
from comoe_opt.parallel import parallel_map

SHORT = "every expert resident needs 24 pages but the capacity allows 8"
NOT_NPZ = "not a readable .npz archive"


def bad_trace(folder: Path) -> Path:
    """A valid instance whose trace file is not an .npz archive."""
    table = copy.deepcopy(small_table())
    table["trace"] = {"kind": "file", "path": "trace.npz", "tokens_per_batch": 8}
    (folder / "trace.npz").write_text("not a zip archive", encoding="utf-8")
    path = folder / "bad-trace.toml"
    path.write_text(tomli_w.dumps(table), encoding="utf-8")
    return path


def too_small(folder: Path) -> Path:
    """A valid instance that cannot keep every expert resident: 24 experts, 8 pages."""
    table = copy.deepcopy(small_table())
    table["hardware"]["capacity_gb"] = 2
    table["policy"]["all_resident"] = True
    path = folder / "too-small.toml"
    path.write_text(tomli_w.dumps(table), encoding="utf-8")
    return path


def test_evaluate_with_jobs(cli, tmp_path: Path) -> None:
    """The error of the report: an InputError, which did not survive pickling."""
    result = cli("evaluate", bad_trace(tmp_path), "--jobs", "2", "--strategies", "static,hot", "--json")
    result.assert_user_error("trace.npz", NOT_NPZ)
    assert result.out == ""


def test_paper_with_jobs(cli, tmp_path: Path) -> None:
    """The paper's sweeps need a synthetic trace; its first failed run ends it. Its progress lines
    (on stderr, documented) stay; the error is one line, the last."""
    result = cli(
        "paper", too_small(tmp_path), "--jobs", "2", "--regime", "none", "--out", tmp_path / "paper",
        "--sweep-batches", "1", "--table5-batches", "1", "--json",
    )  # fmt: skip
    assert result.code == 2 and result.out == ""
    assert "Traceback" not in result.err and "BrokenProcessPool" not in result.err
    lines = result.err.strip().splitlines()
    assert [line for line in lines if not line.startswith("paper ")] == [lines[-1]]
    assert lines[-1].startswith(f"comoe-opt: error: {SHORT}")


FAIL_IN_WORKERS = """
import comoe_opt.evaluator.runs as runs
from comoe_opt.errors import InputError


def fail(instance, strategy, *args, **kwargs):
    raise InputError("sweep.toml", "runtime.route_ms", f"cannot be used with {strategy}")


runs.evaluate_strategy = fail
"""

MAIN = """
import sys
import comoe_opt.parallel as parallel
real_context = parallel._context
parallel._context = lambda preload: real_context([*preload, "fail_in_workers"])  # the fork server only
from comoe_opt.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_paper_with_jobs_and_an_input_error(tmp_path: Path) -> None:
    """Every error of a paper's instance is met in this process (its sweeps are built here), so
    an InputError is planted in the workers alone: the class that did not survive pickling."""
    (tmp_path / "fail_in_workers.py").write_text(FAIL_IN_WORKERS, encoding="utf-8")
    instance = tmp_path / "inst.toml"
    instance.write_text(tomli_w.dumps(small_table()), encoding="utf-8")
    settings = ["--jobs", "2", "--regime", "none", "--sweep-batches", "1", "--table5-batches", "1", "--json"]
    command = [sys.executable, "-c", MAIN, "paper", str(instance), "--out", str(tmp_path / "paper")]
    command += settings
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert "Traceback" not in done.stderr and "BrokenProcessPool" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert [line for line in lines if not line.startswith("paper ")] == [lines[-1]]
    assert lines[-1].startswith("comoe-opt: error: sweep.toml: runtime.route_ms: cannot be used with ")


def test_gap(cli, tmp_path: Path) -> None:
    """`gap` runs in one process; the same errors are one line too."""
    cli("gap", bad_trace(tmp_path), "--slow-windows", "0", "--json").assert_user_error("trace.npz", NOT_NPZ)
    cli("gap", too_small(tmp_path), "--windows", "2", "--json").assert_user_error(SHORT)


SUITE = """
name = "hostile"
methods = ["greedy"]
seeds = [0]
[[group]]
name = "bad-trace"
instance = "bad-trace.toml"
[[group]]
name = "too-small"
instance = "too-small.toml"
"""


def run_bench(cli, folder: Path, *where: str) -> pd.DataFrame:
    """Every run fails with a user error: recorded with its one-line message, exit 1, the summary
    on stdout, no traceback on stderr."""
    bad_trace(folder), too_small(folder)
    suite = folder / "suite.toml"
    suite.write_text(SUITE, encoding="utf-8")
    result = cli("bench", suite, *where, "--out", folder / "out", "--no-plots", "--json")
    assert result.code == 1, result.err
    assert result.json()["failed"] == 2
    assert "Traceback" not in result.err and "comoe-opt: 2 runs failed" in result.err
    frame = pd.read_parquet(folder / "out" / "results.parquet").set_index("group")
    assert (frame["run_status"] == "error").all()
    assert frame.loc["bad-trace", "error"].startswith(f"{folder / 'trace.npz'}: {NOT_NPZ}")
    assert frame.loc["too-small", "error"].startswith(SHORT)
    return frame


def test_bench_local_pool(cli, tmp_path: Path) -> None:
    frame = run_bench(cli, tmp_path, "--jobs", "2")
    assert frame["traceback"].str.contains("Traceback").all()  # kept in the results, for bug reports


def test_bench_dask_local_cluster(cli, tmp_path: Path) -> None:
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(
        n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None, host="127.0.0.1"
    )
    try:
        run_bench(cli, tmp_path, "--scheduler", cluster.scheduler_address)
    finally:
        cluster.close()


def test_a_user_error_in_a_worker_reaches_the_parent_whole(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text(tomli_w.dumps(small_table()), encoding="utf-8")
    bad = tmp_path / "bad.toml"
    table = small_table()
    table["model"]["layers"] = 0
    bad.write_text(tomli_w.dumps(table), encoding="utf-8")
    # last in this file: the first pool starts the fork server, with the solver stack preloaded
    with pytest.raises(InputError) as caught:
        parallel_map(load_instance, [good, bad], 2)  # a package function: workers import no test
    exc = caught.value
    assert (exc.source, exc.field) == (str(bad), "model.layers")
    assert str(exc).startswith(f"{bad}: model.layers: ") and exc.problem in str(exc)
