"""Scenario-group bounds: each layer's scenarios split into groups, each group placed exactly.

At prices `Prices` (μ_k per page of class k, ν per page, ρ_t per page tenant t owns) on the
constraints that couple layers, the window objective relaxes into one problem per layer
(decompose.py, "Lagrangian over layers"):

    L(prices) = Σ_l min_x f_l(x) − Σ_k μ_k M_k − ν B − Σ_t ρ_t Q_t,
    f_l(x) = (W/S) Σ_s z*_ls(x) + h_l(x),

h_l the layer's NoP beyond the least, misses, copies and priced pages. With the scenarios split
into groups G (a partition of 1..S),

    f_l(x) = Σ_G f_lG(x),    f_lG(x) = (W/S) Σ_{s ∈ G} z*_ls(x) + (|G|/S) h_l(x),

and min_x f_l ≥ Σ_G min_x f_lG: every group's own best placement is a lower bound of its part
(Sandıkçı, Kong & Schaefer's hierarchy of bounds for stochastic integer programs; groups of one
scenario give the per-scenario optima, one group of all S the layer's optimum). Each group is a
real placement on chiplets, so it sees which experts share a chiplet — what the class model, being
symmetric over the chiplets of a class, cannot. `f_lG = (|G|/S) · g_lG` with g_lG the layer's
objective on the scenarios of G alone (W/|G| per scenario), a one-layer `ResidencyProblem`
solved by the exact cut model (cut_model.py) with the prices as a page cost: any proven dual bound of
it is valid, so a group stopped by its time limit still counts. A layer's bound is the larger of
the class model's layer value (`LagrangianValue.layer_bounds`) and its groups' sum, and the best
of `partitions` sampled partitions (each is a valid bound). See formulations/residency.md,
"Scenario-group bound".
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import numpy as np

from comoe_opt.best_split.cut_condition import int_masks
from comoe_opt.deadline import Deadline
from comoe_opt.residency.bounds.check_group_bound import GroupCertificate
from comoe_opt.residency.bounds.decompose import DeviceClasses, Prices, device_classes
from comoe_opt.residency.bounds.group_cpsat import solve_group_cpsat
from comoe_opt.residency.models.cut_model import solve_with_cuts
from comoe_opt.residency.objective import scenario_layer
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.problem import ResidencyProblem, Tenant
from comoe_opt.results import Status

GROUP_GAP = 1e-4  # relative gap at which a group's cut rounds stop (its bound is what counts)


@dataclass(frozen=True)
class GroupValue:
    """One group's proven lower bound of g_lG (its own objective, without `constant_ms`), and the
    best placement its rounds found (its objective, an upper side; None without one)."""

    layer: int
    scenarios: tuple[int, ...]
    bound: float
    closed: bool
    witness: list[int] | None  # [E] replica sets as Python-int bit masks
    witness_value: float


@dataclass(frozen=True)
class GroupBound:
    """L(prices) with each layer's value the larger of its class value and its groups' sum."""

    bound: float  # with problem.constant_ms
    prices: Prices
    classes_of: np.ndarray  # [C] the chiplet classes the prices are per
    layer_values: np.ndarray  # [L] the value each layer contributes
    class_values: np.ndarray  # [L] the class model's layer values it started from
    groups: dict[int, list[GroupValue]]  # the partition kept for each layer whose groups won
    group_size: int
    solver: str
    seconds: float

    closed_groups: int = 0  # group solves that closed (kept or not)

    @property
    def layers_lifted(self) -> int:
        return len(self.groups)

    def certificate(self, problem: ResidencyProblem) -> GroupCertificate:
        """What check_group_bound.py recomputes the bound from."""
        groups = [
            [{"scenarios": list(g.scenarios), "bound": g.bound, "closed": g.closed,
              "witness": [int(m) for m in _witness(g)]} for g in self.groups.get(layer, [])]
            for layer in range(problem.layers)
        ]  # fmt: skip
        return GroupCertificate(
            bound=self.bound,
            constant_ms=problem.constant_ms,
            class_pages=[float(v) for v in self.prices.class_pages],
            budget=float(self.prices.budget),
            quota=[float(v) for v in self.prices.quota],
            classes_of=[int(k) for k in self.classes_of],
            class_values=[float(v) for v in self.class_values],
            groups=groups,
            group_size=self.group_size,
            solver=self.solver,
            seconds={"groups": self.seconds},
        )


def scenario_groups(scenarios: int, size: int, seed: int) -> list[np.ndarray]:
    """The scenarios 0..S−1 in a seeded random order, cut into groups of `size` (the last may be
    smaller)."""
    order = np.random.default_rng(seed).permutation(scenarios)
    return [np.sort(order[i : i + size]) for i in range(0, scenarios, size)]


def _witness(group: GroupValue) -> list[int]:
    if group.witness is None:  # groups are kept only with a witness (group_bound)
        raise ValueError("a kept group has its witness")
    return group.witness


def layer_problem(problem: ResidencyProblem, layer: int, scenarios: np.ndarray) -> ResidencyProblem:
    """Layer `layer` alone, on the given scenarios: every constraint that holds for one layer's
    part of a placement (each chiplet's capacity, the budget, a tenant's quota) kept."""

    def one(a: np.ndarray) -> np.ndarray:
        return a[[layer]]

    previous = None if problem.previous is None else Placement(problem.previous.resident[[layer]])
    tenants = tuple(Tenant(t.name, t.owns[[layer]], t.max_pages) for t in problem.tenants)
    tokens = problem.scenario_tokens
    return dataclasses.replace(
        problem,
        miss_ms=one(problem.miss_ms),
        work_ms=one(problem.work_ms),
        tokens=one(problem.tokens),
        peak_tokens=one(problem.peak_tokens),
        previous=previous,
        leased=None if problem.leased is None else one(problem.leased),
        tenants=tenants,
        scenario_work_ms=problem.scenario_work[np.asarray(scenarios)][:, [layer]],
        scenario_tokens=None if tokens is None else tokens[np.asarray(scenarios)][:, [layer]],
        load_counts=None,
        step_counts=None,
    )


def page_prices(problem: ResidencyProblem, classes: DeviceClasses, prices: Prices, layer: int) -> np.ndarray:
    """The price [E, C] of one page of (layer, e) on chiplet c: its class's, the budget's and the
    quotas of the tenants that own it."""
    per_chiplet = prices.class_pages[classes.of] + prices.budget  # [C]
    owned = np.zeros(problem.experts)
    for t, rho in zip(problem.tenants, prices.quota, strict=True):
        owned += rho * t.owns[layer]
    return owned[:, None] + per_chiplet[None, :]


SOLVERS = ("cuts", "cpsat")  # the exact cut model by HiGHS (cut_model.py), or CP-SAT (group_cpsat.py)


def group_value(
    problem: ResidencyProblem,
    classes: DeviceClasses,
    prices: Prices,
    layer: int,
    scenarios: np.ndarray,
    time_limit_s: float | None = None,
    solver: str = "cuts",
    deadline: Deadline | None = None,
) -> GroupValue:
    """g_lG's proven bound on the group's one-layer problem within `time_limit_s` or `deadline`
    (neither: to optimality, within `GROUP_GAP` for the cut model, or its work limits)."""
    sub = layer_problem(problem, layer, scenarios)
    cost = page_prices(problem, classes, prices, layer)
    key = tuple(int(s) for s in scenarios)
    if deadline is not None:
        time_limit_s = deadline.remaining()
    if solver == "cpsat":
        found = solve_group_cpsat(sub, cost, time_limit_s=time_limit_s)
        witness = None if found.resident is None else int_masks(found.resident)
        return GroupValue(layer, key, found.bound, found.closed, witness, found.value)
    if solver != "cuts":
        raise ValueError(f"group solver {solver!r}: one of {', '.join(SOLVERS)}")
    if deadline is None:
        deadline = Deadline(math.inf if time_limit_s is None else time_limit_s)
    outcome = solve_with_cuts(sub, None, deadline=deadline, mip_gap=GROUP_GAP, page_cost_ms=cost[None])
    bound = outcome.bound - sub.constant_ms
    witness = None if outcome.placement is None else int_masks(outcome.placement.resident[0])
    value = outcome.objective - sub.constant_ms
    closed = outcome.status is Status.OPTIMAL
    return GroupValue(layer, key, float(bound), closed, witness, float(value))


def group_bound(
    problem: ResidencyProblem,
    prices: Prices,
    class_values: np.ndarray,
    *,
    group_size: int,
    partitions: int = 1,
    layers: list[int] | None = None,
    deadline: Deadline | None = None,
    solver: str = "cuts",
) -> GroupBound:
    """L(prices) with each layer's value the larger of `class_values[l]` (a proven bound of the
    layer's priced problem, e.g. `LagrangianValue.layer_bounds`) and the best of `partitions`
    sampled partitions into groups of `group_size`, each group bounded by `group_value`.

    `layers` (default all) are tried in the order given; with a `deadline` each group gets an equal
    part of the time left, and the layers not reached keep their class value."""
    clock = time.perf_counter if deadline is None else deadline.clock
    began = clock()
    classes = device_classes(problem)
    S = problem.scenarios
    values = np.array(class_values, dtype=np.float64).copy()
    order = list(range(problem.layers)) if layers is None else list(layers)
    kept: dict[int, list[GroupValue]] = {}
    solves_left = len(order) * partitions * math.ceil(S / group_size)
    closed = 0
    for layer in order:
        for seed in range(partitions):
            if deadline is not None and deadline.expired():
                break
            found = []
            for group in scenario_groups(S, group_size, seed):
                part = None if deadline is None else Deadline(deadline.remaining() / solves_left, clock)
                solves_left -= 1
                found.append(
                    group_value(problem, classes, prices, layer, group, solver=solver, deadline=part)
                )
            total = sum(len(g.scenarios) / S * g.bound for g in found)
            closed += sum(g.closed for g in found)
            # a group without a placement cannot be checked against one (check_group_bound.py)
            if total > values[layer] and all(g.witness is not None for g in found):
                values[layer], kept[layer] = total, found
    bound = float(values.sum()) - prices.constant(problem, classes) + problem.constant_ms
    return GroupBound(bound, prices, classes.of, values, np.asarray(class_values, dtype=np.float64), kept,
                      group_size, solver, clock() - began, closed)  # fmt: skip


def reduced_layer_values(problem: ResidencyProblem, prices: Prices, placement: Placement) -> np.ndarray:
    """[L] each layer's priced objective f_l at `placement` (its part of the incumbent at the prices,
    without `constant_ms`): what a layer's bound can at most reach there."""
    classes = device_classes(problem)
    W, least = problem.batches, float(problem.nop_ms_per_token.min())
    previous = problem.previous.resident if problem.previous is not None else None
    values = np.zeros(problem.layers)
    for layer in range(problem.layers):
        resident = placement.resident[layer]
        z, nop, _ = scenario_layer(problem, resident, layer)
        held = resident.any(axis=1)
        new = resident if previous is None else resident & ~previous[layer]
        misses = problem.miss_ms[layer][~held].sum()
        pages = float((page_prices(problem, classes, prices, layer) * resident).sum())
        nop_beyond = nop - least * problem.tokens[layer].sum()
        values[layer] = W * (z + nop_beyond + misses) + problem.copy_ms * new.sum() + pages
    return values


def pipeline_group_bound(
    problem: ResidencyProblem,
    prices: Prices,
    class_values: np.ndarray,
    placement: Placement,
    deadline: Deadline,
    solver: str = "cuts",
) -> GroupBound:
    """`solve_milp`'s step: the layers in order of their share of the gap at `placement` (its
    reduced value less the class value), each with an equal part of the time to `stop_at`, tried
    with groups of S, S/2 and S/4 scenarios (one group of all is the layer's own optimum at the
    prices; smaller groups close sooner but prove less), the best kept. It stops at the first layer
    where no group closed and nothing was lifted: the layers after it have less gap to show, and
    their groups are no smaller (on GPT-OSS window 0 none closes in seconds, and the time goes back
    to the search)."""
    clock = deadline.clock
    began = clock()
    gaps = reduced_layer_values(problem, prices, placement) - np.asarray(class_values)
    order = [int(layer) for layer in np.argsort(-gaps, kind="stable") if gaps[layer] > 0]
    S = problem.scenarios
    sizes = sorted({max(1, math.ceil(S / d)) for d in (1, 2, 4)}, reverse=True)
    values = np.array(class_values, dtype=np.float64)
    groups: dict[int, list[GroupValue]] = {}
    result = None
    for i, layer in enumerate(order):
        layer_time = Deadline(deadline.remaining() / (len(order) - i), clock)
        closed = False
        for j, size in enumerate(sizes):
            if deadline.expired():
                break
            size_time = Deadline(layer_time.remaining() / (len(sizes) - j), clock)
            result = group_bound(problem, prices, values, group_size=size, layers=[layer], deadline=size_time,
                                 solver=solver)  # fmt: skip
            values = result.layer_values
            groups.update(result.groups)
            closed |= result.closed_groups > 0
        if not closed and layer not in groups:
            break  # the layer with the largest gap gained nothing: its groups are too hard in this time
    classes = device_classes(problem)
    bound = float(values.sum()) - prices.constant(problem, classes) + problem.constant_ms
    start = np.asarray(class_values, dtype=np.float64)
    return GroupBound(bound, prices, classes.of, values, start, groups, sizes[0], solver,
                      clock() - began)  # fmt: skip
