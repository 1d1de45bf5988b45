"""`milp` and `exact` layer by layer where the per-layer slots separate the layers
(residency/exact/by_layer.py): the window's bound is the sum of its layers' bounds, so it must stay
below the optimum within the slots (brute force), and the slots must truly separate the layers
before it is used."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
from conftest import make_problem
from hypothesis import given, settings
from hypothesis import strategies as st

from comoe_opt.residency.exact.by_layer import MIN_LAYER_S, applies, layer_problem, separable, summarized
from comoe_opt.residency.layer_slots import over_layer_slots
from comoe_opt.residency.objective import check_feasible, score
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.problem import ResidencyProblem, Tenant
from comoe_opt.residency.report import LayersReport, ModelReport
from comoe_opt.residency.schedule import POLISH_NODE_ROWS, POLISH_ROWS, WorkLimits
from comoe_opt.residency.solve import solve
from comoe_opt.results import Status

TOL = 1e-6


def brute_force_within_slots(p: ResidencyProblem) -> float:
    """The optimum over every replica map that keeps at most `layer_slots` of a layer per chiplet."""
    shape = (p.layers, p.experts, p.chiplets)
    best = math.inf
    for bits in itertools.product([False, True], repeat=math.prod(shape)):
        resident = np.array(bits, dtype=bool).reshape(shape)
        if (resident.sum(axis=1) > p.layer_slots).any():
            continue
        placement = Placement(resident)
        if not check_feasible(p, placement):
            best = min(best, score(p, placement).total)
    return best


@st.composite
def sliced_windows(draw):
    """Two layers of 2-3 experts on 2 chiplets, each chiplet's pages exactly two layers' slots;
    drawn loads, NoP, misses, a previous plan and copies, balance scenarios."""
    experts = draw(st.sampled_from([2, 3]))
    slots = draw(st.sampled_from([1, 2]))
    rng = np.random.default_rng(draw(st.integers(0, 2**20)))
    tokens = rng.integers(0, 6, (2, experts)).astype(float)
    read = rng.uniform(0.5, 2.0, 2)
    used = (tokens > 0).astype(float)
    previous = rng.random((2, experts, 2)) < 0.4
    previous &= np.cumsum(previous, axis=1) <= slots  # within the slots
    all_resident = bool(draw(st.booleans())) and 2 * slots >= experts
    p = make_problem(
        miss=rng.integers(0, 4, (2, experts)) * used,
        work=used[..., None] * read + tokens[..., None] * read * 0.2,
        capacity=[2 * slots, 2 * slots],
        tokens=tokens,
        nop=rng.random(2) * 0.2,
        copy_ms=float(draw(st.integers(0, 2))),
        previous=previous if draw(st.booleans()) else None,
        max_replicas=draw(st.integers(1, 2)),
        all_resident=all_resident,
        batches=draw(st.integers(1, 3)),
    )
    # balance scenarios on chiplets of related speeds: where `exact` goes layer by layer
    s_tokens = rng.integers(0, 6, (draw(st.integers(1, 3)), 2, experts)).astype(float)
    work = (s_tokens > 0)[..., None] * read + s_tokens[..., None] * read * 0.2
    p = dataclasses.replace(p, scenario_work_ms=work, work_ms=work.mean(axis=0), search_moves=20)
    return dataclasses.replace(p, layer_slots=slots)


@pytest.mark.parametrize("method", ["milp", "exact"])
@settings(max_examples=40, deadline=None)
@given(p=sliced_windows())
def test_the_layers_bounds_summed_bracket_the_optimum_within_the_slots(method, p):
    assert applies(p)
    optimum = brute_force_within_slots(p)
    scale = max(1.0, abs(optimum))
    result = solve(p, method, mip_gap=0.0)
    assert isinstance(result.report, LayersReport) and result.method == method
    assert result.bound <= optimum + TOL * scale
    assert result.objective >= optimum - TOL * scale
    assert result.solution is not None and not over_layer_slots(p, result.solution)
    assert not check_feasible(p, result.solution)
    if result.status is Status.OPTIMAL:
        assert result.objective <= optimum + TOL * scale
    # the window's figures are its layers': objectives and bounds summed
    layers = result.report.layers
    assert sum(o.objective for o in layers) == pytest.approx(result.objective, rel=1e-9, abs=1e-12)
    assert sum(o.bound for o in layers) == pytest.approx(result.bound, rel=1e-9, abs=1e-9)


def _window(slots: int = 2) -> ResidencyProblem:
    p = make_problem(miss=[[1.0, 2.0, 3.0]] * 3, work=[[1.0, 2.0, 3.0]] * 3, capacity=[3 * slots] * 2)
    return dataclasses.replace(p, layer_slots=slots)


def test_the_slots_separate_the_layers_only_where_no_limit_couples_them():
    p = _window()
    assert separable(p)
    assert not separable(dataclasses.replace(p, layer_slots=0))  # one memory for all layers
    assert not separable(dataclasses.replace(p, capacity_pages=np.array([6, 5])))  # a chiplet short of 3 x 2
    assert not separable(dataclasses.replace(p, budget_pages=11))  # all slots hold 12 pages
    owns = np.zeros((3, 3), dtype=bool)
    owns[:, 0] = True  # expert 0 of every layer: at most 2 copies each, 6 pages
    assert separable(dataclasses.replace(p, tenants=(Tenant("t", owns, 6),)))
    assert not separable(dataclasses.replace(p, tenants=(Tenant("t", owns, 5),)))
    assert not separable(dataclasses.replace(p, miss_ms=p.miss_ms[:1], work_ms=p.work_ms[:1],
                                             tokens=p.tokens[:1], peak_tokens=p.peak_tokens[:1]))  # fmt: skip


def test_a_layer_alone_has_its_slots_as_capacity_and_what_they_hold_as_budget():
    p = _window(slots=2)
    sub = layer_problem(p, 1)
    assert sub.layers == 1 and list(sub.capacity_pages) == [2, 2] and sub.budget_pages == 4
    assert (sub.work_ms[0] == p.work_ms[1]).all()


def test_a_window_the_slots_do_not_separate_is_solved_whole():
    work = np.repeat(_window().work_ms[None], 2, axis=0)  # two balance scenarios
    p = dataclasses.replace(_window(), scenario_work_ms=work, search_moves=10)
    assert applies(p) and isinstance(solve(p, "exact").report, LayersReport)
    assert isinstance(solve(p, "milp").report, LayersReport)
    assert isinstance(solve(dataclasses.replace(p, budget_pages=9), "exact").report, ModelReport)
    assert isinstance(solve(dataclasses.replace(p, budget_pages=9), "milp").report, ModelReport)
    assert not applies(dataclasses.replace(p, scenario_work_ms=None))  # no scenarios: one-memory pipeline
    # a time limit too short for every layer's pipeline: the window's one pipeline plans better
    enough = MIN_LAYER_S * p.layers
    assert applies(p, seconds=enough) and not applies(p, seconds=0.99 * enough)


def test_the_layers_notes_are_told_once_each_with_the_range_of_their_numbers():
    notes = (
        "longer searches: stopped by the time limit after 6",
        "cut rounds: stopped by their share of the time limit after 1 rounds",
        "longer searches: stopped by the time limit after 9",
        "longer searches: stopped by the time limit after 3",
        "lagrangian: skipped, 1.5 s left for 1 layers",
    )
    assert summarized(notes) == (
        "longer searches: stopped by the time limit after 3-9 (3 layers)",
        "cut rounds: stopped by their share of the time limit after 1 rounds",
        "lagrangian: skipped, 1.5 s left for 1 layers",
    )


def test_the_layers_polish_what_the_window_would_and_keep_their_other_limits():
    window = WorkLimits.of(_window())
    layer = window.per_layer(3)
    assert (layer.polish_rows, layer.polish_node_rows) == (POLISH_ROWS // 3, POLISH_NODE_ROWS // 3)
    polish = {"polish_rows": window.polish_rows, "polish_node_rows": window.polish_node_rows}
    restored = dataclasses.replace(layer, **polish)
    assert restored == window
