"""The least NoP any placement can have, as a bound term: every (layer, expert)'s nearest replica
is a page on its chiplet, so placing those pages (formulations/residency.md, "NoP by assignment").

The replica-count model (residency/exact/pipeline.py) knows how many replicas an expert has, not
where, so it prices NoP at its floor: every token at the nearest chiplet of all, `constant_ms`.
When the near chiplets cannot hold every expert (GPT-OSS: 4 pages a chiplet, the near class of 4
chiplets for 32 experts a layer), every placement pays more. The objective is `A(x) + N(x)`, N the
nearest-replica NoP and A the rest (balance, misses, copies) that the replica-count model bounds
with NoP at its floor, so `min (A + N) >= min A + min N`: its bound plus the excess of `min N`
over the floor is a bound too.

`min N` is a transportation problem: each (l, e) sends one unit, its nearest replica, to a chiplet
class k (chiplets of one NoP) at cost `W · λ_le · (n_k − min n)`, each class taking at most its
pages, all classes together at most the page budget; without `all_resident` an expert may have no
replica, at no NoP above the floor. Leases, quotas and every other page are left out: a relaxation,
so the least cost stays a lower bound. Solved as a min-cost flow (OR-Tools) on costs rounded down
to integers (a bound of the bound).
"""

from __future__ import annotations

import numpy as np
from ortools.graph.python.min_cost_flow import SimpleMinCostFlow

from comoe_opt.residency.problem import ResidencyProblem

COST_SCALE = 2.0**40  # the largest arc cost maps to this many integer units (rounded down)


def nop_excess_bound(problem: ResidencyProblem) -> float:
    """A lower bound (ms) of every feasible placement's nearest-replica NoP above `constant_ms`;
    0 when every chiplet has the least NoP, or no placement fits the flow."""
    nop = np.asarray(problem.nop_ms_per_token, dtype=np.float64)
    if nop.size == 0:
        return 0.0
    levels, klass = np.unique(nop, return_inverse=True)  # [K] NoP levels, [C] each chiplet's
    excess = problem.batches * problem.tokens.ravel()[:, None] * (levels - levels[0])[None, :]  # [LE, K]
    top = float(excess.max()) if excess.size else 0.0
    if levels.size == 1 or top <= 0:
        return 0.0
    scale = COST_SCALE / top
    cost = np.floor(excess * scale).astype(np.int64)
    pages = np.bincount(klass, weights=problem.capacity_pages, minlength=levels.size).astype(np.int64)
    units = excess.shape[0]
    flow = _network(cost, pages, problem.budget_pages, not problem.all_resident)
    flow.set_nodes_supplies(np.arange(units), np.ones(units, dtype=np.int64))
    flow.set_node_supply(units + levels.size + 2, -units)
    if flow.solve() != SimpleMinCostFlow.OPTIMAL:
        return 0.0  # no placement of every expert fits: the problem's own checks say why
    return flow.optimal_cost() / scale


def _network(cost: np.ndarray, pages: np.ndarray, budget: int, optional: bool) -> SimpleMinCostFlow:
    """Nodes: units 0..U−1, classes U..U+K−1, `placed` U+K, `none` U+K+1, sink U+K+2. Arcs:
    unit → class (cost, 1), class → placed (its pages), placed → sink (the budget), and with
    `optional` unit → none (0) → sink."""
    units, classes = cost.shape
    placed, none, sink = units + classes, units + classes + 1, units + classes + 2
    tails: list[np.ndarray] = [
        np.repeat(np.arange(units), classes),
        units + np.arange(classes),
        np.array([placed]),
    ]
    heads = [np.tile(units + np.arange(classes), units), np.full(classes, placed), np.array([sink])]
    caps = [np.ones(units * classes, dtype=np.int64), pages, np.array([max(budget, 0)])]
    costs = [cost.ravel(), np.zeros(classes, dtype=np.int64), np.zeros(1, dtype=np.int64)]
    if optional:
        tails += [np.arange(units), np.array([none])]
        heads += [np.full(units, none), np.array([sink])]
        caps += [np.ones(units, dtype=np.int64), np.array([units])]
        costs += [np.zeros(units, dtype=np.int64), np.zeros(1, dtype=np.int64)]
    flow = SimpleMinCostFlow()
    flow.add_arcs_with_capacity_and_unit_cost(
        np.concatenate(tails).astype(np.int32),
        np.concatenate(heads).astype(np.int32),
        np.concatenate(caps).astype(np.int64),
        np.concatenate(costs).astype(np.int64),
    )
    return flow
