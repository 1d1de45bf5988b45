"""Run kinds: what one benchmark run computes, and the worker entry point `run_one`.

A run kind is a function `RunSpec -> dict of scalars` (its metrics). It is
pure: everything it needs is in the spec, and the same spec gives the same
metrics (timings aside). Adding a kind is one line in `RUN_KINDS`.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from comoe_opt.bench.provenance import package_versions
from comoe_opt.bench.spec import RunSpec
from comoe_opt.errors import ComoeError
from comoe_opt.evaluator.strategies import STRATEGIES
from comoe_opt.planning import plan_window
from comoe_opt.residency import RESIDENCY_METHODS
from comoe_opt.residency.report import FullModelReport, ModelReport
from comoe_opt.trace import instance_batches

Metrics = dict[str, Any]


@dataclass(frozen=True)
class RunKind:
    run: Callable[[RunSpec], Metrics]
    methods: tuple[str, ...]  # valid values of a spec's `method` (slow-loop method, strategy)
    headline: str  # the metric plotted against sweep variables
    tables: tuple[str, ...]  # the metrics the report tabulates (point x method)
    windows: bool = False  # whether the spec's `window` means something to this kind


def run_slow_loop(spec: RunSpec) -> Metrics:
    """Solve window `spec.window` of the instance's trace with `spec.method` (no previous placement)."""
    instance = spec.instance()
    part = instance_batches(instance).planning_window(spec.window, instance.policy.window_batches)
    plan = plan_window(
        instance, part, method=spec.method, time_limit_s=spec.time_limit_s, mip_gap=spec.mip_gap
    )
    result, problem = plan.result, plan.problem
    report, placement = result.report, result.solution
    terms = report.terms
    solver = report if isinstance(report, ModelReport | FullModelReport) else None
    return {
        "solver_status": result.status.value,
        "objective": _finite(result.objective),
        "bound": _finite(result.bound),
        "gap": _finite(result.gap),
        "runtime_s": result.runtime_s,
        "build_s": None if solver is None else solver.build_s,
        "solver_s": None if solver is None else solver.solver_s,
        "pages": None if placement is None else placement.pages,
        "distinct_experts": None if placement is None else placement.distinct,
        "replica_factor": None if placement is None else placement.replica_factor(),
        "extra_replica_ratio": None if placement is None else placement.extra_replica_ratio(),
        "expected_balance": None if terms is None else terms.expected_balance,
        "pages_moved": None if terms is None else terms.pages_moved,
        "balance_ms": None if terms is None else terms.balance_ms,
        "miss_ms": None if terms is None else terms.miss_ms,
        "nop_ms": None if terms is None else terms.nop_ms,
        "migration_ms": None if terms is None else terms.migration_ms,
        "placement_from": report.placement_from if isinstance(report, ModelReport) else None,
        "window_batches": part.batches,
        "layers": problem.layers,
        "experts": problem.experts,
        "chiplets": problem.chiplets,
    }


def run_evaluate(spec: RunSpec) -> Metrics:
    """Evaluate strategy `spec.method` over the instance's whole trace (the analytic latency model)."""
    from comoe_opt.evaluator.runs import evaluate_strategy  # the evaluator loads only where it runs

    instance = spec.instance()
    metrics = dict(evaluate_strategy(instance, spec.method))
    metrics.pop("strategy", None)  # the `method` column already says it
    metrics["strategy_label"] = metrics.pop("label", None)
    model = instance.model
    return {
        **metrics,
        "layers": model.layers,
        "experts": model.experts_per_layer,
        "chiplets": instance.hardware.chiplets,
    }


RUN_KINDS: dict[str, RunKind] = {
    "slow-loop": RunKind(
        run_slow_loop,
        tuple(RESIDENCY_METHODS),
        "objective",
        ("objective", "gap_to_best_bound", "runtime_s"),
        windows=True,
    ),
    "evaluate": RunKind(
        run_evaluate,
        tuple(STRATEGIES),
        "p95_ms",
        (
            "p95_ms",
            "mean_ms",
            "load_gb_per_batch",
            "balance",
            "token_imbalance_p95",
            "replica_factor",
            "runtime_s",
        ),
    ),
}

# Kinds a suite may name once their module lands; until then validation says so.
PLANNED_KINDS = {
    "fast-loop": "the token-to-replica mapping on its own (comoe_opt.mapping)",
}


def run_one(spec: RunSpec) -> dict[str, Any]:
    """Run one spec and return its result row; never raises for a failing run.

    The row holds the spec's columns, the kind's metrics, `run_status` ("ok"
    or "error" with a one-line `error` and the `traceback`), and the worker's
    wall time, host and package versions. The same function runs in the local
    process pool and on Dask workers.
    """
    start = time.perf_counter()
    row = spec_columns(spec)
    try:
        metrics = RUN_KINDS[spec.kind].run(spec)
        row.update(metrics, run_status="ok", error=None, traceback=None)
    except Exception as exc:  # a failing run is a result, not the end of the suite
        row.update(run_status="error", error=one_line(exc), traceback=traceback.format_exc())
    row["wall_s"] = time.perf_counter() - start
    row["finished_at"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    row["worker"] = f"{socket.gethostname()}:{os.getpid()}"
    row.update(package_versions())
    return row


def spec_columns(spec: RunSpec) -> dict[str, Any]:
    """The columns every row has, from the spec alone; swept values under their dotted instance key."""
    row: dict[str, Any] = {
        "run_id": spec.run_id,
        "suite": spec.suite,
        "group": spec.group,
        "kind": spec.kind,
        "method": spec.method,
        "seed": spec.seed,
        "window": spec.window,
        "instance": spec.instance_name,
        "point": spec.point_label,
        "time_limit_s": None if spec.work_limits else spec.time_limit_s,  # None: work limits
        "mip_gap": spec.mip_gap,
    }
    row.update(dict(spec.point))
    return row


def one_line(exc: BaseException) -> str:
    """A user error's own message; anything else prefixed by its type (it is a bug somewhere)."""
    text = str(exc).strip().splitlines()
    message = text[0] if text else ""
    if isinstance(exc, ComoeError):
        return message or type(exc).__name__
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
