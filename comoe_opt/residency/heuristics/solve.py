"""A heuristic's result: its placement scored by the exact objective (residency/heuristics/__init__.py
plans, this module times and scores). Shared by `solve` and the models' warm start."""

from __future__ import annotations

import dataclasses
import math
import time

from comoe_opt.deadline import Deadline
from comoe_opt.residency.heuristics import HEURISTICS
from comoe_opt.residency.objective import check_feasible, score
from comoe_opt.residency.problem import ResidencyProblem
from comoe_opt.residency.report import HeuristicReport, ResidencyResult
from comoe_opt.results import SolveResult, Status, Timing


def solve_heuristic(
    problem: ResidencyProblem, name: str, deadline: Deadline | None = None
) -> ResidencyResult:
    """A heuristic's placement, scored exactly; `no_solution` when it breaks a constraint. One step
    that the time limit does not interrupt (milliseconds to a second)."""
    deadline = Deadline(math.inf) if deadline is None else deadline
    with deadline.phase("heuristic"):
        result = heuristic_result(problem, name)
    return dataclasses.replace(result, report=dataclasses.replace(result.report, timing=deadline.timing()))


def heuristic_result(problem: ResidencyProblem, name: str) -> ResidencyResult:
    """The heuristic's result, timed on its own (its report's timing has the one phase `heuristic`)."""
    start = time.perf_counter()
    placement = HEURISTICS[name].plan(problem)
    runtime = time.perf_counter() - start  # the heuristic itself; scoring is not its cost
    timing = Timing(time_limit_s=None, total_s=runtime, phases={"heuristic": runtime})
    violations = check_feasible(problem, placement)
    if violations:
        report = HeuristicReport(terms=None, violations=tuple(violations), timing=timing)
        return SolveResult(
            name, Status.NO_SOLUTION, math.inf, -math.inf, runtime, None, problem.constant_ms, report=report
        )
    terms = score(problem, placement)
    return SolveResult(
        name,
        Status.FEASIBLE,
        terms.total,
        -math.inf,
        runtime,
        placement,
        problem.constant_ms,
        report=HeuristicReport(terms=terms, timing=timing),
    )
