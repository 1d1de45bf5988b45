"""Slow-loop heuristics against the MILP on the same trace windows."""

from __future__ import annotations

import statistics
from typing import Any

import pandas as pd

from comoe_opt.instance import Instance
from comoe_opt.planning.window import plan_window
from comoe_opt.residency.heuristics import HEURISTICS
from comoe_opt.residency.solve import solve
from comoe_opt.results import relative_gap
from comoe_opt.trace.batching import MicroBatches, windows


def slow_loop_gap(instance: Instance, batches: MicroBatches, count: int = 3) -> pd.DataFrame:
    """Per method: objective gap to the MILP's proven bound and to its objective, over `count` windows."""
    rows: list[dict[str, Any]] = []
    for w, (start, stop) in enumerate(windows(batches.batches, instance.policy.window_batches)[:count]):
        plan = plan_window(instance, batches.window(start, stop), method="milp")
        milp = plan.result
        for name in ("milp", *HEURISTICS):
            r = milp if name == "milp" else solve(plan.problem, name)
            rows.append(
                {
                    "window": w,
                    "method": name,
                    "objective": r.objective,
                    "gap_to_bound": relative_gap(r.objective, milp.bound),
                    "gap_to_milp": (r.objective - milp.objective) / max(abs(milp.objective), 1e-9),
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
                "mean_gap_to_milp": float(part["gap_to_milp"].mean()),
                "median_time_s": float(statistics.median(part["time_s"])),
            }
        )
    return pd.DataFrame(out)
