"""Bottleneck sets by parametric min cut: the same makespans as enumerating every chiplet set,
and the slow loop's cut model and search stay exact when they use them."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_bounds import brute_force, tiny_problems

import comoe_opt.best_split.cut_condition as scenarios
from comoe_opt.best_split import sets as device_sets
from comoe_opt.best_split.cut_condition import CutTable, masks_of
from comoe_opt.best_split.min_cut import bottlenecks
from comoe_opt.residency.heuristics import HEURISTICS
from comoe_opt.residency.models.cut_model import cut_model_applies
from comoe_opt.residency.objective import check_feasible, score
from comoe_opt.residency.search.refine import refine
from comoe_opt.residency.solve import solve


def test_a_hand_checked_bottleneck_on_sixteen_chiplets():
    resident = np.zeros((3, 16), dtype=bool)
    resident[0, [0, 1]] = True  # 10 units on two chiplets: 5 each
    resident[1, 2] = True  # 1 unit alone
    work = np.array([[10.0, 1.0, 0.0], [1.0, 1.0, 0.0]])  # second: nothing confined beyond the even split
    makespans, masks = bottlenecks(work, resident, np.ones(16))
    assert np.allclose(makespans, [5.0, 1.0])
    assert device_sets.as_int(masks[0]) == 0b11
    assert device_sets.as_int(masks[1]) in (
        0b100,
        0b11,
    )  # {2} holds 1 unit on 1 chiplet; {0,1} 1 unit... on 2


def test_an_expert_without_a_replica_only_counts_for_all_chiplets():
    resident = np.zeros((2, 14), dtype=bool)
    resident[1, 3] = True
    makespans, masks = bottlenecks(np.array([[28.0, 1.0]]), resident, np.ones(14))
    assert np.isclose(makespans[0], 29.0 / 14)
    assert device_sets.as_int(masks[0]) == (1 << 14) - 1


@st.composite
def replica_maps(draw):
    experts, chiplets = draw(st.integers(1, 10)), draw(st.integers(1, 7))
    rng = np.random.default_rng(draw(st.integers(0, 2**20)))
    resident = rng.random((experts, chiplets)) < draw(st.floats(0.1, 0.6))
    speeds = rng.choice([0.5, 1.0, 2.0, 3.0], chiplets)
    work = rng.gamma(0.7, 1.0, (3, experts)) * (rng.random((3, experts)) < 0.8)
    return work, resident, speeds


@settings(max_examples=200)
@given(replica_maps())
def test_min_cut_matches_enumerating_every_set(case):
    work, resident, speeds = case
    table = CutTable.for_speeds(speeds)
    ratios = (work @ table.inside(masks_of(resident))) / table.capacity
    makespans, masks = bottlenecks(work, resident, speeds)
    assert np.allclose(makespans, ratios.max(axis=1), rtol=1e-9)
    for s, mask in enumerate(masks):  # the set returned attains the makespan
        k = int(np.flatnonzero((table.sets == mask).all(axis=1))[0])
        assert np.isclose(ratios[s, k], makespans[s], rtol=1e-9)


@settings(max_examples=40)
@given(tiny_problems())
def test_exact_and_search_by_min_cut_stay_exact(p):
    """With set enumeration switched off, the cut model separates by min cut and still closes."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(scenarios, "MAX_ENUMERATED_CHIPLETS", 0)
        if cut_model_applies(p):
            _check_exact_and_search(p)


def _check_exact_and_search(p):
    optimum, _ = brute_force(p)
    exact = solve(p, "exact", mip_gap=0.0, time_limit_s=math.inf)  # work limits, not the clock
    scale = max(1.0, abs(optimum))
    assert exact.bound <= optimum + 1e-6 * scale
    assert exact.objective >= optimum - 1e-6 * scale
    assert exact.status.name == "OPTIMAL"
    for name in HEURISTICS:
        start = solve(p, name, time_limit_s=math.inf).solution
        if start is None:
            continue
        found = refine(p, start)
        assert not check_feasible(p, found)
        assert score(p, found).total <= score(p, start).total + 1e-9 * scale
