"""Batch benchmark runner: suites of instances x methods x seeds, run in a local process pool or on
a Dask cluster, stored run by run (resumable), consolidated into Parquet, a Markdown report and plots.

    suite = load_suite("benchmarks/suites/smoke.toml")
    outcome = run_suite(suite, Path("bench-out/smoke"), jobs=2)
"""

from comoe_opt.bench.kinds import PLANNED_KINDS, RUN_KINDS, RunKind, run_one
from comoe_opt.bench.runner import BenchOutcome, run_suite
from comoe_opt.bench.spec import RunSpec
from comoe_opt.bench.store import NONDETERMINISTIC, ResultStore, deterministic_columns, results_frame
from comoe_opt.bench.suite import Group, Suite, expand_suite, load_suite

__all__ = [
    "NONDETERMINISTIC",
    "PLANNED_KINDS",
    "RUN_KINDS",
    "BenchOutcome",
    "Group",
    "ResultStore",
    "RunKind",
    "RunSpec",
    "Suite",
    "deterministic_columns",
    "expand_suite",
    "load_suite",
    "results_frame",
    "run_one",
    "run_suite",
]
