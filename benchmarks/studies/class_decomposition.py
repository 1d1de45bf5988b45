"""A study of the class model beyond the step `exact` runs: the joint class MILP, the Lagrangian
over layers by projected subgradient from the LP's prices, and a placement repaired from the
class counts (formulations/residency.md, "Layer decomposition bound"). `exact` takes the class
LP's bound and the Lagrangian at its prices (comoe_opt/residency/bounds/decompose.py); this
driver measured what more the subgradient and the joint MILP give (benchmarks/studies/bench_bounds.py).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from comoe_opt.deadline import Deadline
from comoe_opt.errors import ComoeError
from comoe_opt.highs import lp_work, mip_work
from comoe_opt.residency.bounds.decompose import (
    LAGRANGIAN_NODES,
    ClassModel,
    CutFamilies,
    DeviceClasses,
    LagrangianValue,
    Prices,
    device_classes,
    lagrangian_value,
    per_class,
)
from comoe_opt.residency.objective import check_feasible, score
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.problem import ResidencyProblem
from comoe_opt.residency.search.anneal import anneal
from comoe_opt.residency.search.refine import refine
from comoe_opt.results import Status


@dataclass
class DecomposeResult:
    """Bounds of the class model (joint and Lagrangian), the prices, a placement, the time per phase."""

    bound: float  # the best valid lower bound found (with problem.constant_ms)
    root_bound: float  # LP relaxation of the joint class model
    joint_bound: float  # the joint class MILP's proven dual bound (-inf when not run)
    lagrangian_bound: float  # L(prices); when `closed`, lagrangian_value(problem, prices) gives it again
    layer_bounds: np.ndarray  # [L] per-layer bounds at `prices`
    closed: bool  # every layer's priced MILP was solved to optimality at `prices`
    prices: Prices
    placement: Placement | None
    objective: float  # exact objective of `placement` (inf when None)
    phases: dict[str, float]
    history: list[dict] = field(default_factory=list)  # one entry per subgradient step


def decompose(
    problem: ResidencyProblem,
    time_limit_s: float | None = 30.0,
    *,
    start: Placement | None = None,
    iterations: int = 30,
    joint: bool = True,
    cuts: CutFamilies | None = None,
    search_rounds: int = 1,
    anneal_proposals: int = 40_000,
) -> DecomposeResult:
    """Class-model bounds — the LP relaxation (root), the joint MILP, the Lagrangian over layers
    from the LP's prices — and a placement: the joint model's (or the repaired Lagrangian) counts
    on chiplets, and `start` when given, each improved by `search_rounds` local searches; the
    better then by `anneal_proposals` annealing proposals per layer (anneal.py) until the budget
    ends.

    The joint MILP gets a third of `time_limit_s`, the subgradient steps what remains of two
    thirds; a started layer solve is finished, so this is a budget, not a promise to the
    millisecond. Without a time limit (None) each step ends on its work: the joint MILP on
    `LAGRANGIAN_NODES` nodes, the subgradient on its `iterations`, the annealing on its proposals.
    Raises `ComoeError` without balance scenarios on related chiplets.
    """
    began = time.perf_counter()
    phases: dict[str, float] = {}
    classes = device_classes(problem)

    def lap(name: str, since: float) -> float:
        now = time.perf_counter()
        phases[name] = phases.get(name, 0.0) + now - since
        return now

    t = time.perf_counter()
    root, prices = _root(problem, classes, cuts)
    t = lap("root LP", t)
    joint_bound, counts = -math.inf, None
    if joint:
        model = ClassModel(problem, classes, list(range(problem.layers)), cuts=cuts)
        if time_limit_s is None:
            outcome = model.lp.solve(mip_gap=1e-6, options=mip_work(LAGRANGIAN_NODES))
        else:
            outcome = model.lp.solve(time_limit_s=max(time_limit_s / 3 - (t - began), 0.05), mip_gap=1e-6)
        joint_bound = outcome.bound + problem.constant_ms if math.isfinite(outcome.bound) else -math.inf
        if outcome.status.has_solution:
            counts = model.counts()
        t = lap("joint class MILP", t)
    stop_at = math.inf if time_limit_s is None else began + 2 * time_limit_s / 3
    best, history, best_prices = _subgradient(problem, classes, prices, stop_at, iterations, cuts)
    t = lap("Lagrangian", t)
    if counts is None:
        counts = _repair_counts(problem, classes, best.counts)
    placement, objective = _incumbent(problem, classes, counts, start, search_rounds)
    t = lap("placement", t)
    if placement is not None and anneal_proposals:
        end = None if time_limit_s is None else began + time_limit_s
        annealed = anneal(problem, placement, proposals=anneal_proposals, stop_at=end)
        value = score(problem, annealed).total
        if value < objective:
            placement, objective = annealed, value
    lap("anneal", t)
    return DecomposeResult(
        bound=max(root, joint_bound, best.bound),
        root_bound=root,
        joint_bound=joint_bound,
        lagrangian_bound=best.bound,
        layer_bounds=best.layer_bounds,
        closed=bool(best.closed.all()),
        prices=best_prices,
        placement=placement,
        objective=objective,
        phases=phases,
        history=history,
    )


def _root(
    problem: ResidencyProblem, classes: DeviceClasses, cuts: CutFamilies | None
) -> tuple[float, Prices]:
    """LP relaxation of the joint class model: its bound, and its coupling rows' duals as prices."""
    model = ClassModel(problem, classes, list(range(problem.layers)), cuts=cuts)
    h = model.lp.h
    n = h.getNumCol()
    h.changeColsIntegrality(n, np.arange(n, dtype=np.int32), np.zeros(n, dtype=np.uint8))
    outcome = model.lp.solve(options=lp_work(model.lp.rows, model.lp.columns))
    # ≤ rows of a minimisation have duals ≤ 0 in HiGHS's sign convention
    row_dual = np.maximum(-np.asarray(h.getSolution().row_dual), 0.0)
    duals = row_dual[model.coupling_rows]
    quota = np.where(model.tenant_rows >= 0, row_dual[np.maximum(model.tenant_rows, 0)], 0.0)
    K = classes.count
    prices = Prices(duals[:K], float(duals[K]), quota)
    if outcome.status is not Status.OPTIMAL:
        raise ComoeError(f"the class model's LP relaxation ended {outcome.solver_status}")
    return outcome.objective + problem.constant_ms, prices


def _subgradient(
    problem: ResidencyProblem,
    classes: DeviceClasses,
    prices: Prices,
    stop_at: float,
    iterations: int,
    cuts: CutFamilies | None,
) -> tuple[LagrangianValue, list[dict], Prices]:
    """Projected subgradient steps on the prices (Polyak steps towards the best value plus a margin);
    returns the best L found and one history entry per step."""
    quotas = np.array([t.max_pages for t in problem.tenants], dtype=np.float64)
    best_value: LagrangianValue | None = None
    best_prices = prices
    history: list[dict] = []
    theta, stalled = 1.0, 0
    deadline = None if math.isinf(stop_at) else Deadline(max(stop_at - time.perf_counter(), 0.0))
    for step in range(iterations):
        if best_value is not None and deadline is not None and deadline.expired():
            break
        value = lagrangian_value(problem, prices, classes=classes, deadline=deadline, cuts=cuts)
        improved = best_value is None or value.bound > best_value.bound + 1e-12
        if improved:
            best_value, best_prices, stalled = value, prices, 0
        else:
            stalled += 1
            if stalled >= 2:
                theta, stalled = theta / 2, 0
        g_class = value.class_pages - classes.capacity
        g_budget = value.budget_pages - problem.budget_pages
        g_quota = value.tenant_pages - quotas
        history.append(
            {"step": step, "bound": value.bound, "best": best_value.bound, "prices": prices,
             "over": float(np.maximum(g_class, 0).sum()), "seconds": time.perf_counter()}
        )  # fmt: skip
        norm = float(g_class @ g_class + g_budget**2 + g_quota @ g_quota)
        if norm == 0:
            break
        target = best_value.bound + max(1e-3 * abs(best_value.bound - problem.constant_ms), 1e-9)
        size = theta * (target - value.bound) / norm
        prices = Prices(
            np.maximum(prices.class_pages + size * g_class, 0.0),
            max(prices.budget + size * g_budget, 0.0),
            np.maximum(prices.quota + size * g_quota, 0.0),
        )
    return best_value, history, best_prices


# --------------------------------------------------------------- placement


def _repair_counts(problem: ResidencyProblem, classes: DeviceClasses, counts: np.ndarray) -> np.ndarray:
    """Per-layer solutions' counts [L, E, K] cut back to the coupling: while a class, the budget or a
    quota is over, drop the extra replica (beyond the first, never a leased one) whose work per
    replica is smallest."""
    counts = counts.copy()
    lease = np.zeros_like(counts)
    if problem.leased is not None:
        for k in range(classes.count):
            lease[..., k] = problem.leased[..., classes.of == k].sum(axis=2)
    weight = problem.work_ms.min(axis=2)  # [L, E]
    quotas = [(t.owns, t.max_pages) for t in problem.tenants]

    def over() -> np.ndarray | None:
        """A mask [L, E, K] of the replicas whose removal helps, or None when nothing is over."""
        per_class = counts.sum(axis=(0, 1))
        mask = np.zeros(counts.shape, dtype=bool)
        for k in np.flatnonzero(per_class > classes.capacity):
            mask[..., k] = True
        if counts.sum() > problem.budget_pages:
            mask[:] = True
        for owns, limit in quotas:
            if counts[owns].sum() > limit:
                mask |= owns[..., None]
        return mask if mask.any() else None

    while (mask := over()) is not None:
        total = counts.sum(axis=2, keepdims=True)
        removable = mask & (counts > lease) & ((total >= 2) | (not problem.all_resident))
        if not removable.any():
            raise ComoeError("the layers' replica counts cannot be cut back to the coupling constraints")
        # extra replicas first (least work per replica), a last replica only when nothing else helps
        last = np.where(total >= 2, 0.0, 1.0 + problem.miss_ms[..., None] * problem.batches)
        score_ = np.where(removable, last * 1e9 + weight[..., None] / np.maximum(total, 1), np.inf)
        l, e, k = np.unravel_index(int(score_.argmin()), counts.shape)
        counts[l, e, k] -= 1
    return counts


def place_counts(problem: ResidencyProblem, classes: DeviceClasses, counts: np.ndarray) -> Placement | None:
    """Replicas per class [L, E, K] on chiplets: leased replicas where they are; then, per layer and
    class, every chiplet gets an even share of the layer's pages (more to those with more room) and
    experts, most replicas first, then heaviest first, take the chiplets with share left that keep
    the mean over scenarios of the busiest chiplet lowest (each replica carrying an equal part of
    the expert's work). None when the shares leave an expert too few distinct chiplets."""
    L, E, C = problem.layers, problem.experts, problem.chiplets
    resident = np.zeros((L, E, C), dtype=bool)
    if problem.leased is not None:
        resident |= problem.leased
    room = problem.capacity_pages.astype(np.int64) - resident.sum(axis=(0, 1))
    speeds = classes.speed[classes.of]
    for layer in range(L):
        work = problem.scenario_work[:, layer, :, 0]  # [S, E] on a unit-speed chiplet
        replicas = np.maximum(counts[layer].sum(axis=1), 1)
        need = np.maximum(counts[layer] - per_class(classes, resident[layer]), 0)  # [E, K]
        shares = np.zeros(C, dtype=np.int64)
        for k in range(classes.count):
            devices = classes.members(k)
            share = _even_share(int(need[:, k].sum()), room[devices], L - layer)
            if share is None:
                return None
            shares[devices] = share
        load = (work[:, :, None] * resident[layer][None] / replicas[None, :, None]).sum(axis=1) / speeds
        order = sorted(range(E), key=lambda e: (-int(need[e].sum()), -float(work[:, e].mean())))
        for e in order:
            piece = work[:, e] / replicas[e]  # [S]
            for k in np.flatnonzero(need[e]):
                for _ in range(int(need[e, k])):
                    free = [c for c in classes.members(k) if shares[c] > 0 and not resident[layer, e, c]]
                    if not free:
                        return None
                    cost = [np.maximum(load.max(axis=1), load[:, c] + piece / speeds[c]).mean() for c in free]
                    c = free[int(np.argmin(cost))]
                    resident[layer, e, c] = True
                    shares[c] -= 1
                    room[c] -= 1
                    load[:, c] += piece / speeds[c]
    placement = Placement(resident)
    return None if check_feasible(problem, placement) else placement


def _even_share(pages: int, room: np.ndarray, layers_left: int) -> np.ndarray | None:
    """`pages` split over chiplets as evenly as their room allows, the extra to those with the most
    room per layer left."""
    if pages > room.sum():
        return None
    share = np.minimum(np.full(room.size, pages // room.size), room)
    order = np.argsort(-(room - share) / max(layers_left, 1), kind="stable")
    while share.sum() < pages:
        for i in order:
            if share.sum() < pages and share[i] < room[i]:
                share[i] += 1
    return share


def _incumbent(
    problem: ResidencyProblem,
    classes: DeviceClasses,
    counts: np.ndarray,
    start: Placement | None,
    seeds: int,
) -> tuple[Placement | None, float]:
    """The better of the placed counts (improved by the local search) and `start`."""
    candidates = []
    placed = place_counts(problem, classes, counts)
    if placed is not None:
        candidates.append(placed)
        for seed in range(seeds):
            candidates.append(refine(problem, candidates[-1], seed=seed))
    if start is not None and not check_feasible(problem, start):
        candidates.append(start)
    if not candidates:
        return None, math.inf
    values = [score(problem, c).total for c in candidates]
    i = int(np.argmin(values))
    return candidates[i], float(values[i])
