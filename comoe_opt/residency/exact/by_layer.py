"""`milp` and `exact` layer by layer where the per-layer slots separate the window
(formulations/residency.md, "Layers the slots separate").

With `policy.layer_slots` every device holds at most that many replicas of a layer. When the
layers' slots together fit every chiplet's pages, the budget and each quota (`separable`: an
engine's map, whose memory is the slots), no limit couples two layers, and every term of the
objective is a sum over layers: the window's optimum is the sum of its layers' optima. Each layer
is then solved on its own (`layer_problem`: its slots are its chiplets' capacity), its bound a
bound of its part of the objective, and the window's bound the sum of theirs. The one-memory
models (exact/pipeline.py) instead let a layer take more than its slots on a chiplet, which the
layout undoes, so their bound is of that looser problem; and their searches move one layer's
replicas against the others' pages.

Step 1: check that the slots separate the layers (`separable`; `applies` adds where it pays).
Step 2: solve each layer by `milp` or `exact` on its share of the time left (on the window's work limits
without a time limit: the same plan on any machine).
Step 3: the window's plan is the layers' plans; its objective is scored on the window, its bound
the sum of the layers' bounds.
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np

from comoe_opt.best_split.cut_condition import enumerable
from comoe_opt.deadline import Deadline
from comoe_opt.residency.exact.pipeline import solve_milp, tidy_bound
from comoe_opt.residency.objective import score
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.problem import ResidencyProblem, layers_of
from comoe_opt.residency.report import LayerOutcome, LayersReport, ModelReport, ResidencyResult
from comoe_opt.residency.schedule import WorkLimits
from comoe_opt.results import SolveResult, Status, Timing, status_from_gap


def applies(problem: ResidencyProblem, seconds: float = math.inf) -> bool:
    """Whether `milp` and `exact` go layer by layer with `seconds` left (inf: on work limits): the slots
    separate the layers, the scenarios' makespans are enumerated cut ratios (at most
    `MAX_ENUMERATED_CHIPLETS` chiplets of related speeds), where each layer's own class model and
    annealing apply, and each layer gets at least `MIN_LAYER_S`. Past 12 chiplets (DeepSeek-V3
    EP32's 32) one layer at a time proved no more and took 2.7 times as long on work limits
    (formulations/residency.md, "Layers the slots separate")."""
    work = problem.scenario_work_ms
    if work is None or not enumerable(work) or seconds < MIN_LAYER_S * problem.layers:
        return False
    return separable(problem)


# seconds per layer below which the window's one pipeline plans better: GPT-OSS window 0 in 5 s
# (0.21 s a layer) 29.026 ms layer by layer against 28.835 whole, in 10 s (0.42 s) 28.612 against
# 28.803 (benchmarks/results/by-layer.md)
MIN_LAYER_S = 0.4


def separable(problem: ResidencyProblem) -> bool:
    """Whether the per-layer slots separate the layers: every chiplet's pages hold all layers'
    slots on it, and the budget and each tenant's quota all the pages the slots can hold."""
    slots = problem.layer_slots
    if not slots or problem.layers < 2:
        return False
    per_chiplet = np.minimum(slots, problem.capacity_pages)  # a layer's most pages on each chiplet
    if np.any(problem.layers * per_chiplet > problem.capacity_pages):
        return False
    layer_pages = _most_pages(problem, np.ones((problem.layers, problem.experts), dtype=bool))
    if layer_pages.sum() > problem.budget_pages:
        return False
    return all(_most_pages(problem, t.owns).sum() <= t.max_pages for t in problem.tenants)


def _most_pages(problem: ResidencyProblem, owns: np.ndarray) -> np.ndarray:
    """[L] the most pages the experts `owns` [L, E] can hold in each layer within the slots."""
    slots = int(np.minimum(problem.layer_slots, problem.capacity_pages).sum())
    copies = owns.sum(axis=1) * min(problem.max_replicas, problem.chiplets)
    return np.minimum(copies, slots)


def layer_problem(problem: ResidencyProblem, layer: int) -> ResidencyProblem:
    """Layer `layer` alone: its slots are each chiplet's capacity, the budget what they hold, each
    tenant's quota what its experts can hold there (`separable` says none binds)."""
    sub = layers_of(problem, np.array([layer]))
    capacity = np.minimum(problem.layer_slots, problem.capacity_pages).astype(np.int64)
    tenants = tuple(
        dataclasses.replace(t, max_pages=int(_most_pages(sub, t.owns).sum())) for t in sub.tenants
    )
    return dataclasses.replace(
        sub, capacity_pages=capacity, budget_pages=int(capacity.sum()), tenants=tenants
    )


def solve_by_layer(
    problem: ResidencyProblem, *, deadline: Deadline, mip_gap: float, exact: bool = True
) -> ResidencyResult:
    """`exact` (or `milp`) on each layer of a window the slots separate (`separable`); the
    window's plan, objective and bound (the layers' bounds summed)."""
    method = "exact" if exact else "milp"
    resident = np.zeros((problem.layers, problem.experts, problem.chiplets), dtype=bool)
    outcomes, bound, solver = [], 0.0, Status.FEASIBLE
    # on work limits each layer does what the window's solve would do for it (the longer searches'
    # proposals are the window's per layer, the polish the window's over its layers), so that the
    # window's work does not grow with its layers
    work = WorkLimits.of(problem).per_layer(problem.layers)
    for layer in range(problem.layers):
        # Step 2: an equal share of the time left (a layer that ends early leaves its rest to the others)
        share = deadline.share(1.0 / (problem.layers - layer))
        sub = layer_problem(problem, layer)
        result = solve_milp(sub, deadline=share, mip_gap=mip_gap, exact=exact, work=work)
        outcomes.append(_outcome(layer, result))
        if result.solution is None:
            return _without_plan(problem, deadline, tuple(outcomes), result.status, method)
        resident[layer] = result.solution.resident[0]
        bound += result.bound
        if result.status is Status.TIME_LIMIT:
            solver = Status.TIME_LIMIT
    # Step 3: the window's objective, scored on the window (the layers' objectives sum to it)
    placement = Placement(resident)
    terms = score(problem, placement)
    bound = tidy_bound(bound, terms.total)  # the layers' bounds summed in another order
    status = status_from_gap(solver, terms.total, bound, mip_gap, problem.constant_ms)
    report = LayersReport(terms=terms, timing=_timing(deadline), layers=tuple(outcomes))
    seconds = report.timing.total_s
    constant = problem.constant_ms
    return SolveResult(method, status, terms.total, bound, seconds, placement, constant, report=report)


def _timing(deadline: Deadline) -> Timing:
    """The deadline's timing with the layers' notes told once each: "longer searches: stopped by
    the time limit after 3-9 (24 layers)", not 24 lines."""
    timing = deadline.timing()
    return dataclasses.replace(timing, stopped_by_time_limit=summarized(timing.stopped_by_time_limit))


def summarized(notes: tuple[str, ...]) -> tuple[str, ...]:
    """`notes` with those that differ only in their numbers told once, each number as the range
    it took, and how many times the note was made; in the order first seen."""
    numbers: dict[str, list[list[str]]] = {}
    for note in notes:
        numbers.setdefault(_NUMBER.sub("{}", note.replace("{", "(").replace("}", ")")), []).append(
            _NUMBER.findall(note)
        )
    told = []
    for pattern, seen in numbers.items():
        ranges = [_range(values) for values in zip(*seen, strict=True)]
        times = f" ({len(seen)} layers)" if len(seen) > 1 else ""
        told.append(pattern.format(*ranges) + times)
    return tuple(told)


_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _range(values: tuple[str, ...]) -> str:
    low, high = min(values, key=float), max(values, key=float)
    return low if low == high else f"{low}-{high}"


def _outcome(layer: int, result: ResidencyResult) -> LayerOutcome:
    report = result.report
    source = report.placement_from if isinstance(report, ModelReport) else ""
    return LayerOutcome(layer, str(result.status), result.objective, result.bound, source)


def _without_plan(
    problem: ResidencyProblem,
    deadline: Deadline,
    outcomes: tuple[LayerOutcome, ...],
    status: Status,
    method: str,
) -> ResidencyResult:
    """A layer found no plan (out of time before its first heuristic): the window has none."""
    report = LayersReport(terms=None, timing=_timing(deadline), layers=outcomes)
    failed = status if not status.has_solution else Status.NO_SOLUTION
    return SolveResult(
        method, failed, math.inf, -math.inf, report.timing.total_s, None, problem.constant_ms, report=report
    )
