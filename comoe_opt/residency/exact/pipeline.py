"""The slow loop's models: `milp`, `exact`, `full` and `lp` (formulations/residency.md).

* `milp`: the replica-count MILP (HiGHS via Pyomo), warm-started from the best
  heuristic, gives a proven lower bound and replica counts; the counts are
  placed on chiplets and scored exactly. The result is the better of that
  placement and the warm start, so it is never worse than any warm-start heuristic.
  With balance scenarios, a local search (refine.py) then improves the
  placement — or the previous window's, when that is better — on them.
  A warm start that breaks a constraint is skipped, never fatal.
* `exact`: `milp`, then, with balance scenarios on related chiplets, the
  exact scenario model over x[l,e,c] by row generation (residency/models/cut_model.py) until the
  gap or the time limit: a proven gap on the scenario objective.
* `full`: the plain residency MILP over x[l,e,c], balance scenarios included
  (exact, for small instances).
* `lp`: the LP relaxation bound of the replica-count model (no placement).

Reached through `residency.solve.solve`, which imports this module only for these methods.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import pyomo.environ as pyo

from comoe_opt.best_split.cut_condition import enumerable
from comoe_opt.deadline import Deadline
from comoe_opt.errors import ComoeError
from comoe_opt.highs import NOT_STARTED, HighsOutcome, lp_work, mip_work, nodes_within, solve_with_highs
from comoe_opt.residency.bounds.check_bound import BoundCertificate
from comoe_opt.residency.bounds.nop_floor import nop_excess_bound
from comoe_opt.residency.heuristics import warm_starts
from comoe_opt.residency.heuristics.assign import assign_replicas
from comoe_opt.residency.heuristics.fill import fill_spare
from comoe_opt.residency.heuristics.solve import heuristic_result as _heuristic
from comoe_opt.residency.models.cut_model import ExactOutcome, cut_model_applies, solve_with_cuts
from comoe_opt.residency.models.milp import (
    build_full_model,
    build_replica_model,
    full_model_placement,
    replica_counts,
    set_full_start,
    set_replica_counts,
)
from comoe_opt.residency.objective import ObjectiveTerms, check_feasible, score
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.problem import ResidencyProblem
from comoe_opt.residency.report import FullModelReport, LPReport, ModelReport, ResidencyResult
from comoe_opt.residency.schedule import (
    ANNEAL_PROPOSALS,
    FULL_NODE_ROWS,
    FULL_NODES,
    POLISH_NODES,
    WorkLimits,
    share,
    work_limited,
)
from comoe_opt.residency.search.anneal import anneal
from comoe_opt.residency.search.refine import refine
from comoe_opt.results import SolveResult, Status, relative_gap, status_from_gap

if TYPE_CHECKING:  # imported where used: only with balance scenarios
    from comoe_opt.residency.bounds.decompose import LagrangianValue
    from comoe_opt.residency.bounds.group_bound import GroupBound


def solve_milp(
    problem: ResidencyProblem,
    *,
    deadline: Deadline,
    mip_gap: float,
    exact: bool = False,
    work: WorkLimits | None = None,
) -> ResidencyResult:
    """The replica-count MILP from the best heuristic, placed and refined; with `exact` and balance
    scenarios, then the exact scenario model (residency/models/cut_model.py) to the gap or the deadline.

    After the replica model, the steps of `STEPS` run in turn (`exact` adds `EXACT_STEPS`); with a
    time limit each open-ended one gets its share of the time left (schedule.py), without one each
    ends on a work limit (`work`, or the problem's own: `WorkLimits.of`). A step that finds the
    deadline passed is skipped and the report says so (formulations/residency.md, "Time limit");
    the report gives each step's gain.
    """
    run = _Run(problem, deadline, mip_gap, exact, work)
    with deadline.phase("warm_start"):
        heuristics = _feasible_heuristics(problem, deadline)
    warm = min(heuristics, key=lambda r: r.objective) if heuristics else None
    run.best = _Incumbent.of(warm)
    replica = _solve_replica_model(problem, warm, deadline, mip_gap, run.work)
    outcome = replica.outcome
    run.status = outcome.status
    run.seconds_per_row = replica.seconds_per_row
    if replica.counts is not None:
        with deadline.phase("place"):  # runs even past the deadline: it is the MILP's answer
            run.best.offer(problem, assign_replicas(problem, replica.counts), "replica-count MILP")
    # the constant part is not in the model: HiGHS's gap is on what a placement changes
    run.bound, bound_source = _replica_bound(problem, outcome, deadline)
    # `milp`'s steps, which `exact` runs first too: `exact` is never worse than `milp`
    for name, step in STEPS + (EXACT_STEPS if exact else ()):
        run.step(name, step)
    best = run.best
    bound = tidy_bound(run.bound, best.objective)
    status = status_from_gap(run.status, best.objective, bound, mip_gap, problem.constant_ms)
    if status is Status.FEASIBLE and deadline.touched:
        status = Status.TIME_LIMIT  # the deadline skipped or cut short a phase
    if best.placement is None:
        status = Status.NO_SOLUTION if status.has_solution else status
    polish, cuts, certificate = run.polish, run.cuts, run.certificate
    report = ModelReport(
        terms=best.terms,
        spare_replicas=best.spare_replicas,
        placement_from=best.source,
        warm_start=None if warm is None else warm.method,
        warm_start_objective=None if warm is None else warm.objective,
        replica_model_objective=outcome.objective + problem.constant_ms,
        replica_model_status=outcome.solver_status,
        replica_model_bound_from=bound_source,
        build_s=replica.build_s,
        solver_s=outcome.runtime_s,
        full_model_bound=None if polish is None else polish.bound,
        cut_rounds=None if cuts is None else cuts.rounds.rounds,
        cuts=None if cuts is None else cuts.rounds.cuts,
        cut_model_bound=None if cuts is None else cuts.bound,
        cut_model=_cut_model_note(problem, exact),
        class_bound=None if certificate is None else certificate.bound,
        # the class bound's dual certificate; check_bound.check_certificate recomputes it
        certificate=certificate,
        lagrangian_bound=run.lagrangian,
        group_bound=None if run.groups is None else run.groups.bound,
        group_certificate=None if run.groups is None else run.groups.certificate(problem),
        gains=run.gains,
        budget="time limit" if run.work is None else "work limits (no time limit)",
        timing=deadline.timing(),
    )
    method = "exact" if exact else "milp"
    return SolveResult(
        method,
        status,
        best.objective,
        bound,
        report.timing.total_s,
        best.placement,
        problem.constant_ms,
        report=report,
    )


class _Run:
    """One solve's state as its steps pass it on: the incumbent, the bound, what each step left
    for the report, and the budget (`work`: the work limits when there is no time limit)."""

    def __init__(
        self,
        problem: ResidencyProblem,
        deadline: Deadline,
        mip_gap: float,
        exact: bool,
        work: WorkLimits | None = None,
    ):
        self.problem, self.deadline, self.mip_gap, self.exact = problem, deadline, mip_gap, exact
        self.work = (work or WorkLimits.of(problem)) if work_limited(deadline) else None
        self.best = _Incumbent.of(None)
        self.bound = -math.inf
        self.status = Status.FEASIBLE  # the solver status the result's status starts from
        self.seconds_per_row = math.inf
        self.certificate: BoundCertificate | None = None
        self.polish: ResidencyResult | None = None
        self.lagrangian: float | None = None
        self.lagrangian_value: LagrangianValue | None = None  # ... with its prices and layer values
        self.groups: GroupBound | None = None
        self.cuts: ExactOutcome | None = None
        self.gains: dict[str, dict[str, float]] = {}

    def gap(self) -> float:
        return _gap(self.problem, self.best.objective, self.bound)

    def open(self) -> bool:
        """Whether the gap is still above the target."""
        return self.gap() > self.mip_gap

    def raise_bound(self, bound: float | None) -> None:
        if bound is not None:
            self.bound = max(self.bound, bound)

    def share(self, name: str) -> Deadline:
        """The deadline for step `name`: its share of the time left (all of it without a limit)."""
        return self.deadline.share(share(name, self.exact))

    def step(self, name: str, step: Callable[[_Run], None]) -> None:
        """Run `step` and record what it gave: objective lowered, bound raised (ms)."""
        objective, bound = self.best.objective, self.bound
        step(self)
        lowered = objective - self.best.objective if math.isfinite(objective) else 0.0
        raised = self.bound - bound if math.isfinite(bound) else 0.0
        self.gains[name] = {"objective_lowered_ms": lowered, "bound_raised_ms": raised}


@dataclasses.dataclass(frozen=True)
class _ReplicaSolve:
    """The replica-count MILP's outcome, its replica counts (None without a solution), its
    build time, and what building and handing over one row took (to foresee the full model's)."""

    outcome: HighsOutcome
    counts: np.ndarray | None
    build_s: float
    seconds_per_row: float


def _solve_replica_model(
    problem: ResidencyProblem,
    warm: ResidencyResult | None,
    deadline: Deadline,
    mip_gap: float,
    work: WorkLimits | None,
) -> _ReplicaSolve:
    if deadline.expired():
        deadline.skip("model_build and milp")
        return _ReplicaSolve(_SKIPPED, None, 0.0, math.inf)
    began = deadline.clock()
    with deadline.phase("model_build"):
        model = build_replica_model(problem)
        if warm is not None and warm.solution is not None:
            set_replica_counts(model, problem, np.minimum(warm.solution.replicas(), model.jmax))
    build_s = deadline.clock() - began
    nodes = None if work is None else mip_work(work.replica_nodes)
    with deadline.phase("milp"):
        outcome = solve_with_highs(
            model, mip_gap=mip_gap / 2, warm_start=warm is not None, deadline=deadline, options=nodes
        )
        solved = outcome.status.has_solution and math.isfinite(outcome.objective)
        counts = replica_counts(model, problem) if solved else None
    _note_highs("milp", outcome, deadline)
    per_row = (build_s + outcome.handover_s) / max(model.nconstraints(), 1)
    return _ReplicaSolve(outcome, counts, build_s, per_row)


def _note_highs(phase: str, outcome: HighsOutcome, deadline: Deadline) -> None:
    """Say when HiGHS did not start, or stopped, on the deadline."""
    if outcome.solver_status == NOT_STARTED:
        deadline.note(f"{phase}: {NOT_STARTED}")
    elif outcome.status is Status.TIME_LIMIT:
        deadline.note(f"{phase}: HiGHS stopped at the time limit")


_SKIPPED = HighsOutcome(Status.TIME_LIMIT, math.inf, -math.inf, 0.0, "not started: the time limit had passed")


def _replica_bound(problem: ResidencyProblem, outcome: HighsOutcome, deadline: Deadline) -> tuple[float, str]:
    """The replica model's bound (a lower bound of the full model, formulations/residency.md), or
    its LP relaxation's when it stopped before its root bound and time is left; either prices NoP
    at its floor, so the least NoP any placement has above it (bounds/nop_floor.py) adds on."""
    floor = problem.constant_ms + nop_excess_bound(problem)
    bound = outcome.bound + floor
    if math.isfinite(bound):
        return bound, "replica-count MILP"
    if deadline.expired():
        deadline.skip("lp_bound")
        return bound, "none: the time limit passed before any bound was proven"
    with deadline.phase("lp_bound"):
        relaxed = _lp_relaxation(problem, deadline)
    if relaxed.status is Status.OPTIMAL:
        bound = relaxed.objective + floor
        return bound, "LP relaxation (the MILP stopped before its root bound)"
    return -math.inf, f"none: the LP relaxation ended {relaxed.status.value} too"


# ------------------------------------------------------------------ the steps, in order


def _fill_and_search(run: _Run) -> None:
    """Ties toward flexibility (fill.py), then the scenario search (refine.py), while time is left."""
    best, problem, deadline = run.best, run.problem, run.deadline
    if best.placement is None:
        return
    steps: list[tuple[str, Callable[[ResidencyProblem], None]]] = [("fill", best.fill_ties)]
    if problem.scenarios and problem.search_moves:
        steps.append(("search", lambda p: best.search(p, deadline)))
    for name, step in steps:
        if deadline.expired():
            deadline.skip(name)
            continue
        with deadline.phase(name):
            step(problem)


def _class_bound(run: _Run) -> None:
    """The hop-class model's LP bound (decompose.py, "Layer decomposition bound") with its
    certificate (check_bound.py), while the gap is open, where the cut model applies and fits.
    On GPT-OSS windows it is what the cut model's rounds reach, in about half a second."""
    problem, deadline = run.problem, run.deadline
    if not (cut_model_applies(problem) and _cut_model_fits(problem)) or not run.open():
        return
    if deadline.expired():
        deadline.skip("class_bound")
        return
    from comoe_opt.residency.bounds.decompose import class_lp_certificate  # only with balance scenarios

    with deadline.phase("class_bound"):
        run.certificate = class_lp_certificate(problem, time_limit_s=deadline.remaining())
    if run.certificate is not None:
        run.raise_bound(run.certificate.bound)


def _anneal(run: _Run) -> None:
    """`problem.anneal_proposals` annealing proposals per layer from the best placement, while the
    gap is open: a fixed count, so the placement does not depend on the machine's speed. It runs
    before the polish: on every shape measured it gave more per second (schedule.py)."""
    problem, best, deadline = run.problem, run.best, run.deadline
    if best.placement is None or not problem.anneal_proposals or not run.open():
        return
    if problem.scenario_work_ms is None:
        return
    if deadline.expired():
        deadline.skip("anneal")
        return
    with deadline.phase("anneal"):
        best.anneal(problem, 0, deadline, problem.anneal_proposals)


def _polish(run: _Run) -> None:
    """The full model's polish on small instances, on its share of the time left (all of it when
    no later step can use the rest), to
    `POLISH_NODES` nodes, when the full model with scenarios has at most the work limits'
    `polish_rows` (`POLISH_ROWS`, split over the layers when they are solved one at a time; above,
    its root LP alone outlasts the budget) and its build and hand-over, foreseen at the replica
    model's pace per row, take at most `POLISH_BUILD_SHARE` of its time."""
    problem, deadline = run.problem, run.deadline
    if not run.open() or not _small(problem):
        return
    rows = _full_model_rows(problem)
    limits = run.work or WorkLimits.of(problem)  # the polish's size limits hold with a time limit too
    if problem.scenarios and rows > limits.polish_rows:  # a rule on size, not time: not a deadline note
        return
    if deadline.expired():
        deadline.skip("polish")
        return
    # its share when a later step can use the rest (the Lagrangian, `exact`'s rounds and searches)
    later = run.certificate is not None or (run.exact and cut_model_applies(problem))
    budget = run.share("polish") if later else deadline.share(1.0)
    foreseen = rows * run.seconds_per_row
    if foreseen > POLISH_BUILD_SHARE * budget.remaining():
        deadline.note(
            f"polish: skipped, building the full model takes about {foreseen:.2g} s of the"
            f" {budget.remaining():.2g} s it would get"
        )
        return
    with deadline.phase("polish"):
        polish = _polish_with_full_model(
            problem, run.best.placement, budget, run.mip_gap, rows, limits.polish_node_rows
        )
    run.polish = polish
    run.raise_bound(polish.bound)
    if polish.solution is not None and run.best.offer(problem, polish.solution, "full MILP"):
        _fill_and_search(run)
    # a polish without a solution ran out of time
    run.status = polish.status if polish.status.has_solution else Status.TIME_LIMIT


def _lagrangian(run: _Run) -> None:
    """Every layer's class model solved as a MILP at the class LP's prices of the pages, budget
    and quotas that couple layers (the Lagrangian over layers, decompose.py), on its share of the
    time left, or to `work.lagrangian_nodes` nodes per layer; a layer stopped short gives its dual
    bound. It is a bound for any prices, at least the class LP's at these: it sees integrality
    within each layer (GPT-OSS window 0: 26.64 against 26.27 ms, in about 3 s). Only the bound
    depends on it, never the placement: `milp` without a time limit (evaluations, which use only
    the placement) leaves it out."""
    problem, deadline = run.problem, run.deadline
    if run.certificate is None or not run.open() or (run.work is not None and not run.exact):
        return
    if deadline.expired():
        deadline.skip("lagrangian")
        return
    from comoe_opt.residency.bounds.decompose import MIN_LAYER_S, Prices, lagrangian_value, stepped_lagrangian

    left = deadline.remaining()
    # every layer's MILP gets at least MIN_LAYER_S: with less than that for all of them left, the
    # step would end past the time limit (the paper baseline's 32 layers at 10 s overran by 4 s)
    if left < problem.layers * MIN_LAYER_S:
        deadline.note(f"lagrangian: skipped, {left:.1f} s left for {problem.layers} layers' MILPs")
        return
    prices = Prices.of_duals(run.certificate.coupling_duals)
    nodes = None if run.work is None else run.work.lagrangian_nodes
    with deadline.phase("lagrangian"):
        try:
            # with a time limit the prices take subgradient steps while the share lasts; on work
            # limits they stay the class LP's (the steps are paced by the clock)
            if run.work is not None:
                value = lagrangian_value(problem, prices, layer_nodes=nodes)
            else:
                value = stepped_lagrangian(problem, prices, deadline=run.share("lagrangian"))
            run.lagrangian_value, run.lagrangian = value, value.bound
        except ComoeError as error:  # a layer's MILP ended without a bound (out of time)
            deadline.note(f"lagrangian: {error}")
            return
    run.raise_bound(run.lagrangian)


def _group_bound(run: _Run) -> None:
    """`exact`: the scenario-group bound (group_bound.py) at the Lagrangian's prices, from its
    layer values, on its share of the time left, while the gap is open; the layers with the
    largest share of the gap first. Only the bound depends on it, never the placement; on work
    limits (no time limit) it is left out, as its group solves are paced by the clock."""
    problem, deadline, lagrangian = run.problem, run.deadline, run.lagrangian_value
    if run.certificate is None or lagrangian is None or run.best.placement is None or not run.open():
        return
    if run.work is not None:
        return
    if deadline.expired():
        deadline.skip("group_bound")
        return
    from comoe_opt.residency.bounds.group_bound import pipeline_group_bound

    budget = run.share("group_bound")
    with deadline.phase("group_bound"):
        prices, layers = lagrangian.prices, lagrangian.layer_bounds  # the best prices of `_lagrangian`
        run.groups = pipeline_group_bound(problem, prices, layers, run.best.placement, budget)
    run.raise_bound(run.groups.bound)


def _cut_rounds(run: _Run) -> None:
    """`exact`: the exact scenario model's rounds (cut_model.py), where it applies and fits, while the
    gap is open, on their share of the time left (the bound settles in the first rounds; the rest
    searches), a smaller one when the class bound already holds what the rounds' first minute
    reaches, all of it without a search; or to the work limits' rounds and nodes."""
    problem, deadline = run.problem, run.deadline
    if not (cut_model_applies(problem) and _cut_model_fits(problem)) or not run.open():
        return
    if deadline.expired():
        deadline.skip("cut_rounds")
        return
    name = "cut_rounds_behind_classes" if run.certificate is not None else "cut_rounds"
    # without a search the rounds are all `exact` can spend its time on
    budget = run.share(name) if problem.search_moves else deadline.share(1.0)
    work = run.work
    rounds = None if work is None else work.cut_rounds_behind_classes if run.certificate else work.cut_rounds
    with deadline.phase("cut_rounds"):
        # a round's placement is searched on the whole deadline: the search is not the proof's
        cuts = solve_with_cuts(
            problem, run.best.placement, deadline=budget, mip_gap=run.mip_gap,
            improve=_improver(problem, deadline), floor=run.bound,
            max_rounds=50 if rounds is None else rounds, work=None if work is None else work.round_work(),
        )  # fmt: skip
    if cuts.placement is not None:
        run.best.offer(problem, cuts.placement, "scenario cut model")
    run.cuts = cuts
    run.raise_bound(cuts.bound)
    run.status = cuts.status


def _longer_searches(run: _Run) -> None:
    """`exact` spends what time the proof leaves on annealing runs of at most `ANNEAL_PROPOSALS`
    per layer from the best placement, a new seed each, while the gap is open: with a time limit
    they end on it by design, each run fitted to the time left so that every layer is reached
    (GPT-OSS window 13, 60 s: 0.54% against 0.82% for runs of a fixed 40,000, of which one fit);
    without one, `work.longer_runs` runs of `work.longer_proposals`. Where the annealing does not
    apply (more than 12 chiplets: DeepSeek-V3's 32), refine.py's search with `EXACT_SEARCH_FACTOR`
    times the moves instead."""
    problem, best, deadline = run.problem, run.best, run.deadline
    if cut_model_applies(problem) and best.placement is not None and problem.search_moves:
        annealing = problem.scenario_work_ms is not None and enumerable(problem.scenario_work_ms)
        runs = math.inf if run.work is None else run.work.longer_runs
        proposals = ANNEAL_PROPOSALS if run.work is None else run.work.longer_proposals
        stall = math.inf if run.work is None else run.work.longer_stall_runs
        seed, missed = 1, 0
        with deadline.phase("longer_search"):
            while run.open() and seed <= runs and missed < stall:
                if deadline.expired():
                    if seed == 1:
                        deadline.skip("longer_search")
                    else:
                        deadline.note(f"longer searches: stopped by the time limit after {seed - 1}")
                    break
                before = best.objective
                if annealing:  # with a time limit each run is fitted to it (it ends on it by design)
                    fit = deadline if run.work is None else None
                    best.anneal(problem, seed, deadline, proposals, fit_to=fit)
                else:
                    best.search_longer(problem, seed, deadline)
                missed = missed + 1 if best.objective >= before else 0
                seed += 1
    if run.cuts is not None and run.open():  # stopped short: by the time limit, or by the work limits
        run.status = Status.TIME_LIMIT if run.work is None else Status.FEASIBLE


# `milp`'s steps after the replica-count MILP, in this order; `exact` runs them and then its own
STEPS: tuple[tuple[str, Callable[[_Run], None]], ...] = (
    ("search", _fill_and_search),
    ("class_bound", _class_bound),
    ("anneal", _anneal),
    ("polish", _polish),
    ("lagrangian", _lagrangian),
)
EXACT_STEPS: tuple[tuple[str, Callable[[_Run], None]], ...] = (
    ("group_bound", _group_bound),
    ("cut_rounds", _cut_rounds),
    ("longer_search", _longer_searches),
)


def _full_model_rows(problem: ResidencyProblem) -> int:
    """Constraints of `build_full_model` (the polish's size, for foreseeing its build time)."""
    L, E, C, S = problem.layers, problem.experts, problem.chiplets, problem.scenarios
    # any_copy and on_replica (y_on_replica with scenarios), resident, replicas, capacity, budget, quotas
    common = 2 * L * E * C + 2 * L * E + C + 1 + len(problem.tenants)
    if not S:
        return common + L * E + L * C  # split, makespan
    busy = int((problem.scenario_work.max(axis=3) > 0).sum())  # (l, s, e) with work
    return common + busy * (C + 1) + L * S * C + L * E  # split, on_replica, makespan, nearest


class _Incumbent:
    """The best placement found so far, with where it came from, its objective terms and the
    replicas the fill added to it on spare pages."""

    def __init__(
        self, placement: Placement | None, objective: float, source: str, terms: ObjectiveTerms | None
    ):
        self.placement, self.objective, self.source, self.terms = placement, objective, source, terms
        self.spare_replicas = 0

    @classmethod
    def of(cls, result: ResidencyResult | None) -> _Incumbent:
        if result is None:
            return cls(None, math.inf, "none", None)
        return cls(result.solution, result.objective, f"warm start ({result.method})", result.report.terms)

    def offer(self, problem: ResidencyProblem, placement: Placement, source: str) -> bool:
        """Keep `placement` if it is feasible and better; whether it was kept."""
        if check_feasible(problem, placement):
            return False
        scored = score(problem, placement)
        if scored.total < self.objective:
            self.placement, self.objective, self.source, self.terms = placement, scored.total, source, scored
            self.spare_replicas = 0
            return True
        return False

    @property
    def held(self) -> Placement:
        """The best placement, where the steps that improve it run (after one was found)."""
        if self.placement is None:
            raise ValueError("no placement to improve yet")
        return self.placement

    def fill_ties(self, problem: ResidencyProblem) -> None:
        """Spare pages take flexible replicas when the objective stays the same (fill.py)."""
        held = self.held
        filled = fill_spare(problem, held)
        if filled is held:
            return
        scored = score(problem, filled)
        if scored.total <= self.objective + 1e-9 * max(1.0, abs(self.objective)):
            spare = filled.pages - held.pages
            self.placement, self.objective, self.terms = filled, scored.total, scored
            self.spare_replicas = spare

    def search(self, problem: ResidencyProblem, deadline: Deadline) -> None:
        """Local search on the scenarios from the best placement so far, or the previous one if better."""
        start, start_objective = self.held, self.objective
        previous = problem.previous
        if previous is not None and not check_feasible(problem, previous):
            kept = score(problem, previous).total
            if kept < start_objective:
                start = previous
        found = refine(problem, start, deadline=deadline)
        before = self.source
        self.offer(problem, found, f"{before} + scenario search")

    def search_longer(self, problem: ResidencyProblem, seed: int, deadline: Deadline) -> None:
        """One more search of `EXACT_SEARCH_FACTOR` times the moves from the best so far, with its
        own seed."""
        longer = dataclasses.replace(problem, search_moves=problem.search_moves * EXACT_SEARCH_FACTOR)
        found = refine(longer, self.held, seed=seed, deadline=deadline)
        label = "+ longer search"
        self.offer(problem, found, self.source if self.source.endswith(label) else f"{self.source} {label}")

    def anneal(
        self,
        problem: ResidencyProblem,
        seed: int,
        deadline: Deadline,
        proposals: int,
        fit_to: Deadline | None = None,
    ) -> None:
        """`proposals` annealing proposals per layer from the best so far (anneal.py), or as many
        as fit `fit_to`'s time left."""
        found = anneal(problem, self.held, proposals=proposals, seed=seed, deadline=deadline, fit_to=fit_to)
        label = "+ annealing"
        self.offer(problem, found, self.source if self.source.endswith(label) else f"{self.source} {label}")


EXACT_SEARCH_FACTOR = 10  # ... and where it does not apply, searches of this many times policy.search_moves
FULL_MODEL_BINARIES = 4096  # up to this many x[l,e,c], the exact model can tighten the bound
FULL_MODEL_SHARES = 65536  # ... and up to this many scenario shares t[l,s,e,c]
POLISH_BUILD_SHARE = 0.5  # the polish runs only when its foreseen build takes at most this share of its time


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
    problem: ResidencyProblem,
    start: Placement | None,
    deadline: Deadline,
    mip_gap: float,
    rows: int,
    node_rows: int,
) -> ResidencyResult:
    """The exact x[l,e,c] model of `rows` rows, warm-started from `start`, to `node_rows` nodes x
    rows: a tighter bound on small instances."""
    # the full model need not close (with scenarios its LP bound is the mean load's); a node limit,
    # not the clock, ends it, so that `milp` gives the same placement on any machine
    nodes = mip_work(nodes_within(rows, node_rows, POLISH_NODES))
    return _solve_full_model(problem, start, deadline=deadline, mip_gap=mip_gap / 2, options=nodes)


def _solve_full_model(
    problem: ResidencyProblem,
    start: Placement | None,
    *,
    deadline: Deadline,
    mip_gap: float,
    options: dict | None = None,
) -> ResidencyResult:
    """Solve `build_full_model` (exact, scenarios included); objective and bound with the constant.
    The build counts against the deadline; HiGHS gets what remains after the hand-over."""
    t0 = time.perf_counter()
    model = build_full_model(problem)
    if start is not None:
        set_full_start(model, problem, start.resident)
    build_s = time.perf_counter() - t0
    outcome = solve_with_highs(
        model, mip_gap=mip_gap, warm_start=start is not None, options=options, deadline=deadline
    )
    _note_highs("full model", outcome, deadline)
    constant = problem.constant_ms
    bound = outcome.bound + constant
    report = FullModelReport(
        terms=None,
        solver_objective=outcome.objective + constant,
        solver_status=outcome.solver_status,
        build_s=build_s,
        solver_s=outcome.runtime_s,
        timing=deadline.timing(),
    )
    placement = Placement(full_model_placement(model, problem)) if outcome.status.has_solution else None
    if placement is None or check_feasible(problem, placement):
        status = Status.NO_SOLUTION if outcome.status.has_solution else outcome.status
        return SolveResult(
            "full", status, math.inf, bound, time.perf_counter() - t0, None, constant, report=report
        )
    terms = score(problem, placement)
    bound = tidy_bound(bound, terms.total)
    status = status_from_gap(outcome.status, terms.total, bound, mip_gap, constant)
    return SolveResult(
        "full",
        status,
        terms.total,
        bound,
        time.perf_counter() - t0,
        placement,
        constant,
        report=dataclasses.replace(report, terms=terms),
    )


def _improver(problem: ResidencyProblem, deadline: Deadline):
    """The local search on the scenarios, as the cut model's per-round improvement (or None)."""
    if not problem.search_moves:
        return None
    return lambda placement: refine(problem, placement, deadline=deadline)


def _feasible_heuristics(problem: ResidencyProblem, deadline: Deadline) -> list[ResidencyResult]:
    """Every warm-start heuristic whose placement satisfies the problem (one that fails is skipped),
    until the deadline passes once one has a placement."""
    found: list[ResidencyResult] = []
    names = warm_starts()
    for k, name in enumerate(names):
        if found and deadline.expired():
            deadline.note(f"warm start: stopped by the time limit after {k} of {len(names)} heuristics")
            break
        result = _heuristic(problem, name)
        if result.status.has_solution:
            found.append(result)
    return found


def _gap(problem: ResidencyProblem, objective: float, bound: float) -> float:
    return relative_gap(objective, bound, problem.constant_ms)


def tidy_bound(bound: float, objective: float) -> float:
    """A dual bound above the objective by solver round-off only is the objective itself;
    a larger excess is left visible (it would mean a wrong bound)."""
    if objective < bound <= objective + 1e-7 * max(1.0, abs(objective)):
        return objective
    return bound


def solve_full(problem: ResidencyProblem, *, deadline: Deadline, mip_gap: float) -> ResidencyResult:
    """The plain x[l,e,c] model (exact, balance scenarios included); for small instances."""
    if deadline.expired():
        deadline.skip("full_model")
        skipped = FullModelReport(terms=None, solver_objective=math.inf, solver_status=NOT_STARTED,
                                  build_s=0.0, solver_s=0.0, timing=deadline.timing())  # fmt: skip
        return SolveResult("full", Status.TIME_LIMIT, math.inf, -math.inf, skipped.timing.total_s, None,
                           problem.constant_ms, report=skipped)  # fmt: skip
    # without a time limit, a work limit: nodes on a budget of node-rows (schedule.py)
    nodes = (
        None
        if not work_limited(deadline)
        else mip_work(nodes_within(_full_model_rows(problem), FULL_NODE_ROWS, FULL_NODES))
    )
    with deadline.phase("full_model"):
        result = _solve_full_model(problem, None, deadline=deadline, mip_gap=mip_gap, options=nodes)
    timing = deadline.timing()
    report = dataclasses.replace(result.report, timing=timing)
    return dataclasses.replace(result, runtime_s=timing.total_s, report=report)


def solve_lp(problem: ResidencyProblem, deadline: Deadline | None = None) -> ResidencyResult:
    """The LP relaxation of the replica-count model: its value is a bound only when solved to
    optimality (an LP stopped on time proves nothing)."""
    deadline = Deadline(math.inf) if deadline is None else deadline
    with deadline.phase("lp"):
        outcome = _lp_relaxation(problem, deadline)
    value = outcome.objective + problem.constant_ms
    solved = outcome.status is Status.OPTIMAL
    report = LPReport(
        terms=None,
        relaxation="LP of the replica-count model",
        solver_status=outcome.solver_status,
        timing=deadline.timing(),
    )
    return SolveResult(
        "lp",
        outcome.status,
        value if solved else math.inf,
        value if solved else -math.inf,
        report.timing.total_s,
        None,
        problem.constant_ms,
        report=report,
    )


def _lp_relaxation(problem: ResidencyProblem, deadline: Deadline) -> HighsOutcome:
    if deadline.expired():
        deadline.skip("lp")
        return _SKIPPED
    model = build_replica_model(problem)
    pyo.TransformationFactory("core.relax_integer_vars").apply_to(model)
    return solve_with_highs(
        model, deadline=deadline, options=lp_work(model.nconstraints(), model.nvariables())
    )
