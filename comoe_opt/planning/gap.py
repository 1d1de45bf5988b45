"""Slow-loop methods against the proven bound on the same trace windows.

The reference is `exact` (the replica-count MILP and, with balance scenarios,
the exact scenario model): its bound is a proven lower bound on each window's
optimum, so every method's gap to it is an upper bound on its true gap.
Gaps are on the part of the objective a placement changes.
"""

from __future__ import annotations

import statistics
from typing import Any

import pandas as pd

from comoe_opt.instance import Instance
from comoe_opt.planning.rolling import reproducible_limit
from comoe_opt.planning.window import plan_window
from comoe_opt.residency.heuristics import HEURISTICS
from comoe_opt.residency.solve import solve
from comoe_opt.results import relative_gap
from comoe_opt.trace.batching import MicroBatches, windows


def slow_loop_gap(instance: Instance, batches: MicroBatches, count: int = 3) -> pd.DataFrame:
    """Per window and method: objective, gap to the proven bound and to the best objective found."""
    rows: list[dict[str, Any]] = []
    policy = instance.policy
    for w, (start, stop) in enumerate(windows(batches.batches, policy.window_batches)[:count]):
        # every method on the work limits of an evaluation: the table does not depend on the machine
        limit = reproducible_limit("exact")
        plan = plan_window(instance, batches.window(start, stop), method="exact", time_limit_s=limit)
        reference = plan.result
        results = {"exact": reference}
        for name in ("milp", *HEURISTICS):
            results[name] = solve(
                plan.problem, name, time_limit_s=reproducible_limit(name), mip_gap=policy.mip_gap
            )
        bound = max(r.bound for r in results.values())
        best = min(r.objective for r in results.values())
        constant = plan.problem.constant_ms
        for name, r in results.items():
            rows.append(
                {
                    "window": w,
                    "method": name,
                    "objective": r.objective,
                    "gap_to_bound": relative_gap(r.objective, bound, constant),
                    "gap_to_best": relative_gap(r.objective, best, constant),
                    "time_s": r.runtime_s,
                    "status": r.status.value,
                }
            )
    return pd.DataFrame(rows)


def summarize_slow_gap(rows: pd.DataFrame) -> pd.DataFrame:
    out = []
    for method, part in rows.groupby("method", sort=False):
        out.append(
            {
                "method": method,
                "windows": len(part),
                "mean_gap_to_bound": float(part["gap_to_bound"].mean()),
                "max_gap_to_bound": float(part["gap_to_bound"].max()),
                "mean_gap_to_best": float(part["gap_to_best"].mean()),
                "median_time_s": float(statistics.median(part["time_s"])),
            }
        )
    return pd.DataFrame(out)
