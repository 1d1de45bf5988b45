"""Exact minimum makespan by parametric max-flow and binary search (OR-Tools max-flow).

A makespan T is feasible iff a flow routes every selection to a queue slot
that completes by T: group nodes -> level nodes (as in the min-cost flow) ->
sink with, per level, as many slots as complete by T. Feasibility is
monotone in T and every quantity is an integer, so bisection between a lower
bound (infeasible below it) and a feasible makespan ends at the optimum,
with the proof `T* - 1` infeasible (formulations/mapping.md §5). This is an
independent check on the min-cost flow: it never prices anything.
"""

from __future__ import annotations

import time

import numpy as np
from ortools.graph.python.max_flow import SimpleMaxFlow

from comoe_opt.mapping.flow import OPEN, disaggregate, levels_makespan
from comoe_opt.mapping.makespan import mapping_result, no_mapping
from comoe_opt.mapping.network import LayerGraph, costs_graph, lower_bound
from comoe_opt.mapping.problem import MappingProblem
from comoe_opt.mapping.report import BisectionReport, MappingResult
from comoe_opt.results import Status


class _Oracle:
    """Max-flow feasibility of a makespan, on one network whose sink capacities change."""

    def __init__(self, graph: LayerGraph, demand: np.ndarray) -> None:
        self.graph, self.total = graph, int(demand.sum())
        self.source, lv = graph.sink + 1, graph.levels
        groups = np.arange(graph.groups, dtype=np.int32)
        from_source = np.full(graph.groups, self.source, np.int32)
        tails = np.concatenate((from_source, graph.static_tails, graph.level_nodes))
        heads = np.concatenate((groups, graph.static_heads, np.full(lv.size, graph.sink, np.int32)))
        caps = np.concatenate((demand, np.full(graph.static_tails.size + lv.size, OPEN))).astype(np.int64)
        self.solver = SimpleMaxFlow()
        arcs = self.solver.add_arcs_with_capacity(tails, heads, caps)
        self.group_arcs = arcs[graph.groups : graph.groups + graph.group_arcs].astype(np.int32)
        self.sink_arcs = arcs[-lv.size :].astype(np.int32) if lv.size else arcs[:0].astype(np.int32)
        self.solves = 0

    def route(self, makespan: int) -> np.ndarray | None:
        """Group-arc flows of a mapping finishing by `makespan`, or None if there is none."""
        lv = self.graph.levels
        last_slot = (makespan - lv.first_done) // lv.tau  # last slot completing by `makespan`
        caps = np.maximum(np.minimum(lv.last, last_slot) + 1 - lv.slot, 0)
        self.solver.set_arcs_capacity(self.sink_arcs, caps.astype(np.int64))
        status = self.solver.solve(self.source, self.graph.sink)
        self.solves += 1
        if status != SimpleMaxFlow.OPTIMAL:
            raise RuntimeError(f"OR-Tools max-flow failed: {status}")
        if self.solver.optimal_flow() < self.total:
            return None
        return self.solver.flows(self.group_arcs)


def solve_exact(problem: MappingProblem) -> MappingResult:
    """The minimum makespan and a mapping that attains it, proven by bisection."""
    began = time.perf_counter()
    graph = costs_graph(problem.costs)
    demand = np.bincount(graph.group_of[problem.experts.ravel()], minlength=graph.groups)
    if graph.stranded.size and demand[graph.stranded].any():
        return no_mapping("exact", Status.INFEASIBLE, problem, began)
    best = earliest_chiplet_flow(graph, demand)
    lo, hi = lower_bound(graph, demand) - 1, levels_makespan(graph, best)  # lo infeasible, hi feasible
    oracle = _Oracle(graph, demand)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        flow = oracle.route(mid)
        if flow is None:
            lo = mid
        else:
            best, hi = flow, levels_makespan(graph, flow)  # <= mid: jump to the flow's own makespan
    assignment = disaggregate(problem.experts.ravel(), graph, best).reshape(problem.experts.shape)
    report = BisectionReport(makespan_ticks=hi, tick_s=problem.costs.tick_s, max_flow_solves=oracle.solves)
    return mapping_result("exact", Status.OPTIMAL, problem, assignment, hi, hi, began, report)


def earliest_chiplet_flow(graph: LayerGraph, demand: np.ndarray) -> np.ndarray:
    """Group-arc flows sending each group's tokens to its earliest-starting chiplet (a feasible start)."""
    allowed = graph.slots >= 0
    done = np.where(allowed, graph.done_first + graph.slots * graph.tau, np.iinfo(np.int64).max)
    best = done.argmin(axis=1)
    tails = np.repeat(np.arange(graph.groups), allowed.sum(axis=1))
    chosen = graph.arc_chiplet == best[tails]
    return np.where(chosen, demand[tails], 0)
