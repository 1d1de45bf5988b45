"""Token-to-replica mapping as a min-cost flow (OR-Tools), aggregated by expert group.

Network (formulations/mapping.md §3): group nodes (supply = selections of the
group's experts) -> level nodes of the chiplets that can serve them -> sink,
through one arc per queue slot whose unit cost increases with the slot's
completion time: a convex queue cost whose minimum-cost flow also has the
minimum makespan (§4). Slots that finish by a lower bound on the makespan
cost nothing and are merged into one arc per level; slots past a window
above the bound are merged into one expensive overflow arc per chiplet, and
the window grows if the optimal flow uses one.

The arcs depend on the micro-batch only through (lower bound, window); the
lower bound is snapped down to a slot completion time, so micro-batches of a
layer keep meeting the same arc sets, which are cached on the layer's graph.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from ortools.graph.python.min_cost_flow import SimpleMinCostFlow

from comoe_opt.mapping.makespan import mapping_result, no_mapping
from comoe_opt.mapping.network import LayerGraph, costs_graph, lower_bound, per_token_graph
from comoe_opt.mapping.problem import MappingProblem
from comoe_opt.mapping.report import FlowReport, MappingResult
from comoe_opt.results import Status

_STATUS = {
    SimpleMinCostFlow.OPTIMAL: Status.OPTIMAL,
    SimpleMinCostFlow.FEASIBLE: Status.FEASIBLE,
    SimpleMinCostFlow.INFEASIBLE: Status.INFEASIBLE,
    SimpleMinCostFlow.UNBALANCED: Status.INFEASIBLE,
    SimpleMinCostFlow.NOT_SOLVED: Status.ERROR,
    SimpleMinCostFlow.BAD_RESULT: Status.ERROR,
    SimpleMinCostFlow.BAD_COST_RANGE: Status.ERROR,
    SimpleMinCostFlow.BAD_CAPACITY_RANGE: Status.ERROR,
}
OPEN = 1 << 31  # capacity of arcs without a limit: more than any micro-batch's selections
CACHE_LIMIT = 4096  # arc sets kept per layer


@dataclass(frozen=True, eq=False)
class SlotArcs:
    """Every arc of one layer's network for one (lower bound, window), in OR-Tools' array form."""

    tails: np.ndarray  # int32
    heads: np.ndarray  # int32
    capacities: np.ndarray  # int64
    unit_costs: np.ndarray  # int64: 0, the rank of a priced slot's completion time, or overflow
    overflow: int  # the last `overflow` arcs are the overflow arcs


@dataclass(frozen=True, eq=False)
class FlowNetwork:
    """One min-cost-flow instance: the arcs, the supplies, and what the arcs were built from."""

    arcs: SlotArcs
    supplies: np.ndarray  # [nodes] int64: group demands, 0 for levels, -total at the sink
    group_arcs: int  # arcs 0..group_arcs-1 go from group nodes to level nodes
    lower: int  # makespan lower bound (ticks); slots finishing by it cost 0
    window: int  # ticks above `lower` priced slot by slot


def build_network(graph: LayerGraph, demand: np.ndarray, lower: int, window: int) -> FlowNetwork:
    """The flow network of one micro-batch (arcs from the layer's cache)."""
    supplies = np.zeros(graph.sink + 1, dtype=np.int64)
    supplies[: graph.groups] = demand
    supplies[-1] = -int(demand.sum())
    return FlowNetwork(slot_arcs(graph, lower, window), supplies, graph.group_arcs, lower, window)


def slot_arcs(graph: LayerGraph, lower: int, window: int) -> SlotArcs:
    """The arcs for (lower, window), built once per layer and pair."""
    key = (lower, window)
    arcs = graph.cache.get(key)
    if arcs is None:
        if len(graph.cache) >= CACHE_LIMIT:
            graph.cache.clear()
        arcs = graph.cache[key] = _build_arcs(graph, lower, window)
    return arcs


def _build_arcs(graph: LayerGraph, lower: int, window: int) -> SlotArcs:
    """Static arcs, one free arc per level, unit arcs for priced slots, one overflow arc per chiplet.

    Unit costs of the priced slots are the ranks of their completion times:
    any strictly increasing function of completion time keeps §4's argument,
    and small costs make OR-Tools' cost scaling about twice as fast.
    """
    lv = graph.levels
    last_lb = (lower - lv.first_done) // lv.tau  # per level: last slot finishing by `lower`
    last_ub = (lower + window - lv.first_done) // lv.tau  # ... by `lower + window`
    free_cap = np.maximum(np.minimum(lv.last, last_lb) + 1 - lv.slot, 0)
    low = np.maximum(lv.slot, last_lb + 1)
    count = np.maximum(np.minimum(lv.last, last_ub) + 1 - low, 0)
    win_level = np.repeat(np.arange(lv.size, dtype=np.int32), count)
    n_win = win_level.size
    win_slot = np.arange(n_win) + (low + count - np.cumsum(count))[win_level]
    rank = np.empty(n_win, dtype=np.int64)
    rank[np.argsort(lv.first_done[win_level] + win_slot * lv.tau[win_level])] = np.arange(1, n_win + 1)
    n_static, n_free = graph.static_tails.size, lv.size
    tails = np.concatenate((graph.static_tails, graph.level_nodes, win_level + graph.groups, lv.last_node))
    heads = np.full(tails.size, graph.sink, dtype=np.int32)
    heads[:n_static] = graph.static_heads
    capacities = np.full(tails.size, OPEN, dtype=np.int64)
    capacities[n_static : n_static + n_free] = free_cap
    capacities[n_static + n_free : n_static + n_free + n_win] = 1
    unit_costs = np.zeros(tails.size, dtype=np.int64)
    unit_costs[n_static + n_free : n_static + n_free + n_win] = rank
    unit_costs[n_static + n_free + n_win :] = n_win + 1  # above every priced slot
    return SlotArcs(tails, heads, capacities, unit_costs, lv.last_node.size)


def solve_network(net: FlowNetwork) -> tuple[Status, np.ndarray, int]:
    """Solve with OR-Tools; (status, flow on every arc, total cost)."""
    arcs = net.arcs
    solver = SimpleMinCostFlow()
    solver.add_arcs_with_capacity_and_unit_cost(arcs.tails, arcs.heads, arcs.capacities, arcs.unit_costs)
    solver.set_nodes_supplies(np.arange(net.supplies.size, dtype=np.int32), net.supplies)
    status = _STATUS.get(solver.solve(), Status.ERROR)
    if status is not Status.OPTIMAL:  # reading flows of an unsolved network is undefined
        return status, np.zeros(0, np.int64), 0
    flows = solver.flows(np.arange(arcs.tails.size, dtype=np.int32))
    return status, flows, solver.optimal_cost()


def solve_min_cost_flow(problem: MappingProblem) -> MappingResult:
    """Map every selection to a chiplet by min-cost flow, aggregated by expert group.

    The flow's makespan is the minimum one (formulations/mapping.md §4).
    """
    return _solve(problem, costs_graph(problem.costs), problem.experts.ravel(), "min-cost-flow")


def solve_min_cost_flow_per_token(problem: MappingProblem) -> MappingResult:
    """The same flow with one supply node per selection (for measuring what aggregation saves)."""
    began = time.perf_counter()
    graph = per_token_graph(problem.costs, problem.experts)
    return _solve(problem, graph, np.arange(problem.selections), "min-cost-flow-per-token", began)


def _solve(
    problem: MappingProblem, graph: LayerGraph, rows: np.ndarray, method: str, began: float | None = None
) -> MappingResult:
    began = time.perf_counter() if began is None else began
    demand = np.bincount(graph.group_of[rows], minlength=graph.groups)
    if graph.stranded.size and demand[graph.stranded].any():  # an expert no chiplet can serve
        return no_mapping(method, Status.INFEASIBLE, problem, began)
    layer = costs_graph(problem.costs)
    layer_demand = demand
    if graph is not layer:  # the per-token graph: bound with the layer's groups
        layer_demand = np.bincount(layer.group_of[problem.experts.ravel()], minlength=layer.groups)
    lower = lower_bound(layer, layer_demand)
    window, rounds = graph.window, 0
    while True:
        rounds += 1
        net = build_network(graph, demand, lower, window)
        status, flows, cost = solve_network(net)
        if status is not Status.OPTIMAL:
            return no_mapping(method, status, problem, began)
        group_flow = flows[: net.group_arcs]
        span = levels_makespan(graph, group_flow)
        if not flows[flows.size - net.arcs.overflow :].any():
            break
        # the optimum may lie past the window; this flow's makespan bounds it: price every slot up to it
        window = span - lower
    assignment = disaggregate(rows, graph, group_flow).reshape(problem.experts.shape)
    report = FlowReport(
        makespan_ticks=span,
        tick_s=problem.costs.tick_s,
        flow_cost=int(cost),
        lower_bound_ticks=int(lower),
        rounds=rounds,
        arcs=int(net.arcs.tails.size),
    )
    return mapping_result(method, Status.OPTIMAL, problem, assignment, span, span, began, report)


def disaggregate(rows: np.ndarray, graph: LayerGraph, group_flow: np.ndarray) -> np.ndarray:
    """Chiplet of every selection (`rows`: its row of the graph) meeting each group's flows exactly.

    Selections sorted by (group, expert) take the group's arcs in (group,
    chiplet) order, so each chiplet gets a contiguous run of one group's
    experts (few distinct pages per chiplet).
    """
    chiplet_run = np.repeat(graph.arc_chiplet, group_flow)
    order = np.argsort(graph.sort_key[rows], kind="stable")
    assignment = np.empty(rows.size, dtype=np.int16)
    assignment[order] = chiplet_run
    return assignment


def levels_makespan(graph: LayerGraph, group_flow: np.ndarray) -> int:
    """Makespan in ticks from the flow on the group arcs (Jackson's rule per chiplet, by level)."""
    lv = graph.levels
    count = np.bincount(graph.arc_level, weights=group_flow, minlength=lv.size + 1)
    suffix = np.cumsum(count[::-1])[::-1]  # tokens at this level or later, over all chiplets
    within = (suffix[:-1] - suffix[lv.end]).astype(np.int64)  # ... on this level's chiplet
    finish = lv.first_done + lv.tau * (lv.slot + within - 1)
    return int(finish[within > 0].max(initial=0))
