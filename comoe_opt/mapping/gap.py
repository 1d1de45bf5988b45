"""How far each fast-loop method is from the exact minimum makespan, over trace samples.

A sample is one (micro-batch, layer) mapping problem. Every method's mapping
is re-scored with the one makespan definition (`evaluate.makespan_ticks`),
and compared with the exact optimum of `exact.solve_exact`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from comoe_opt.instance import Instance
from comoe_opt.mapping.exact import solve_exact
from comoe_opt.mapping.flow import solve_min_cost_flow
from comoe_opt.mapping.heuristics import HEURISTICS
from comoe_opt.mapping.makespan import makespan_ticks, on_demand_loads, pair_counts
from comoe_opt.mapping.placement import default_placement
from comoe_opt.mapping.problem import LayerCosts, MappingProblem, layer_costs
from comoe_opt.mapping.report import MappingResult
from comoe_opt.trace.batching import MicroBatches

Method = Callable[[MappingProblem], MappingResult]
MAPPING_METHODS: dict[str, Method] = {"min-cost-flow": solve_min_cost_flow, **HEURISTICS}


@dataclass(frozen=True)
class GapReport:
    """Per-method summary and the per-(sample, method) rows behind it."""

    summary: pd.DataFrame  # one row per method
    samples: pd.DataFrame  # one row per (sample, method)
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {**self.meta, "methods": self.summary.to_dict(orient="records")}


def sample_windows(batches: MicroBatches, count: int, seed: int, skip: int = 0) -> np.ndarray:
    """[n, 2] (micro-batch, layer) pairs, drawn without replacement from batches `skip..`, sorted."""
    first = skip if skip < batches.batches else 0
    pool = (batches.batches - first) * batches.layers
    rng = np.random.default_rng(seed)
    picks = np.sort(rng.choice(pool, size=min(count, pool), replace=False))
    return np.stack((first + picks // batches.layers, picks % batches.layers), axis=1)


def sample_problems(
    batches: MicroBatches, costs: Sequence[LayerCosts], windows: np.ndarray
) -> list[MappingProblem]:
    return [MappingProblem(batches.experts[b, :, l, :], costs[l]) for b, l in windows.tolist()]


def gap_samples(problems: Sequence[MappingProblem], methods: dict[str, Method] | None = None) -> pd.DataFrame:
    """One row per (sample, method): makespan, the optimum, relative gap, time, on-demand loads."""
    methods = MAPPING_METHODS if methods is None else methods
    rows = []
    for index, problem in enumerate(problems):
        exact = solve_exact(problem)
        optimum = exact.report.makespan_ticks
        if optimum is None:
            raise ValueError(f"sample {index}: {exact.status.value}, no mapping to compare with")
        rows.append(_row(index, "exact", problem, exact, optimum))
        for name, method in methods.items():
            rows.append(_row(index, name, problem, method(problem), optimum))
    return pd.DataFrame(rows)


def _row(
    index: int, name: str, problem: MappingProblem, result: MappingResult, optimum: int
) -> dict[str, Any]:
    if result.solution is None:
        return {"sample": index, "method": name, "status": result.status.value, "runtime_s": result.runtime_s}
    counts = pair_counts(problem.costs, problem.experts, result.solution)
    span = makespan_ticks(problem.costs, problem.experts, result.solution)
    return {
        "sample": index,
        "method": name,
        "status": result.status.value,
        "makespan_ticks": span,
        "optimum_ticks": optimum,
        "gap": (span - optimum) / optimum,
        "deviation_s": (span - optimum) * problem.costs.tick_s,
        "runtime_s": result.runtime_s,
        "loads": on_demand_loads(problem.costs, counts),
    }


def gap_summary(samples: pd.DataFrame) -> pd.DataFrame:
    """Per method: mean, P95 and max gap, share of samples at the optimum, median time, loads."""
    grouped = samples.groupby("method", sort=False)
    return pd.DataFrame(
        {
            "samples": grouped["gap"].count(),
            "mean_gap": grouped["gap"].mean(),
            "p95_gap": grouped["gap"].quantile(0.95),
            "max_gap": grouped["gap"].max(),
            "optimal_share": grouped["gap"].apply(lambda g: float((g == 0).mean())),
            "max_deviation_s": grouped["deviation_s"].max(),
            "median_time_us": grouped["runtime_s"].median() * 1e6,
            "loads_per_sample": grouped["loads"].mean(),
        }
    ).reset_index()


def fast_loop_gap(
    instance: Instance,
    batches: MicroBatches,
    *,
    windows: int = 200,
    seed: int = 0,
    placement: np.ndarray | None = None,
    methods: dict[str, Method] | None = None,
) -> GapReport:
    """Gap of every method over `windows` (micro-batch, layer) samples under a placement.

    Without `placement` ([L, E, C] bool), the built-in one from the policy's
    first window is used and samples come from the micro-batches after it.
    """
    began = time.perf_counter()
    profile = instance.policy.window_batches
    built_in = placement is None
    placement = default_placement(instance, batches, profile) if placement is None else placement
    costs = [layer_costs(instance, placement[l]) for l in range(batches.layers)]
    picks = sample_windows(batches, windows, seed, skip=profile if built_in else 0)
    samples = gap_samples(sample_problems(batches, costs, picks), methods)
    meta = {
        "instance": instance.name,
        "samples": len(picks),
        "placement": "built-in (hottest first, round-robin, replicas)" if built_in else "given",
        "replica_factor": float(placement.sum() / max(placement.any(axis=2).sum(), 1)),
        "tokens_per_batch": batches.tokens_per_batch,
        "top_k": batches.top_k,
        "seconds": time.perf_counter() - began,
    }
    return GapReport(gap_summary(samples), samples, meta)
