"""Exact minimum makespan as a small MILP (Pyomo, HiGHS), and its LP relaxation bound.

Written from the makespan definition alone, per expert and without the flow
network, so that it checks the flow methods independently
(formulations/mapping.md §5):

    min T
    sum_c n[e,c] = d_e                                   every selection served
    n[e,c] <= d_e * u[c, j(e,c)]                         a used level is active
    u[c, j'] <= u[c, j]           for consecutive levels j < j' of chiplet c
    T >= (base_c + tau_c * j) * u[c, j] + tau_c * sum_{e: j(e,c) >= j} n[e,c]
    T >= earliest completion of one token of every demanded expert (valid cut)

with integer n >= 0 and binary u. Times are in ticks, so the optimum is an
integer; the solve asks for a zero relative gap.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time

import numpy as np
import pyomo.environ as pyo

from comoe_opt.highs import lp_work, mip_work, solve_with_highs
from comoe_opt.mapping.makespan import makespan_ticks, mapping_result
from comoe_opt.mapping.problem import MappingProblem
from comoe_opt.mapping.report import MappingResult, MilpReport
from comoe_opt.results import SolveResult, Status


def build_milp(problem: MappingProblem, *, relax: bool = False) -> pyo.ConcreteModel:
    """The makespan MILP of one micro-batch (its LP relaxation with `relax=True`)."""
    costs = problem.costs
    demand = problem.demand()
    usable = (costs.slots >= 0) & (demand[:, None] > 0)
    pairs = [(int(e), int(c)) for e, c in zip(*np.nonzero(usable), strict=True)]
    slot = {(e, c): int(costs.slots[e, c]) for e, c in pairs}
    levels = sorted({(c, j) for (_, c), j in slot.items()})
    nested = [(c, j, k) for (c, j), (c2, k) in itertools.pairwise(levels) if c == c2]
    base, tau = costs.base.tolist(), costs.token_time.tolist()
    by_expert: dict[int, list[int]] = {}
    for e, c in pairs:
        by_expert.setdefault(e, []).append(c)

    def serve(m: pyo.ConcreteModel, e: int) -> pyo.Expression:
        return sum(m.n[e, c] for c in by_expert[e]) == int(demand[e])

    def level_used(m: pyo.ConcreteModel, e: int, c: int) -> pyo.Expression:
        return m.n[e, c] <= int(demand[e]) * m.u[c, slot[e, c]]

    def finish(m: pyo.ConcreteModel, c: int, j: int) -> pyo.Expression:
        later = sum(m.n[e, c] for e in by_expert if (e, c) in slot and slot[e, c] >= j)
        return (base[c] + tau[c] * j) * m.u[c, j] + tau[c] * later <= m.T

    m = pyo.ConcreteModel(name="makespan")
    m.n = pyo.Var(pairs, domain=pyo.NonNegativeReals if relax else pyo.NonNegativeIntegers)
    m.u = pyo.Var(levels, domain=pyo.UnitInterval if relax else pyo.Binary)
    m.T = pyo.Var(domain=pyo.NonNegativeReals, bounds=(_single_token_bound(problem), None))
    m.serve = pyo.Constraint(sorted(by_expert), rule=serve)
    m.level_used = pyo.Constraint(pairs, rule=level_used)
    m.nested = pyo.Constraint(nested, rule=lambda m, c, j, k: m.u[c, k] <= m.u[c, j])
    m.finish = pyo.Constraint(levels, rule=finish)
    m.makespan = pyo.Objective(expr=m.T, sense=pyo.minimize)
    return m


MILP_NODES = (
    100_000  # branch-and-bound nodes of the exact reference, at most (the tests' cases close in a few)
)


def _single_token_bound(problem: MappingProblem) -> float:
    costs = problem.costs
    used = np.unique(problem.experts)
    done = np.where(costs.slots[used] >= 0, costs.base + (costs.slots[used] + 1) * costs.token_time, np.inf)
    return float(done.min(axis=1).max())


def solve_exact_milp(
    problem: MappingProblem, *, time_limit_s: float | None = None, nodes: int = MILP_NODES
) -> MappingResult:
    """Solve the MILP with HiGHS; the report carries the LP relaxation bound.

    Without a time limit (the default) the solve runs to proven optimality or `nodes`
    branch-and-bound nodes (then `feasible`, with its bound).
    """
    began = time.perf_counter()
    lp = lp_bound(problem)
    model = build_milp(problem)
    outcome = solve_with_highs(model, time_limit_s=time_limit_s, mip_gap=0.0, options=mip_work(nodes))
    report = MilpReport(
        makespan_ticks=None, tick_s=problem.costs.tick_s, lp_bound_ticks=lp, termination=outcome.solver_status
    )
    if not math.isfinite(outcome.objective):
        return SolveResult(
            "milp", outcome.status, math.inf, -math.inf, time.perf_counter() - began, report=report
        )
    assignment = _assignment(problem, model)
    span = makespan_ticks(problem.costs, problem.experts, assignment)
    bound = max(outcome.bound, lp)
    if outcome.status is Status.OPTIMAL:
        bound = span  # the optimum is an integer and HiGHS closed the gap on it
    report = dataclasses.replace(report, makespan_ticks=span)
    return mapping_result("milp", outcome.status, problem, assignment, span, bound, began, report)


def lp_bound(problem: MappingProblem) -> float:
    """Optimal value (ticks) of the MILP's LP relaxation: a lower bound on the makespan."""
    model = build_milp(problem, relax=True)
    outcome = solve_with_highs(model, options=lp_work(model.nconstraints(), model.nvariables()))
    return outcome.objective if outcome.status is Status.OPTIMAL else -math.inf


def _assignment(problem: MappingProblem, model: pyo.ConcreteModel) -> np.ndarray:
    """Tokens from the integer counts n[e, c]: each expert's selections, chiplet by chiplet."""
    flat = problem.experts.ravel()
    out = np.empty(flat.size, dtype=np.int16)
    for e in np.unique(flat).tolist():
        where = np.flatnonzero(flat == e)
        chiplets = [c for (e2, c) in model.n if e2 == e]
        counts = [round(pyo.value(model.n[e, c])) for c in chiplets]
        out[where] = np.repeat(chiplets, counts)
    return out.reshape(problem.experts.shape)
