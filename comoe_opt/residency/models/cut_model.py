"""The exact scenario model over x[l,e,c], solved by row generation on the cut condition.

With balance scenarios the window objective is

    W · Σ_l ( (1/S) Σ_s z*_ls + NoP_l + misses_l ) + κ · copies

where z*_ls is scenario s's best-routing makespan on layer l, the largest
cut ratio over chiplet sets D (best_split/cut_condition.py). For chiplets related by one
speed factor v_c this is linear in a placement through

    V_D · z_ls ≥ Σ_e ω_lse · u_leD,      u_leD ≥ r_le − Σ_{c ∉ D} x_lec,   u ≥ 0

(`u_leD` = 1 exactly when every replica of a resident expert lies in D;
`r_le` = 1 when (l, e) is resident; an expert without a replica runs
anywhere and only counts for D = all chiplets, a constant cut). There are
S · (2^C − 1) such cuts per layer, so they are added lazily: solve the MILP
with the cuts found so far, find each scenario's maximising set for the
solution (`CutTable`), add the violated cuts, re-solve. Every round's dual
bound is a valid lower bound (the model is a relaxation of the exact one);
every round's placement is scored exactly, and the best is the incumbent.
When no cut is violated, the MILP's solution is exact.

The model keeps every constraint of the slow loop: capacity, replica budget,
replicas per expert, all_resident, leases, tenant quotas; its objective has
the misses, nearest-replica NoP (`y` picks the nearest replica), copies and
the scenario makespans. The least NoP of every token is a constant
(`problem.constant_ms`) and left out, so HiGHS's gap is on what a placement
changes.

The model is built from arrays in one persistent HiGHS model
(`highs.DirectModel`), not Pyomo: rounds add rows and columns in
milliseconds, where Pyomo took seconds per round to hand the same model over
(formulations/residency.md, "Exact scenario model").
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from comoe_opt.best_split import cut_condition as scenarios
from comoe_opt.best_split import sets as device_sets
from comoe_opt.best_split.cut_condition import CutTable, cut_condition_applies, masks_of, speeds_of
from comoe_opt.best_split.min_cut import bottlenecks
from comoe_opt.deadline import Deadline
from comoe_opt.highs import INF, DirectModel, mip_work
from comoe_opt.residency.objective import check_feasible, score
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.problem import ResidencyProblem
from comoe_opt.residency.schedule import CLOSING_ROUND_WORK, RoundWork
from comoe_opt.results import Status, relative_gap

CUT_TOLERANCE = 1e-7  # relative: a cut violated by less is round-off


def cut_model_applies(problem: ResidencyProblem) -> bool:
    """Whether the cut model is exact here: balance scenarios on chiplets related by one speed factor."""
    return problem.scenarios > 0 and cut_condition_applies(problem.scenario_work)


@dataclass
class CutRounds:
    """What the row generation did: rounds, cuts, and bound and incumbent after each round."""

    rounds: int = 0
    cuts: int = 0
    sets: int = 0
    history: list[dict] = field(default_factory=list)
    stopped_by: str = ""  # the work limit that ended the rounds, if one did


@dataclass
class ExactOutcome:
    placement: Placement | None
    objective: float
    bound: float
    status: Status
    rounds: CutRounds


def _out_of_time(rounds: int) -> str:
    return f"cut rounds: stopped by their share of the time limit after {rounds} rounds"


class OutOfTime(Exception):
    """The deadline passed while the cut model was being built."""


class CutModel:
    """The x[l,e,c] model with lazily added scenario cuts, in one persistent HiGHS model."""

    def __init__(
        self,
        problem: ResidencyProblem,
        deadline: Deadline | None = None,
        page_cost_ms: np.ndarray | None = None,
    ):
        self.deadline = deadline  # checked between layers of the build (raises OutOfTime)
        # a price per page of (l, e) on c, broadcast to [L, E, C] (a Lagrangian's prices of the
        # constraints across layers: a class's pages, the budget, a tenant's quota)
        self.page_cost_ms = 0.0 if page_cost_ms is None else page_cost_ms
        p = self.problem = problem
        self.L, self.E, self.C, self.S = p.layers, p.experts, p.chiplets, p.scenarios
        self.speeds = speeds_of(p.scenario_work)
        # every set enumerated when few chiplets; beyond, each scenario's set by min cut (min_cut.py)
        self.table = CutTable.for_speeds(self.speeds) if self.C <= scenarios.MAX_ENUMERATED_CHIPLETS else None
        self.all_chiplets = (1 << self.C) - 1
        self.unit = p.scenario_work[..., 0]  # [S, L, E] work on a unit-speed chiplet (v_0 = 1)
        self.busy = self.unit.max(axis=0) > 0  # [L, E]: experts with scenario work
        self.cuts: set[tuple[int, int, int]] = set()  # (layer, scenario, set mask)
        self.sets: set[tuple[int, int]] = set()  # (layer, set mask) with u columns
        self.u: dict[tuple[int, int, int], int] = {}  # (layer, expert, set mask) -> column
        self.lp = DirectModel()
        self._build()

    # ------------------------------------------------------------- model

    def x(self, l: int, e: int, c: int) -> int:
        return (l * self.E + e) * self.C + c

    def r(self, l: int, e: int) -> int:
        return self.n_x + l * self.E + e

    def z(self, l: int, s: int) -> int:
        return self.z0 + l * self.S + s

    def _build(self) -> None:
        p, L, E, C, S = self.problem, self.L, self.E, self.C, self.S
        W = p.batches
        self.n_x = L * E * C
        self.z0 = self.n_x + L * E
        prev = p.previous.resident if p.previous is not None else np.zeros((L, E, C), dtype=bool)
        leased = p.leased if p.leased is not None else np.zeros((L, E, C), dtype=bool)
        x_cost = np.broadcast_to(np.where(prev, 0.0, p.copy_ms) + self.page_cost_ms, (L, E, C)).ravel()
        r_cost = -W * p.miss_ms.ravel()
        floor = (self.unit.sum(axis=2) / self.speeds.sum()).T.ravel()  # [L*S]: D = all chiplets
        costs = np.concatenate((x_cost, r_cost, np.full(L * S, W / S)))
        lower = np.concatenate((leased.ravel().astype(float), np.full(L * E, float(p.all_resident)), floor))
        upper = np.concatenate((np.ones(self.n_x + L * E), np.full(L * S, INF)))
        lp = self.lp
        lp.add_columns(costs[: self.z0], lower[: self.z0], upper[: self.z0], integer=True)
        lp.add_columns(costs[self.z0 :], lower[self.z0 :], upper[self.z0 :])
        lp.set_offset(W * p.miss_ms.sum())
        rows = lp
        for l, e in np.ndindex(L, E):
            if e == 0:
                self._check_time()
            xs = [self.x(l, e, c) for c in range(C)]
            rows.add_row(-INF, 0.0, [self.r(l, e), *xs], [1.0] + [-1.0] * C)  # r <= sum_c x
            if not p.all_resident:
                for c in xs:
                    rows.add_row(-INF, 0.0, [c, self.r(l, e)], [1.0, -1.0])  # x <= r
            if p.max_replicas < C:
                rows.add_row(-INF, p.max_replicas, xs, 1.0)
        for c in range(C):
            rows.add_row(-INF, float(p.capacity_pages[c]), np.arange(c, self.n_x, C), 1.0)
        rows.add_row(-INF, float(p.budget_pages), np.arange(self.n_x), 1.0)
        for t in p.tenants:
            owned = [self.x(l, e, c) for l, e in zip(*np.nonzero(t.owns), strict=True) for c in range(C)]
            if owned:
                rows.add_row(-INF, float(t.max_pages), owned, 1.0)
        self._nearest_nop()
        lp.flush()

    def _nearest_nop(self) -> None:
        """Nearest-replica NoP beyond the least: y[k, c] picks one replica of the k-th (l, e) with tokens
        (any chiplet when it has none)."""
        p, C = self.problem, self.C
        extra = p.nop_ms_per_token - p.nop_ms_per_token.min()
        pairs = np.argwhere(p.tokens > 0)
        if not extra.any() or pairs.size == 0:
            return
        costs = (p.batches * p.tokens[pairs[:, 0], pairs[:, 1]][:, None] * extra[None, :]).ravel()
        y0 = self.lp.add_columns(costs, np.zeros(costs.size), np.ones(costs.size))
        for k, (l, e) in enumerate(pairs):
            if k % self.E == 0:
                self._check_time()
            ys = [y0 + k * C + c for c in range(C)]
            self.lp.add_row(1.0, 1.0, ys, 1.0)
            for c in range(C):  # y <= x + 1 - r
                self.lp.add_row(-INF, 1.0, [ys[c], self.x(l, e, c), self.r(l, e)], [1.0, -1.0, 1.0])
        self.y0, self.y_pairs = y0, pairs

    def _check_time(self) -> None:
        if self.deadline is not None and self.deadline.expired():
            raise OutOfTime

    # -------------------------------------------------------------- cuts

    def _u_columns(self, layer: int, mask: int) -> None:
        """u[l,e,D] >= r[l,e] - sum_{c not in D} x[l,e,c] for the experts with scenario work."""
        experts = np.flatnonzero(self.busy[layer])
        first = self.lp.add_columns(
            np.zeros(experts.size), np.zeros(experts.size), np.full(experts.size, INF)
        )
        outside = [c for c in range(self.C) if not (mask >> c) & 1]
        for i, e in enumerate(experts.tolist()):
            col = first + i
            self.u[layer, e, mask] = col
            index = [col, self.r(layer, e), *(self.x(layer, e, c) for c in outside)]
            self.lp.add_row(0.0, INF, index, [1.0, -1.0] + [1.0] * len(outside))

    def add_cut(self, layer: int, scenario: int, mask: int) -> bool:
        """Add the cut of chiplet set `mask` for (layer, scenario); False if it is there already."""
        if (layer, scenario, mask) in self.cuts or mask == self.all_chiplets:
            return False
        if (layer, mask) not in self.sets:
            self.sets.add((layer, mask))
            self._u_columns(layer, mask)
        work = self.unit[scenario, layer]
        experts = np.flatnonzero(work > 0)
        capacity = float(self.speeds[[c for c in range(self.C) if (mask >> c) & 1]].sum())
        index = [self.z(layer, scenario), *(self.u[layer, int(e), mask] for e in experts)]
        self.lp.add_row(0.0, INF, index, [capacity, *(-work[experts])])
        self.cuts.add((layer, scenario, mask))
        return True

    def separate(self, resident: np.ndarray, z: np.ndarray | None) -> int:
        """Add every scenario's maximising set for `resident` whose cut `z` [L, S] violates
        (all of them when `z` is None); returns the cuts added."""
        added = 0
        for layer in range(self.L):
            if self.deadline is not None and self.deadline.expired():
                break  # the cuts added so far are valid; the next round finds the others
            ratios, masks = self.worst_sets(resident[layer], layer)
            for s, (exact, mask) in enumerate(zip(ratios, masks, strict=True)):
                if z is not None and exact <= z[layer, s] + CUT_TOLERANCE * max(1.0, exact):
                    continue
                added += self.add_cut(layer, s, device_sets.as_int(mask))
        self.lp.flush()
        return added

    def worst_sets(self, resident: np.ndarray, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """(makespan [S], maximising chiplet set [S, W]) of each scenario of one layer."""
        if self.table is None:
            return bottlenecks(self.unit[:, layer], resident, self.speeds)
        ratios = (self.unit[:, layer] @ self.table.inside(masks_of(resident))) / self.table.capacity
        best = ratios.argmax(axis=1)
        return ratios[np.arange(self.S), best], self.table.sets[best]

    # ---------------------------------------------------------- solutions

    def placement(self) -> Placement:
        return Placement((self.lp.values(0, self.n_x) > 0.5).reshape(self.L, self.E, self.C))

    def z_values(self) -> np.ndarray:
        return self.lp.values(self.z0, self.L * self.S).reshape(self.L, self.S)


def solve_with_cuts(
    problem: ResidencyProblem,
    start: Placement | None,
    *,
    deadline: Deadline,
    mip_gap: float,
    max_rounds: int = 50,
    improve: Callable[[Placement], Placement] | None = None,
    page_cost_ms: np.ndarray | None = None,
    work: RoundWork | None = None,
    floor: float = -math.inf,
) -> ExactOutcome:
    """Row generation to a proven gap: the best placement found, its exact objective, the bound.

    `improve(placement) -> placement`, when given, runs on every round's placement (a local
    search) before it is scored. Rounds start while the `deadline` has time left, each HiGHS
    solve gets what remains; with `work` (needed without a time limit) the rounds end on it
    instead: nodes per round, node-rows over all rounds, and rounds that stall (their MILP
    stopped on its nodes, and neither the incumbent nor the larger of the bound and `floor`, a
    bound proven already, moved).
    `page_cost_ms` (broadcast to [L, E, C]) prices every page (a Lagrangian subproblem's); the
    objective and the bound then include it.
    """

    def value_of(placement: Placement) -> float:
        priced = 0.0 if page_cost_ms is None else float((page_cost_ms * placement.resident).sum())
        return score(problem, placement).total + priced

    began = time.perf_counter()
    try:
        cm = CutModel(problem, deadline, page_cost_ms)
    except OutOfTime:
        deadline.note("cut rounds: the time limit passed while the cut model was built")
        return ExactOutcome(None, math.inf, -math.inf, Status.TIME_LIMIT, CutRounds())
    constant = problem.constant_ms
    best, best_objective = None, math.inf
    if start is not None and not check_feasible(problem, start):
        best, best_objective = start, value_of(start)
        cm.separate(start.resident, None)
    info = CutRounds()
    bound, status = -math.inf, Status.TIME_LIMIT
    if work is None and not math.isfinite(deadline.limit_s):  # every run ends: limits of work
        work = CLOSING_ROUND_WORK
    budget = _RoundBudget(work)
    while info.rounds < max_rounds:
        if deadline.expired():
            deadline.note(_out_of_time(info.rounds))
            break
        nodes = budget.next_round(cm.lp.rows)
        if nodes == 0:
            break  # the work limits are spent, or the rounds stalled
        # no setSolution start: HiGHS can return the given start's values with another
        # solution's objective when presolve solves the model (found by the property tests)
        options = None if nodes is None else mip_work(nodes)
        outcome = cm.lp.solve(time_limit_s=deadline.remaining(), mip_gap=mip_gap / 2, options=options)
        solver = outcome.status
        info.rounds += 1
        if solver in (Status.INFEASIBLE, Status.ERROR, Status.UNBOUNDED):
            status = solver
            break
        before = (max(bound, floor), best_objective)
        bound = max(bound, outcome.bound + constant)
        found = cm.placement() if solver.has_solution else None
        if found is not None and not check_feasible(problem, found):
            candidates = [found] if improve is None else [found, improve(found)]
            for candidate in candidates:
                value = value_of(candidate)
                if value < best_objective:
                    best, best_objective = candidate, value
        moved = (max(bound, floor), best_objective) != before
        budget.after_round(nodes, closed=solver is Status.OPTIMAL, moved=moved)
        added = cm.separate(found.resident, cm.z_values()) if found is not None else 0
        info.cuts, info.sets = len(cm.cuts), len(cm.sets)
        info.history.append(
            {
                "round": info.rounds,
                "bound": bound,
                "objective": best_objective,
                "cuts": info.cuts,
                "seconds": time.perf_counter() - began,
            }
        )
        if relative_gap(best_objective, bound, constant) <= mip_gap:
            status = Status.OPTIMAL
            break
        if added == 0:
            # the MILP's solution satisfies every cut, so its model value is exact: it stopped
            # short of the gap only on time (or the deadline cut the separation short)
            if deadline.expired():
                deadline.note(_out_of_time(info.rounds))
            on_time = solver is Status.TIME_LIMIT or deadline.expired()
            status = Status.TIME_LIMIT if on_time else Status.FEASIBLE
            break
    if status is Status.TIME_LIMIT and budget.spent():
        status = Status.FEASIBLE  # stopped on work, not on time
    info.stopped_by = budget.reason
    return ExactOutcome(best, best_objective, bound, status, info)


class _RoundBudget:
    """The rounds' work limits as they are spent (no limit without `work`)."""

    def __init__(self, work: RoundWork | None):
        self.work, self.node_rows, self.stalled, self.reason = work, 0, 0, ""
        self.rows = 0  # the model's rows at the last round

    def next_round(self, rows: int) -> int | None:
        """Nodes for the next round's MILP (None: no work limit), 0 when the rounds must stop."""
        work = self.work
        if work is None:
            return None
        if self.stalled >= work.stall_rounds:
            self.reason = f"{self.stalled} rounds in a row stopped on their nodes with no gain"
            return 0
        left = (work.node_rows - self.node_rows) // max(rows, 1)
        if left < 1:
            self.reason = f"the rounds' work limit ({work.node_rows} node-rows) is spent"
            return 0
        self.rows = rows
        return min(work.round_nodes, left)

    def after_round(self, nodes: int | None, *, closed: bool, moved: bool) -> None:
        if nodes is None:
            return
        self.node_rows += nodes * self.rows
        self.stalled = 0 if closed or moved else self.stalled + 1

    def spent(self) -> bool:
        return bool(self.reason)
