"""Dantzig–Wolfe over chiplet contents (device_columns.py) never lies and sees who shares a chiplet.

Optima come from test_decompose's brute force over every placement of 2-layer instances. No test
has a time limit: the column generation and the level search end on counts."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from studies.device_columns import (
    content_bound,
    layer_data,
    level_bound,
    placement_columns,
    window_level_bound,
)
from test_decompose import optimum, scenario_problem, small_problems

from comoe_opt.residency.bounds.decompose import (
    Prices,
    class_lp_certificate,
    device_classes,
    lagrangian_value,
)
from comoe_opt.residency.bounds.group_bound import reduced_layer_values
from comoe_opt.residency.problem import ResidencyProblem
from comoe_opt.residency.solve import solve

TOL = 1e-6


def free(p: ResidencyProblem) -> Prices:
    return Prices(np.zeros(device_classes(p).count), 0.0, np.zeros(len(p.tenants)))


def three_pairs() -> ResidencyProblem:
    # three experts, one replica each, two chiplets of two pages: some pair shares a chiplet. Each
    # scenario makes one pair busy (4 + 4), so one placement for all three leaves one pair
    # together: (8 + 4 + 4) / 3 = 16 / 3, where each scenario alone (and the class model) gets 4
    work = [[[4, 4, 0]], [[4, 0, 4]], [[0, 4, 4]]]
    return scenario_problem(work, [2, 2], tokens=[[1, 1, 1]], nop=[0, 0], all_resident=True, max_replicas=1)


def test_a_cap_no_placement_meets_costs_the_artificial_columns():
    p = three_pairs()
    data = layer_data(p, device_classes(p), free(p), 0)
    tight = content_bound(data, np.array([4.0, 4.0, 4.0]))  # every pair apart in every scenario
    assert tight.converged and tight.bound > 16 / 3
    loose = content_bound(data, np.array([8.0, 4.0, 4.0]))  # a and b together: c alone
    assert loose.converged and loose.bound == pytest.approx(0.0, abs=1e-9)


def test_the_level_search_climbs_from_the_floors_to_the_sharing():
    p = three_pairs()
    assert optimum(p) == pytest.approx(16 / 3)
    values = [level_bound(p, free(p), 0, boxes=n).bound for n in (1, 5, 20)]
    assert values[0] == pytest.approx(4.0)  # the floors: the root box sees no sharing
    assert all(a <= b + 1e-12 for a, b in itertools.pairwise(values))
    assert values[-1] >= 5.0 - TOL and values[-1] <= 16 / 3 + TOL  # groups of one prove 4


def test_an_incumbent_limits_the_box_and_caps_the_bound():
    p = three_pairs()
    found = level_bound(p, free(p), 0, incumbent=16 / 3, boxes=20)
    assert 5.0 - TOL <= found.bound <= 16 / 3 + TOL


@settings(max_examples=8, deadline=None)
@given(small_problems(), st.sampled_from([1, 3]))
def test_level_bounds_stay_below_the_optimum(p, boxes):
    best = optimum(p)
    assume(np.isfinite(best))
    scale = max(1.0, abs(best))
    cert = class_lp_certificate(p)
    assert cert is not None
    for prices in (free(p), Prices.of_duals(cert.coupling_duals)):
        assert window_level_bound(p, prices, boxes=boxes, iterations=25) <= best + TOL * scale
    layers = lagrangian_value(p, prices)
    combined = window_level_bound(p, prices, layers.layer_bounds, boxes=boxes, iterations=25)
    assert layers.bound - TOL * scale <= combined <= best + TOL * scale


@settings(max_examples=10, deadline=None)
@given(small_problems(), st.integers(1, 3))
def test_a_column_generation_stopped_early_proves_no_more_than_at_convergence(p, rounds):
    data = layer_data(p, device_classes(p), free(p), 0)
    cap = p.scenario_work_ms[:, 0].max(axis=2).sum(axis=1)  # room for any placement
    early = content_bound(data, cap, iterations=rounds)
    full = content_bound(data, cap, iterations=500)
    assume(full.converged)
    assert early.bound <= full.master + TOL * max(1.0, abs(full.master))
    assert full.bound == pytest.approx(full.master, rel=1e-6, abs=1e-6)


@settings(max_examples=8, deadline=None)
@given(small_problems())
def test_a_placements_chiplets_are_columns_at_its_own_makespans(p):
    placement = solve(p, "milp", time_limit_s=math.inf).solution
    assume(placement is not None)
    classes, prices = device_classes(p), free(p)
    data = layer_data(p, classes, prices, 0)
    makespans, columns = placement_columns(p, classes, 0, placement.resident[0])
    own = reduced_layer_values(p, prices, placement)[0] - p.batches / p.scenarios * makespans.sum()
    found = content_bound(data, makespans * (1 + 1e-9), iterations=1, start=columns)
    scale = max(1.0, abs(own))
    assert found.master <= own + TOL * scale  # the placement is a point of the master
    assert found.bound <= found.master + TOL * scale
