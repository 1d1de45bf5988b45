"""The one HiGHS adapter: solve a Pyomo model, map HiGHS's status onto the project's `Status`.

Every MILP and LP of the project (the slow loop's models, the fast loop's
exact reference) is solved here. Uses Pyomo's persistent HiGHS interface
(`pyomo.contrib.appsi`), which accepts a warm start from the model's variable
values and reports the incumbent and the dual bound of a time-limited solve
without raising. No `threads` option is set: HiGHS keeps one thread pool per
process and refuses a different count once a solve has started it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pyomo.environ as pyo
from pyomo.contrib.appsi.base import TerminationCondition as TC
from pyomo.contrib.appsi.solvers import Highs

from comoe_opt.results import Status

_STATUS = {
    TC.optimal: Status.OPTIMAL,
    TC.maxTimeLimit: Status.TIME_LIMIT,
    TC.maxIterations: Status.FEASIBLE,
    TC.objectiveLimit: Status.FEASIBLE,
    TC.infeasible: Status.INFEASIBLE,
    TC.infeasibleOrUnbounded: Status.INFEASIBLE,
    TC.unbounded: Status.UNBOUNDED,
    TC.interrupted: Status.TIME_LIMIT,
    TC.error: Status.ERROR,
    TC.unknown: Status.ERROR,
}


@dataclass(frozen=True)
class HighsOutcome:
    status: Status
    objective: float  # incumbent, inf when none
    bound: float  # dual bound, -inf when none
    runtime_s: float
    solver_status: str  # HiGHS's own termination condition, for reports


def solve_with_highs(
    model: pyo.ConcreteModel,
    *,
    time_limit_s: float | None = None,
    mip_gap: float | None = None,
    warm_start: bool = False,
    options: dict | None = None,
) -> HighsOutcome:
    """Solve `model`, load the incumbent into its variables, return status and bounds."""
    solver = Highs()
    solver.config.load_solution = False
    solver.config.stream_solver = False
    solver.config.warmstart = warm_start
    if time_limit_s is not None:
        solver.config.time_limit = max(time_limit_s, 0.01)
    if mip_gap is not None:
        solver.config.mip_gap = mip_gap
    solver.highs_options = {"random_seed": 0, **(options or {})}
    start = time.perf_counter()
    results = solver.solve(model)
    runtime = time.perf_counter() - start
    status = _STATUS.get(results.termination_condition, Status.ERROR)
    objective = results.best_feasible_objective
    bound = results.best_objective_bound
    has_incumbent = objective is not None and abs(objective) != float("inf")
    if has_incumbent:
        results.solution_loader.load_vars()
    elif status in (Status.TIME_LIMIT, Status.FEASIBLE):
        status = Status.ERROR if status == Status.FEASIBLE else status
    return HighsOutcome(
        status=status,
        objective=float(objective) if has_incumbent else float("inf"),
        bound=float(bound) if bound is not None else float("-inf"),
        runtime_s=runtime,
        solver_status=str(results.termination_condition.name),
    )
