"""Solve a slow-loop window with any method; every method returns a `SolveResult`.

* heuristics (`static`, `hot`, `eplb`, `greedy`): a placement, scored by the
  exact objective; no bound (`no_solution` when it breaks a constraint).

Gaps are signed and measured on the part of the objective a placement
changes (`problem.constant_ms`, every token's least NoP, is left out).
* `milp`: the replica-count MILP (HiGHS via Pyomo), warm-started from the best
  heuristic, gives a proven lower bound and replica counts; the counts are
  placed on chiplets and scored exactly. The result is the better of that
  placement and the warm start, so it is never worse than any heuristic.
  With balance scenarios, a local search (refine.py) then improves the
  placement — or the previous window's, when that is better — on them.
  A warm start that breaks a constraint is skipped, never fatal.
* `exact`: `milp`, then, with balance scenarios on related chiplets, the
  exact scenario model over x[l,e,c] by row generation (cuts.py) until the
  gap or the time limit: a proven gap on the scenario objective.
* `full`: the plain residency MILP over x[l,e,c], balance scenarios included
  (exact, for small instances).
* `lp`: the LP relaxation bound of the replica-count model (no placement).
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
import pyomo.environ as pyo

from comoe_opt.highs import solve_with_highs
from comoe_opt.residency.assign import assign_replicas
from comoe_opt.residency.cuts import cut_model_applies, solve_with_cuts
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
from comoe_opt.results import BOUND_TOLERANCE, SolveResult, Status, relative_gap

RESIDENCY_METHODS = ("milp", "exact", "full", "lp", *HEURISTICS)


def solve(
    problem: ResidencyProblem,
    method: str = "milp",
    *,
    time_limit_s: float = 10.0,
    mip_gap: float = 1e-3,
) -> SolveResult[Placement]:
    if method in HEURISTICS:
        return solve_heuristic(problem, method)
    if method in ("milp", "exact"):
        return solve_milp(problem, time_limit_s=time_limit_s, mip_gap=mip_gap, exact=method == "exact")
    if method == "full":
        return solve_full(problem, time_limit_s=time_limit_s, mip_gap=mip_gap)
    if method == "lp":
        return solve_lp(problem)
    raise ValueError(f"unknown method {method!r} (known: {', '.join(RESIDENCY_METHODS)})")


def solve_heuristic(problem: ResidencyProblem, name: str) -> SolveResult[Placement]:
    """A heuristic's placement, scored exactly; `no_solution` when it breaks a constraint."""
    start = time.perf_counter()
    placement = HEURISTICS[name](problem)
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


def solve_milp(
    problem: ResidencyProblem, *, time_limit_s: float, mip_gap: float, exact: bool = False
) -> SolveResult[Placement]:
    """The replica-count MILP from the best heuristic, placed and refined; with `exact` and balance
    scenarios, then the exact scenario model (cuts.py) to the gap or the time limit."""
    start = time.perf_counter()
    heuristics = _feasible_heuristics(problem)
    warm = min(heuristics, key=lambda r: r.objective) if heuristics else None
    build_start = time.perf_counter()
    model = build_replica_model(problem)
    if warm is not None:
        set_replica_counts(model, problem, np.minimum(warm.solution.replicas(), model.jmax))
    build_s = time.perf_counter() - build_start
    remaining = time_limit_s - (time.perf_counter() - start)
    # the constant part is not in the model: HiGHS's gap is on what a placement changes
    outcome = solve_with_highs(
        model, time_limit_s=remaining, mip_gap=mip_gap / 2, warm_start=warm is not None
    )
    best = _Incumbent.of(warm)
    if outcome.status.has_solution and math.isfinite(outcome.objective):
        best.offer(problem, assign_replicas(problem, replica_counts(model, problem)), "replica-count MILP")
    bound = outcome.bound + problem.constant_ms  # a lower bound of the full model (formulations/residency.md)
    bound_source = "replica-count MILP"
    if not math.isfinite(bound):
        # stopped before its root bound: the LP relaxation's is still a promise, and takes little time
        relaxed = solve_lp(problem, time_limit_s=LP_BOUND_TIME_S)
        if relaxed.status is Status.OPTIMAL:
            bound, bound_source = relaxed.bound, "LP relaxation (the MILP stopped before its root bound)"
        else:
            bound_source = f"none: the LP relaxation ended {relaxed.status.value} too"
    remaining = time_limit_s - (time.perf_counter() - start)
    polish = None
    cuts = None
    if exact and cut_model_applies(problem):
        if best.placement is not None:
            best.fill_ties(problem)
            if problem.search_moves:
                best.search(problem)
        remaining = time_limit_s - (time.perf_counter() - start)
        if _gap(problem, best.objective, bound) > mip_gap and remaining > 0 and _cut_model_fits(problem):
            # half the time proves (the bound settles in the first rounds), the rest searches
            cuts = solve_with_cuts(
                problem,
                best.placement,
                time_limit_s=remaining * EXACT_PROOF_SHARE,
                mip_gap=mip_gap,
                improve=_improver(problem),
            )
            bound = max(bound, cuts.bound)
            if cuts.placement is not None:
                best.offer(problem, cuts.placement, "scenario cut model")
        seed = 1
        while (
            best.placement is not None
            and problem.search_moves
            and _gap(problem, best.objective, bound) > mip_gap
        ):
            if time.perf_counter() - start >= time_limit_s:
                break
            best.search_longer(problem, seed, deadline=start + time_limit_s)
            seed += 1
        outcome_status = outcome.status if cuts is None else cuts.status
        if cuts is not None and _gap(problem, best.objective, bound) > mip_gap:
            outcome_status = Status.TIME_LIMIT
    elif _gap(problem, best.objective, bound) > mip_gap and _small(problem) and remaining > 0:
        polish = _polish_with_full_model(problem, best.placement, remaining, mip_gap)
        bound = max(bound, polish.bound)
        if polish.status.has_solution:
            best.offer(problem, polish.solution, "full MILP")
        # a polish without a solution ran out of time
        outcome_status = polish.status if polish.status.has_solution else Status.TIME_LIMIT
    else:
        outcome_status = outcome.status
    if best.placement is not None and cuts is None:
        best.fill_ties(problem)
        if problem.scenarios and problem.search_moves:
            best.search(problem)
    bound = _tidy_bound(bound, best.objective)
    status = _status(outcome_status, best.objective, bound, mip_gap, problem.constant_ms)
    if best.placement is None:
        status = Status.NO_SOLUTION if status.has_solution else status
    report = {
        **best.terms,
        "placement_from": best.source,
        "warm_start": None if warm is None else warm.method,
        "warm_start_objective": None if warm is None else warm.objective,
        "replica_model_objective": outcome.objective + problem.constant_ms,
        "replica_model_status": outcome.solver_status,
        "replica_model_bound_from": bound_source,
        "build_s": build_s,
        "solver_s": outcome.runtime_s,
        "full_model_bound": None if polish is None else polish.bound,
        "cut_rounds": None if cuts is None else cuts.rounds.rounds,
        "cuts": None if cuts is None else cuts.rounds.cuts,
        "cut_model_bound": None if cuts is None else cuts.bound,
        "cut_model": _cut_model_note(problem, exact),
    }
    runtime = time.perf_counter() - start
    method = "exact" if exact else "milp"
    return SolveResult(
        method, status, best.objective, bound, runtime, best.placement, report, problem.constant_ms
    )


class _Incumbent:
    """The best placement found so far, with where it came from and its objective terms."""

    def __init__(self, placement: Placement | None, objective: float, source: str, terms: dict):
        self.placement, self.objective, self.source, self.terms = placement, objective, source, terms

    @classmethod
    def of(cls, result: SolveResult[Placement] | None) -> _Incumbent:
        if result is None:
            return cls(None, math.inf, "none", {})
        return cls(result.solution, result.objective, f"warm start ({result.method})", result.report)

    def offer(self, problem: ResidencyProblem, placement: Placement, source: str) -> None:
        """Keep `placement` if it is feasible and better."""
        if check_feasible(problem, placement):
            return
        scored = score(problem, placement)
        if scored.total < self.objective:
            self.placement, self.objective, self.source, self.terms = (
                placement,
                scored.total,
                source,
                scored.to_dict(),
            )

    def fill_ties(self, problem: ResidencyProblem) -> None:
        """Spare pages take flexible replicas when the objective stays the same (fill.py)."""
        filled = fill_spare(problem, self.placement)
        if filled is self.placement:
            return
        scored = score(problem, filled)
        if scored.total <= self.objective + 1e-9 * max(1.0, abs(self.objective)):
            spare = filled.pages - self.placement.pages
            self.placement, self.objective = filled, scored.total
            self.terms = {**scored.to_dict(), "spare_replicas": spare}

    def search(self, problem: ResidencyProblem) -> None:
        """Local search on the scenarios from the best placement so far, or the previous one if better."""
        start, start_objective = self.placement, self.objective
        previous = problem.previous
        if previous is not None and not check_feasible(problem, previous):
            kept = score(problem, previous).total
            if kept < start_objective:
                start = previous
        found = refine(problem, start)
        before = self.source
        self.offer(problem, found, f"{before} + scenario search")

    def search_longer(self, problem: ResidencyProblem, seed: int, deadline: float) -> None:
        """One more search of `EXACT_SEARCH_FACTOR` times the moves from the best so far, with its
        own seed (`exact` spends what time the proof leaves on the incumbent)."""
        longer = dataclasses.replace(problem, search_moves=problem.search_moves * EXACT_SEARCH_FACTOR)
        found = refine(longer, self.placement, seed=seed, deadline=deadline)
        if self.source.endswith("+ longer search"):
            self.offer(problem, found, self.source)
        else:
            self.offer(problem, found, f"{self.source} + longer search")


EXACT_PROOF_SHARE = 0.5  # `exact`: share of the remaining time for the cut model's rounds
EXACT_SEARCH_FACTOR = (
    10  # ... then longer searches of this many times policy.search_moves, while time is left
)
LP_BOUND_TIME_S = 10.0  # the LP relaxation behind a MILP stopped before its root bound (ms usually)
FULL_MODEL_BINARIES = 4096  # up to this many x[l,e,c], the exact model can tighten the bound
FULL_MODEL_SHARES = 65536  # ... and up to this many scenario shares t[l,s,e,c]
POLISH_NODES = 100  # branch-and-bound nodes of that polish with scenarios


CUT_MODEL_BINARIES = 131072  # above this many x[l,e,c], `exact` searches instead of building the cut model
# (deepseek-v3-ep32, 475,136 binaries: no cut round finished in 60 s; formulations/residency.md)


def _cut_model_fits(problem: ResidencyProblem) -> bool:
    return problem.layers * problem.experts * problem.chiplets <= CUT_MODEL_BINARIES


def _cut_model_note(problem: ResidencyProblem, exact: bool) -> str | None:
    if not exact:
        return None
    if not cut_model_applies(problem):
        return "not exact here (no balance scenarios, or chiplets not related by one speed factor)"
    if not _cut_model_fits(problem):
        return f"not built: more than {CUT_MODEL_BINARIES} binaries x[l,e,c]; the time went to the search"
    return "built"


def _small(problem: ResidencyProblem) -> bool:
    binaries = problem.layers * problem.experts * problem.chiplets
    return binaries <= FULL_MODEL_BINARIES and binaries * problem.scenarios <= FULL_MODEL_SHARES


def _polish_with_full_model(
    problem: ResidencyProblem, start: Placement | None, time_limit_s: float, mip_gap: float
) -> SolveResult[Placement]:
    """The exact x[l,e,c] model, warm-started from `start`: a tighter bound on small instances."""
    # with scenarios the full model rarely closes (its LP bound is the mean load's); a node limit,
    # not the clock, ends it, so that `milp` gives the same placement on any machine
    nodes = {"mip_max_nodes": POLISH_NODES} if problem.scenarios else None
    return _solve_full_model(problem, start, time_limit_s=time_limit_s, mip_gap=mip_gap / 2, options=nodes)


def _solve_full_model(
    problem: ResidencyProblem,
    start: Placement | None,
    *,
    time_limit_s: float | None,
    mip_gap: float,
    options: dict | None = None,
) -> SolveResult[Placement]:
    """Solve `build_full_model` (exact, scenarios included); objective and bound with the constant."""
    t0 = time.perf_counter()
    model = build_full_model(problem)
    if start is not None:
        set_full_start(model, problem, start.resident)
    outcome = solve_with_highs(
        model, time_limit_s=time_limit_s, mip_gap=mip_gap, warm_start=start is not None, options=options
    )
    constant = problem.constant_ms
    bound = outcome.bound + constant
    report = {"solver_objective": outcome.objective + constant, "solver_status": outcome.solver_status}
    placement = Placement(full_model_placement(model, problem)) if outcome.status.has_solution else None
    if placement is None or check_feasible(problem, placement):
        status = Status.NO_SOLUTION if outcome.status.has_solution else outcome.status
        return SolveResult("full", status, math.inf, bound, time.perf_counter() - t0, None, report, constant)
    terms = score(problem, placement)
    bound = _tidy_bound(bound, terms.total)
    status = _status(outcome.status, terms.total, bound, mip_gap, constant)
    return SolveResult(
        "full",
        status,
        terms.total,
        bound,
        time.perf_counter() - t0,
        placement,
        {**terms.to_dict(), **report},
        constant,
    )


def _improver(problem: ResidencyProblem):
    """The local search on the scenarios, as the cut model's per-round improvement (or None)."""
    if not problem.search_moves:
        return None
    return lambda placement: refine(problem, placement)


def _feasible_heuristics(problem: ResidencyProblem) -> list[SolveResult[Placement]]:
    """Every heuristic whose placement satisfies the problem: a warm start that fails is skipped."""
    results = (solve_heuristic(problem, name) for name in HEURISTICS)
    return [r for r in results if r.status.has_solution]


def _gap(problem: ResidencyProblem, objective: float, bound: float) -> float:
    return relative_gap(objective, bound, problem.constant_ms)


def _tidy_bound(bound: float, objective: float) -> float:
    """A dual bound above the objective by solver round-off only is the objective itself;
    a larger excess is left visible (it would mean a wrong bound)."""
    if objective < bound <= objective + 1e-7 * max(1.0, abs(objective)):
        return objective
    return bound


def _status(solver: Status, objective: float, bound: float, mip_gap: float, constant: float) -> Status:
    if solver in (Status.INFEASIBLE, Status.UNBOUNDED, Status.ERROR):
        return solver
    if relative_gap(objective, bound, constant) <= mip_gap + BOUND_TOLERANCE:  # solver round-off
        return Status.OPTIMAL
    return Status.TIME_LIMIT if solver == Status.TIME_LIMIT else Status.FEASIBLE


def solve_full(problem: ResidencyProblem, *, time_limit_s: float, mip_gap: float) -> SolveResult[Placement]:
    """The plain x[l,e,c] model (exact, balance scenarios included); for small instances."""
    return _solve_full_model(problem, None, time_limit_s=time_limit_s, mip_gap=mip_gap)


def solve_lp(problem: ResidencyProblem, time_limit_s: float | None = None) -> SolveResult[Placement]:
    start = time.perf_counter()
    model = build_replica_model(problem)
    pyo.TransformationFactory("core.relax_integer_vars").apply_to(model)
    outcome = solve_with_highs(model, time_limit_s=time_limit_s)
    value = outcome.objective + problem.constant_ms
    return SolveResult(
        "lp",
        outcome.status,
        value,
        value,
        time.perf_counter() - start,
        None,
        {"relaxation": "LP of the replica-count model", "solver_status": outcome.solver_status},
        problem.constant_ms,
    )
