"""Past a machine word: device sets of any size (best_split/sets.py), and every path that scores
a best split — the drop-in's `lp`, compare's routings, the slow loop's cut condition and search —
at 63, 64, 144 and 320 devices."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_problem
from hypothesis import given, settings
from hypothesis import strategies as st
from test_bounds import with_scenarios

import comoe_opt
from comoe_opt.best_split import sets as device_sets
from comoe_opt.best_split.cut_condition import CutTable, int_masks, layer_makespans, makespan_lp
from comoe_opt.best_split.pooled import base_pool
from comoe_opt.replay import serve
from comoe_opt.residency.objective import check_feasible, score
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.search.refine import refine

SIZES = [63, 64, 144, 320]


@st.composite
def memberships(draw):
    devices = draw(st.integers(1, 200))
    rng = np.random.default_rng(draw(st.integers(0, 2**20)))
    return rng.random((draw(st.integers(1, 6)), devices)) < draw(st.floats(0.05, 0.9))


@settings(max_examples=100)
@given(memberships(), st.integers(0, 2**20))
def test_device_sets_are_the_python_ints_bit_for_bit(member, seed):
    devices = member.shape[1]
    packed = device_sets.pack(member)
    ints = [sum(1 << int(c) for c in np.flatnonzero(row)) for row in member]
    assert packed.shape == (member.shape[0], device_sets.words(devices))
    assert device_sets.as_ints(packed) == ints
    assert np.array_equal(device_sets.from_ints(ints, packed.shape[1]), packed)
    assert np.array_equal(device_sets.unpack(packed, devices), member)
    assert device_sets.sizes(packed).tolist() == [bin(m).count("1") for m in ints]
    other = np.random.default_rng(seed).random((5, devices)) < 0.5
    pool = device_sets.pack(other)
    pool_ints = device_sets.as_ints(pool)
    expected = [[float(m & ~d == 0) for d in pool_ints] for m in ints]
    assert device_sets.inside(packed, pool).tolist() == expected
    merged = device_sets.union(pool, packed)
    assert device_sets.as_ints(merged) == sorted(set(pool_ints) | set(ints))


@pytest.mark.parametrize("devices", SIZES)
def test_the_base_pool_and_the_cut_table_hold_every_device(devices):
    pool = base_pool(devices)
    assert device_sets.as_ints(pool) == [1 << c for c in range(devices)] + [(1 << devices) - 1]
    table = CutTable.pool(pool[::-1], np.ones(devices))  # any order: all devices last
    assert device_sets.as_int(table.all_chiplets) == (1 << devices) - 1
    assert table.capacity.tolist() == [1.0] * devices + [float(devices)]


@pytest.mark.parametrize("devices", SIZES)
def test_the_slow_loops_cut_condition_is_the_share_lp_at_any_size(devices):
    rng = np.random.default_rng(devices)
    experts = 24
    resident = np.zeros((experts, devices), dtype=bool)
    resident[np.arange(experts), rng.integers(devices, size=experts)] = True
    resident[: experts // 2, devices - 1] = True  # half of them also on the last device (bit 62+)
    work = rng.gamma(0.6, 2.0, size=(3, experts))[..., None] * np.ones(devices)  # [S, E, C]
    spans = layer_makespans(work, resident)
    exact = [makespan_lp(w, resident) for w in work]
    assert spans == pytest.approx(exact, rel=1e-6)


@pytest.mark.parametrize("devices", SIZES)
def test_compare_routings_at_any_size(devices):
    """lp's peak is the best split's, flow's at most one token above it, both at most even's."""
    rng = np.random.default_rng(devices)
    experts = devices + 8
    slots = np.zeros((1, experts, devices), dtype=np.int64)
    slots[0, np.arange(experts), np.arange(experts) % devices] = 1
    slots[0, np.arange(8), devices - 1 - np.arange(8)] += 1  # 8 experts with a second replica
    counts = rng.poisson(3.0, size=(2, 1, experts))
    even, lp, flow = (serve(slots, counts, routing).peak for routing in ("even", "lp", "flow"))
    assert np.all(lp <= even + 1e-9) and np.all(flow <= lp + 1 + 1e-9) and np.all(lp <= flow + 1e-9)


@pytest.mark.parametrize("devices", SIZES)
def test_the_slow_loops_search_runs_past_62_devices(devices):
    """refine works on Python-int masks and packed sets: a hand-made layer whose only bottleneck
    is the last device (bit devices - 1) gets a replica off it."""
    experts = devices + 1
    capacity = [2] * devices  # one spare page on every device
    start = np.zeros((1, experts, devices), dtype=bool)
    start[0, np.arange(devices), np.arange(devices)] = True
    start[0, devices, devices - 1] = True  # two experts share the last device
    work = np.full((2, 1, experts, devices), 0.01)
    work[:, 0, devices, :] = 1.0  # the last expert is hot
    work[:, 0, devices - 1, :] = 1.0
    p = with_scenarios(make_problem(np.zeros((1, experts)), work.mean(axis=0), capacity), work, moves=400)
    before = score(p, Placement(start)).total
    after = refine(p, Placement(start))
    assert not check_feasible(p, after)
    assert score(p, after).total < before
    assert int_masks(after.resident[0])[devices] != 1 << (devices - 1)


@pytest.mark.parametrize("by_steps", [False, True], ids=["pooled cuts", "by steps"])
@pytest.mark.parametrize("devices", SIZES)
def test_the_drop_ins_lp_plans_past_62_gpus(devices, by_steps):
    from comoe_opt.balancers.dropin.config import SearchConfig

    rng = np.random.default_rng(devices)
    layers, experts = 2, devices * 2
    slots = experts + devices  # one spare slot per GPU
    steps = rng.poisson(rng.gamma(0.4, 20.0, size=(layers, experts)), size=(16, layers, experts)).astype(
        float
    )
    plan, _, logcnt, report = comoe_opt.rebalance_experts(
        steps.sum(axis=0), slots, 1, 1, devices, history=steps, dispatch="lp", moves=200, explain=True,
        config=SearchConfig(step_search_gpus=12 if by_steps else None),
    )  # fmt: skip
    assert plan.shape == (layers, slots) and (logcnt >= 1).all() and (logcnt.sum(axis=1) == slots).all()
    assert report.objective <= report.eplb_objective + 1e-9  # never worse, exactly, than its start


def test_the_lp_searchs_kept_pool_sums_are_the_fresh_ones_past_12_gpus():
    """Past the enumerable GPUs a move recomputes only its two experts' rows of the pool's
    membership and adds their change to the steps' sums: after a search that moved, every layer's
    sums equal (to float32 round-off) the ones built afresh from its plan."""
    from comoe_opt.balancers.dropin.config import Work
    from comoe_opt.balancers.dropin.lp_search import LpSearch
    from comoe_opt.balancers.dropin.objective import Shape, normalised
    from comoe_opt.balancers.eplb import deepseek_eplb
    from comoe_opt.best_split.cut_condition import inside, masks_of

    rng = np.random.default_rng(0)
    layers, experts, gpus = 2, 64, 16
    steps = rng.poisson(rng.gamma(0.4, 20.0, size=(layers, experts)), size=(12, layers, experts)).astype(
        float
    )
    start = deepseek_eplb(steps.sum(axis=0), experts + gpus, 1, 1, gpus)[0]
    w = normalised(steps.transpose(1, 0, 2), gpus)
    search = LpSearch(start, w, Shape(gpus, 1, "lp"), None, 0.0, np.random.default_rng(1), work=Work())
    search.run(lambda: False, iterations=40)
    assert search.objective.sum() < search.start_objective.sum()  # it moved
    for layer in range(layers):
        fresh = search.w[layer] @ inside(masks_of(search.n[layer] > 0), search.sets[layer], np.float32)
        assert np.allclose(search.in_sets[layer], fresh, rtol=1e-5, atol=1e-6)  # float32 sums
