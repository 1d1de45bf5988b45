"""Solve a slow-loop window with any method; every method returns a `SolveResult`.

* heuristics (`static`, `hot`, `eplb`, `greedy`): a placement, scored by the
  exact objective; no bound.
* `milp`: the replica-count MILP (HiGHS via Pyomo), warm-started from the best
  heuristic, gives a proven lower bound and replica counts; the counts are
  placed on chiplets and scored exactly. The result is the better of that
  placement and the warm start, so it is never worse than any heuristic.
  With balance scenarios, a local search (refine.py) then improves the
  placement — or the previous window's, when that is better — on them.
* `full`: the plain residency MILP over x[l,e,c] (exact, for small instances).
* `lp`: the LP relaxation bound of the replica-count model (no placement).
"""

from __future__ import annotations

import time

import numpy as np
import pyomo.environ as pyo

from comoe_opt.highs import solve_with_highs
from comoe_opt.residency.assign import assign_replicas
from comoe_opt.residency.fill import fill_spare
from comoe_opt.residency.heuristics import HEURISTICS
from comoe_opt.residency.models import (
    build_full_model,
    build_replica_model,
    full_model_placement,
    replica_counts,
    set_full_start,
    set_replica_counts,
)
from comoe_opt.residency.objective import check_feasible, score
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.problem import ResidencyProblem
from comoe_opt.residency.refine import refine
from comoe_opt.results import SolveResult, Status, relative_gap

RESIDENCY_METHODS = ("milp", "full", "lp", *HEURISTICS)


def solve(
    problem: ResidencyProblem,
    method: str = "milp",
    *,
    time_limit_s: float = 10.0,
    mip_gap: float = 1e-3,
) -> SolveResult[Placement]:
    if method in HEURISTICS:
        return solve_heuristic(problem, method)
    if method == "milp":
        return solve_milp(problem, time_limit_s=time_limit_s, mip_gap=mip_gap)
    if method == "full":
        return solve_full(problem, time_limit_s=time_limit_s, mip_gap=mip_gap)
    if method == "lp":
        return solve_lp(problem)
    raise ValueError(f"unknown method {method!r} (known: {', '.join(RESIDENCY_METHODS)})")


def solve_heuristic(problem: ResidencyProblem, name: str) -> SolveResult[Placement]:
    start = time.perf_counter()
    placement = HEURISTICS[name](problem)
    runtime = time.perf_counter() - start  # the heuristic itself; scoring is not its cost
    terms = score(problem, placement)
    return SolveResult(name, Status.FEASIBLE, terms.total, float("-inf"), runtime, placement, terms.to_dict())


def solve_milp(problem: ResidencyProblem, *, time_limit_s: float, mip_gap: float) -> SolveResult[Placement]:
    start = time.perf_counter()
    warm = min(_feasible_heuristics(problem), key=lambda r: r.objective)
    build_start = time.perf_counter()
    model = build_replica_model(problem)
    jmax = model.jmax
    set_replica_counts(model, problem, np.minimum(warm.solution.replicas(), jmax))
    build_s = time.perf_counter() - build_start
    remaining = time_limit_s - (time.perf_counter() - start)
    outcome = solve_with_highs(model, time_limit_s=remaining, mip_gap=mip_gap / 2, warm_start=True)
    best, source = warm.solution, f"warm start ({warm.method})"
    objective = warm.objective
    terms = warm.report
    if outcome.status.has_solution:
        placement = assign_replicas(problem, replica_counts(model, problem))
        candidate = score(problem, placement)
        if candidate.total < objective:
            best, source, objective, terms = (
                placement,
                "replica-count MILP",
                candidate.total,
                candidate.to_dict(),
            )
    bound = outcome.bound  # a valid lower bound of the full model (formulations/residency.md)
    remaining = time_limit_s - (time.perf_counter() - start)
    polish = None
    # the full model scores balance on the mean load: its bound does not hold for scenarios
    can_polish = _small(problem) and not problem.scenarios
    if relative_gap(objective, bound) > mip_gap and can_polish and remaining > 0:
        polish = _polish_with_full_model(problem, best, remaining, mip_gap)
        bound = max(bound, polish.bound)
        if polish.status.has_solution and polish.objective < objective:
            best, source, objective, terms = polish.solution, "full MILP", polish.objective, polish.report
        outcome_status = polish.status
    else:
        outcome_status = outcome.status
    best, objective, terms = _fill_ties(problem, best, objective, terms)
    if problem.scenarios and problem.search_moves:
        best, source, objective, terms = _search(problem, best, source, objective, terms)
    bound = _tidy_bound(bound, objective)
    status = _status(outcome_status, objective, bound, mip_gap)
    report = {
        **terms,
        "placement_from": source,
        "warm_start": warm.method,
        "warm_start_objective": warm.objective,
        "replica_model_objective": outcome.objective,
        "replica_model_status": outcome.solver_status,
        "build_s": build_s,
        "solver_s": outcome.runtime_s,
        "full_model_bound": None if polish is None else polish.bound,
    }
    return SolveResult("milp", status, objective, bound, time.perf_counter() - start, best, report)


FULL_MODEL_BINARIES = 4096  # up to this many x[l,e,c], the exact model can tighten the bound


def _small(problem: ResidencyProblem) -> bool:
    return problem.layers * problem.experts * problem.chiplets <= FULL_MODEL_BINARIES


def _polish_with_full_model(
    problem: ResidencyProblem, start: Placement, time_limit_s: float, mip_gap: float
) -> SolveResult[Placement]:
    """The exact x[l,e,c] model, warm-started from `start`: a tighter bound on small instances."""
    t0 = time.perf_counter()
    model = build_full_model(problem)
    set_full_start(model, problem, start.resident)
    outcome = solve_with_highs(model, time_limit_s=time_limit_s, mip_gap=mip_gap / 2, warm_start=True)
    if not outcome.status.has_solution:
        return SolveResult("full", outcome.status, float("inf"), outcome.bound, time.perf_counter() - t0)
    placement = Placement(full_model_placement(model, problem))
    terms = score(problem, placement)
    return SolveResult(
        "full",
        outcome.status,
        terms.total,
        outcome.bound,
        time.perf_counter() - t0,
        placement,
        terms.to_dict(),
    )


def _feasible_heuristics(problem: ResidencyProblem) -> list[SolveResult[Placement]]:
    """Every heuristic whose placement satisfies the problem (EPLB ignores leases)."""
    out = []
    for name in HEURISTICS:
        if name == "eplb" and problem.leased is not None and problem.leased.any():
            continue
        out.append(solve_heuristic(problem, name))
    return out


def _fill_ties(
    problem: ResidencyProblem, best: Placement, objective: float, terms: dict
) -> tuple[Placement, float, dict]:
    """Spare pages take flexible replicas when the objective stays the same (fill.py)."""
    filled = fill_spare(problem, best)
    if filled is best:
        return best, objective, terms
    scored = score(problem, filled)
    if scored.total <= objective + 1e-9 * max(1.0, abs(objective)):
        return filled, scored.total, {**scored.to_dict(), "spare_replicas": filled.pages - best.pages}
    return best, objective, terms


def _search(
    problem: ResidencyProblem, best: Placement, source: str, objective: float, terms: dict
) -> tuple[Placement, str, float, dict]:
    """Local search on the scenarios from the best placement so far, or the previous one if better."""
    start, start_objective = best, objective
    previous = problem.previous
    if previous is not None and not check_feasible(problem, previous):
        kept = score(problem, previous).total
        if kept < start_objective:
            start, start_objective = previous, kept
    found = refine(problem, start)
    scored = score(problem, found)
    if scored.total < objective:
        return found, f"{source} + scenario search", scored.total, scored.to_dict()
    return best, source, objective, terms


def _tidy_bound(bound: float, objective: float) -> float:
    """A dual bound above the objective by solver round-off only is the objective itself;
    a larger excess is left visible (it would mean a wrong bound)."""
    if objective < bound <= objective + 1e-7 * max(1.0, abs(objective)):
        return objective
    return bound


def _status(solver: Status, objective: float, bound: float, mip_gap: float) -> Status:
    if solver in (Status.INFEASIBLE, Status.UNBOUNDED, Status.ERROR):
        return solver
    if relative_gap(objective, bound) <= mip_gap + 1e-12:
        return Status.OPTIMAL
    return Status.TIME_LIMIT if solver == Status.TIME_LIMIT else Status.FEASIBLE


def solve_full(problem: ResidencyProblem, *, time_limit_s: float, mip_gap: float) -> SolveResult[Placement]:
    start = time.perf_counter()
    model = build_full_model(problem)
    outcome = solve_with_highs(model, time_limit_s=time_limit_s, mip_gap=mip_gap)
    if not outcome.status.has_solution:
        return SolveResult("full", outcome.status, float("inf"), outcome.bound, time.perf_counter() - start)
    placement = Placement(full_model_placement(model, problem))
    terms = score(problem, placement)
    # the exact share LP can only improve on the MILP's shares
    objective = min(terms.total, outcome.objective)
    report = {
        **terms.to_dict(),
        "solver_objective": outcome.objective,
        "solver_status": outcome.solver_status,
    }
    return SolveResult(
        "full",
        outcome.status,
        objective,
        _tidy_bound(outcome.bound, objective),
        time.perf_counter() - start,
        placement,
        report,
    )


def solve_lp(problem: ResidencyProblem) -> SolveResult[Placement]:
    start = time.perf_counter()
    model = build_replica_model(problem)
    pyo.TransformationFactory("core.relax_integer_vars").apply_to(model)
    outcome = solve_with_highs(model)
    return SolveResult(
        "lp",
        outcome.status,
        outcome.objective,
        outcome.objective,
        time.perf_counter() - start,
        None,
        {"relaxation": "LP of the replica-count model", "solver_status": outcome.solver_status},
    )
