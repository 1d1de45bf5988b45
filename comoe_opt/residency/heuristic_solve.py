"""A heuristic's result: its placement scored by the exact objective (residency/heuristics.py
plans, this module times and scores). Shared by `solve` and the models' warm start."""

from __future__ import annotations

import dataclasses
import math
import time

from comoe_opt.deadline import Deadline
from comoe_opt.residency.heuristics import HEURISTICS
from comoe_opt.residency.objective import check_feasible, score
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.problem import ResidencyProblem
from comoe_opt.results import SolveResult, Status


def solve_heuristic(
    problem: ResidencyProblem, name: str, deadline: Deadline | None = None
) -> SolveResult[Placement]:
    """A heuristic's placement, scored exactly; `no_solution` when it breaks a constraint. One step
    that the time limit does not interrupt (milliseconds to a second)."""
    deadline = Deadline(math.inf) if deadline is None else deadline
    with deadline.phase("heuristic"):
        result = heuristic_result(problem, name)
    return dataclasses.replace(result, report={**result.report, **deadline.report()})


def heuristic_result(problem: ResidencyProblem, name: str) -> SolveResult[Placement]:
    start = time.perf_counter()
    placement = HEURISTICS[name].plan(problem)
    runtime = time.perf_counter() - start  # the heuristic itself; scoring is not its cost
    violations = check_feasible(problem, placement)
    if violations:
        report = {"violations": violations}
        return SolveResult(
            name, Status.NO_SOLUTION, math.inf, -math.inf, runtime, None, report, problem.constant_ms
        )
    terms = score(problem, placement)
    return SolveResult(
        name,
        Status.FEASIBLE,
        terms.total,
        -math.inf,
        runtime,
        placement,
        terms.to_dict(),
        problem.constant_ms,
    )
