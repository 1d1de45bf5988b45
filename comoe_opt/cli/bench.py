"""`comoe-opt bench SUITE`: run a benchmark suite locally or on a Dask cluster."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from comoe_opt.bench.provenance import available_cores
from comoe_opt.bench.runner import BenchOutcome, describe_suite, run_suite
from comoe_opt.bench.suite import load_suite


def cmd_bench(args: argparse.Namespace) -> dict[str, Any]:
    suite = load_suite(args.suite)
    if args.dry_run:
        return describe_suite(suite)
    out = args.out if args.out is not None else Path("bench-out") / suite.name
    jobs = args.jobs if args.jobs is not None else available_cores()
    outcome = run_suite(
        suite, out, jobs=jobs, scheduler=args.scheduler, resume=args.resume, plots=not args.no_plots
    )
    result = _result(outcome)
    # the report is the output either way; the status tells scripts the suite is incomplete
    result["_exit"] = outcome.exit_status
    if outcome.exit_status and outcome.interrupted is None:
        print(f"comoe-opt: {outcome.failed} runs failed (see {out / 'report.md'})", file=sys.stderr)
    return result


def _result(o: BenchOutcome) -> dict[str, Any]:
    state = "interrupted" if o.interrupted is not None else "complete" if not o.missing else "incomplete"
    text = (
        f"{o.suite}: {state}; {o.total} runs: {o.skipped} finished before, {o.ran} run now, "
        f"{o.failed} failed, {o.missing} missing; {o.wall_s:.1f} s ({o.executor})\n"
        f"results {o.out / 'results.parquet'}\nreport  {o.out / 'report.md'}"
    )
    return {
        "suite": o.suite,
        "state": state,
        "runs": o.total,
        "skipped": o.skipped,
        "ran": o.ran,
        "failed": o.failed,
        "missing": o.missing,
        "wall_s": o.wall_s,
        "executor": o.executor,
        "results": str(o.out / "results.parquet"),
        "report": str(o.out / "report.md"),
        "_text": text,
    }
