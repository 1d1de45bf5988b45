"""Solve a slow-loop window with any method; every method returns a `SolveResult` whose report
is its family's `ResidencyReport` (residency/report.py).

* heuristics (`static`, `hot`, `eplb`, `greedy`, ...: residency/heuristics/__init__.py): a placement,
  scored by the exact objective; no bound (`no_solution` when it breaks a constraint).
* `milp`, `exact`, `full`, `lp`: the models (residency/exact/pipeline.py), imported only when one is asked
  for, so that a heuristic, an export or a replay does not load Pyomo and HiGHS. Where the per-layer
  slots separate the layers, `milp` and `exact` solve each layer on its own (residency/exact/by_layer.py).

Gaps are signed and measured on the part of the objective a placement changes
(`problem.constant_ms`, every token's least NoP, is left out).
"""

from __future__ import annotations

import dataclasses
import math

from comoe_opt.deadline import Deadline
from comoe_opt.residency.exact import MODEL_METHODS
from comoe_opt.residency.heuristics import HEURISTICS
from comoe_opt.residency.heuristics.solve import solve_heuristic
from comoe_opt.residency.layer_slots import laid_out
from comoe_opt.residency.methods import RESIDENCY_METHODS
from comoe_opt.residency.objective import score
from comoe_opt.residency.problem import ResidencyProblem
from comoe_opt.residency.report import ModelReport, ResidencyResult
from comoe_opt.residency.search.even_descent import even_descent
from comoe_opt.results import status_from_gap

__all__ = ["MODEL_METHODS", "RESIDENCY_METHODS", "solve", "solve_heuristic"]


def solve(
    problem: ResidencyProblem,
    method: str = "milp",
    *,
    time_limit_s: float | None = None,
    mip_gap: float = 1e-3,
    deadline: Deadline | None = None,
) -> ResidencyResult:
    """Solve with `method` within `time_limit_s`, or within `deadline` when given (one that started
    earlier, e.g. with building the problem); every phase draws on the same deadline. Without
    either, every phase ends on work limits: the same result on any machine and load. With
    `problem.layer_slots`, the plan is laid out within it (residency/layer_slots.py); with
    `problem.split = "even"`, the models' plan is then re-arranged for the even split
    (residency/search/even_descent.py)."""
    result = laid_out(problem, _solve(problem, method, time_limit_s, mip_gap, deadline))
    if problem.split == "even" and method in MODEL_METHODS:
        result = _even_refined(problem, result, mip_gap, deadline)
    return result


def _even_refined(
    problem: ResidencyProblem, result: ResidencyResult, mip_gap: float, deadline: Deadline | None
) -> ResidencyResult:
    """`result` with its placement improved for the even split; its status from the new gap (the
    bound, the best split's, stands: formulations/residency.md, "The even split")."""
    if result.solution is None:
        return result
    found = even_descent(problem, result.solution, deadline)
    terms = score(problem, found)
    # with layer slots the descent first fills every free slot (an engine's map is full and each
    # slot takes its share), so its plan is kept even where the plan with holes scored lower
    if terms.total >= result.objective and not problem.layer_slots:
        return result
    status = status_from_gap(result.status, terms.total, result.bound, mip_gap, result.constant)
    report = dataclasses.replace(result.report, terms=terms)
    if isinstance(report, ModelReport):
        report = dataclasses.replace(report, placement_from=f"{report.placement_from} + even-split descent")
    return dataclasses.replace(result, status=status, objective=terms.total, solution=found, report=report)


def _solve(
    problem: ResidencyProblem,
    method: str,
    time_limit_s: float | None,
    mip_gap: float,
    deadline: Deadline | None,
) -> ResidencyResult:
    if deadline is None:
        deadline = Deadline(math.inf if time_limit_s is None else time_limit_s)
    if method in HEURISTICS:
        return solve_heuristic(problem, method, deadline)
    if method not in MODEL_METHODS:
        raise ValueError(f"unknown method {method!r} (known: {', '.join(RESIDENCY_METHODS)})")
    from comoe_opt.residency.exact import pipeline as milp  # the MILP stack, loaded when a model is asked for

    if method in ("milp", "exact"):
        from comoe_opt.residency.exact import by_layer

        exact = method == "exact"
        if by_layer.applies(problem, deadline.remaining()):
            return by_layer.solve_by_layer(problem, deadline=deadline, mip_gap=mip_gap, exact=exact)
        return milp.solve_milp(problem, deadline=deadline, mip_gap=mip_gap, exact=exact)
    if method == "full":
        return milp.solve_full(problem, deadline=deadline, mip_gap=mip_gap)
    return milp.solve_lp(problem, deadline)
