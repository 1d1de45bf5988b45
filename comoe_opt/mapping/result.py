"""The `SolveResult` every mapping method returns."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from comoe_opt.mapping.problem import MappingProblem
from comoe_opt.results import SolveResult, Status


def mapping_result(
    method: str,
    status: Status,
    problem: MappingProblem,
    assignment: np.ndarray,
    makespan: int,
    bound: float,
    began: float,
    report: dict[str, Any] | None = None,
) -> SolveResult[np.ndarray]:
    """Objective and bound in seconds; the exact integers stay in the report.

    `assignment[s, r]` is the chiplet serving token `s`'s rank-`r` expert.
    `bound` is in ticks (-inf when the method proves nothing).
    """
    tick = problem.costs.tick_s
    full = {"makespan_ticks": makespan, "tick_s": tick, **(report or {})}
    return SolveResult(
        method=method,
        status=status,
        objective=makespan * tick,
        bound=bound * tick if np.isfinite(bound) else -np.inf,
        runtime_s=time.perf_counter() - began,
        solution=assignment,
        report=full,
    )
