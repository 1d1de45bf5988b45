"""The class bound and its Lagrangian over layers never lie, and the prices reproduce the bound.

Tiny instances (2 layers, 2-3 chiplets, 2-4 experts) are solved by brute force: every replica map
of each layer is scored on its own, and the layers are joined under the constraints that couple
them (chiplet capacity, budget, quotas), which is every placement of the window.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from conftest import make_problem
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from studies.class_decomposition import decompose, place_counts
from test_bounds import brute_force, with_scenarios

from comoe_opt.best_split import sets as device_sets
from comoe_opt.best_split.cut_condition import CutTable, masks_of, related_speeds, resident_of
from comoe_opt.errors import ComoeError
from comoe_opt.residency.bounds.decompose import (
    CutFamilies,
    Prices,
    class_lp_bound,
    device_classes,
    lagrangian_value,
)
from comoe_opt.residency.objective import check_feasible, scenario_layer, score
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.problem import ResidencyProblem, Tenant
from comoe_opt.residency.search.anneal import anneal
from comoe_opt.residency.solve import solve

TOL = 1e-6
NO_CLOCK = None  # no time limit: every step of `decompose` ends on its work


def run(p: ResidencyProblem, **options):
    """`decompose` without a clock, with a short annealing (tests stay fast)."""
    options.setdefault("anneal_proposals", 200)
    return decompose(p, NO_CLOCK, **options)


def layer_table(p: ResidencyProblem, layer: int) -> dict[tuple, float]:
    """Best value of the layer per (pages per chiplet, pages per tenant), over every replica map
    that satisfies the layer's own constraints (replica limit, all_resident, leases); makespans by
    the cut enumeration (best_split/cut_condition.py), checked against `score` on a sample."""
    E, C = p.experts, p.chiplets
    prev = p.previous.resident[layer] if p.previous is not None else np.zeros((E, C), dtype=bool)
    maps = ((np.arange(1 << (E * C))[:, None] >> np.arange(E * C)) & 1).astype(bool).reshape(-1, E, C)
    keep = maps.sum(axis=2).max(axis=1) <= p.max_replicas
    if p.all_resident:
        keep &= maps.any(axis=2).all(axis=1)
    if p.leased is not None:
        keep &= ~(p.leased[layer] & ~maps).any(axis=(1, 2))
    maps = maps[keep]
    work = p.scenario_work_ms[:, layer]  # [S, E, C]
    table_ = CutTable.for_speeds(related_speeds(work))
    masks = masks_of(maps)  # [M, E, W]
    inside = np.stack([table_.inside(m) for m in masks])  # [M, E, sets]
    z = (np.einsum("se,mek->msk", work[..., 0], inside) / table_.capacity).max(axis=2).mean(axis=1)
    nop = np.where(maps, p.nop_ms_per_token, np.inf).min(axis=2)
    nop = np.where(np.isfinite(nop), nop, p.nop_ms_per_token.min())
    miss = (p.miss_ms[layer] * ~maps.any(axis=2)).sum(axis=1)
    values = p.batches * (z + (nop * p.tokens[layer]).sum(axis=1) + miss)
    values += p.copy_ms * (maps & ~prev).sum(axis=(1, 2))
    for m in range(0, len(maps), max(1, len(maps) // 3)):  # the enumeration is the objective
        z_m, nop_m, _ = scenario_layer(p, maps[m], layer)
        assert p.batches * (z_m + nop_m) == pytest.approx(values[m] - p.batches * miss[m]
                                                          - p.copy_ms * (maps[m] & ~prev).sum())  # fmt: skip
    table: dict[tuple, float] = {}
    for resident, value in zip(maps, values, strict=True):
        key = (tuple(resident.sum(axis=0)), tuple(int(resident[t.owns[layer]].sum()) for t in p.tenants))
        table[key] = min(table.get(key, np.inf), float(value))
    return table


def optimum(p: ResidencyProblem) -> float:
    """Brute force over the layers' tables joined under the coupling constraints."""
    best = {((0,) * p.chiplets, (0,) * len(p.tenants)): 0.0}
    for layer in range(p.layers):
        joined: dict[tuple, float] = {}
        for (pages, owned), value in best.items():
            for (more, more_owned), extra in layer_table(p, layer).items():
                key = (tuple(np.add(pages, more)), tuple(np.add(owned, more_owned)))
                if np.any(np.array(key[0]) > p.capacity_pages) or sum(key[0]) > p.budget_pages:
                    continue
                if any(o > t.max_pages for o, t in zip(key[1], p.tenants, strict=True)):
                    continue
                joined[key] = min(joined.get(key, np.inf), value + extra)
        best = joined
    return min(best.values(), default=np.inf)


def scenario_problem(work, capacity, *, tokens, nop, **kwargs) -> ResidencyProblem:
    """Scenario work [S, L, E] (the same on every chiplet) on chiplets with the given NoP."""
    work = np.asarray(work, dtype=float)
    per_chiplet = np.repeat(work[..., None], len(capacity), axis=-1)
    layers, experts = work.shape[1:]
    kwargs.setdefault("miss", np.zeros((layers, experts)))
    p = make_problem(work=work.mean(axis=0), capacity=capacity, tokens=tokens, nop=nop, **kwargs)
    return with_scenarios(p, per_chiplet)


# ------------------------------------------------------------ hand-checked


def test_the_brute_force_join_is_every_placement():
    p = scenario_problem([[[3, 1], [2, 2]], [[0, 4], [1, 0]]], [2, 1], tokens=[[3, 1], [2, 2]], nop=[0, 1])
    assert optimum(p) == pytest.approx(brute_force(p)[0])


def test_the_class_bound_sees_which_expert_gets_the_near_chiplet():
    # a (3 tokens) and b (1 token), one page each on a near (NoP 0) and a far (NoP 1) chiplet:
    # a near, b far costs makespan 3 + NoP 1 = 4. The replica counts see only the makespan (3).
    p = scenario_problem([[[3, 1]]], [1, 1], tokens=[[3, 1]], nop=[0, 1], all_resident=True)
    assert optimum(p) == pytest.approx(4.0)
    assert solve(p, "lp", time_limit_s=math.inf).bound == pytest.approx(3.0)
    r = run(p)
    assert r.root_bound == pytest.approx(4.0) and r.bound == pytest.approx(4.0)
    assert r.lagrangian_bound == pytest.approx(4.0)
    assert r.objective == pytest.approx(4.0) and r.placement.resident[0, 0, 0]


def test_exact_takes_the_class_lp_bound():
    p = scenario_problem([[[3, 1]]], [1, 1], tokens=[[3, 1]], nop=[0, 1], all_resident=True)
    assert class_lp_bound(p) == pytest.approx(4.0)  # the optimum; the replica counts prove 3
    assert class_lp_bound(make_problem(miss=[[1.0]], work=[[1.0]], capacity=[1, 1])) is None
    exact = solve(p, "exact", mip_gap=0.0, time_limit_s=math.inf)
    assert exact.bound == pytest.approx(4.0) and exact.objective == pytest.approx(4.0)


def test_rigid_experts_must_share_a_chiplet():
    # three equal experts, one replica each, two chiplets: two share one (makespan 8, not 6)
    p = scenario_problem([[[4, 4, 4]]], [2, 2], tokens=[[1, 1, 1]], nop=[0, 0], all_resident=True,
                         max_replicas=1)  # fmt: skip
    assert optimum(p) == pytest.approx(8.0)
    assert run(p, cuts=CutFamilies(union=False, rigid=False)).bound == pytest.approx(6.0)
    assert run(p).bound == pytest.approx(8.0)


def test_chiplets_are_grouped_by_speed_and_nop():
    p = scenario_problem([[[1, 2]]], [1, 2, 1, 1], tokens=[[1, 1]], nop=[1, 1, 2, 2])
    classes = device_classes(p)
    assert classes.of.tolist() == [0, 0, 1, 1]
    assert classes.capacity.tolist() == [3, 2] and classes.size.tolist() == [2, 2]
    assert classes.types().tolist() == [1, 2, 3]


def test_no_scenarios_and_negative_prices_are_refused():
    p = make_problem(miss=[[1.0]], work=[[1.0]], capacity=[1, 1])
    with pytest.raises(ComoeError, match="balance scenarios"):
        decompose(p)
    q = scenario_problem([[[1, 2]]], [1, 1], tokens=[[1, 1]], nop=[0, 1])
    with pytest.raises(ValueError, match="≥ 0"):
        lagrangian_value(q, Prices(np.array([-1.0, 0.0])))


def test_four_experts_on_three_chiplets_over_two_layers():
    # near chiplets 0-1, a far one; a bursty expert per layer; 9 pages for 8 experts
    work = [[[4, 1, 1, 0], [0, 2, 2, 1]], [[0, 1, 1, 3], [2, 2, 0, 1]]]
    p = scenario_problem(work, [3, 3, 3], tokens=[[2, 1, 1, 2], [1, 2, 1, 1]], nop=[0, 0, 0.5],
                         all_resident=True, budget=9)  # fmt: skip
    best = optimum(p)
    r = run(p)
    assert r.bound <= best + TOL <= r.objective + 2 * TOL
    assert r.bound > solve(p, "lp", time_limit_s=math.inf).bound + 0.1  # the NoP of the far chiplet is seen
    assert lagrangian_value(p, r.prices).bound == pytest.approx(r.lagrangian_bound)


def test_zero_prices_are_a_bound_too():
    p = scenario_problem([[[3, 1, 2], [1, 1, 0]], [[0, 4, 1], [2, 0, 1]]], [3, 2, 2],
                         tokens=[[3, 2, 1], [1, 1, 1]], nop=[0, 0, 1], all_resident=True)  # fmt: skip
    free = lagrangian_value(p, Prices(np.zeros(2)))
    assert free.bound <= optimum(p) + TOL
    assert free.closed.all()
    assert free.bound <= run(p).bound + TOL  # the joint model is at least as tight


# ------------------------------------------------------------ properties


@st.composite
def small_problems(draw):
    """2 layers, 2-4 experts, 2-3 chiplets; speeds, NoP, limits, leases and quotas drawn."""
    experts, chiplets = draw(st.sampled_from([(2, 2), (3, 2), (4, 2), (2, 3), (3, 3), (4, 3)]))
    layers = 2
    rng = np.random.default_rng(draw(st.integers(0, 2**20)))
    all_resident = draw(st.booleans())
    capacity = rng.integers(1, experts + 1, chiplets)
    if all_resident and capacity.sum() < layers * experts:
        capacity[0] += layers * experts - capacity.sum()
    budget = int(capacity.sum()) - int(draw(st.integers(0, 1)))
    if all_resident:
        budget = max(budget, layers * experts)
    speed = rng.choice([1.0, 2.0], chiplets) if draw(st.booleans()) else np.ones(chiplets)
    scenarios = draw(st.integers(1, 3))
    tokens = rng.integers(0, 5, (scenarios, layers, experts)).astype(float)
    work = ((tokens > 0) * 0.5 + tokens * 0.3)[..., None] / speed  # related speeds
    nop = rng.choice([0.0, 0.1, 0.3], chiplets)
    previous = rng.random((layers, experts, chiplets)) < 0.3
    for c in range(chiplets):  # the previous placement fits
        on = np.argwhere(previous[..., c])
        previous[(*on[capacity[c] :].T, c)] = False
    leased = previous & (rng.random(previous.shape) < 0.4) if draw(st.booleans()) else None
    tenants = ()
    if draw(st.booleans()):
        owns = rng.random((layers, experts)) < 0.5
        floor = int(owns.sum()) if all_resident else 0
        floor = max(floor, 0 if leased is None else int(leased[owns].sum()))
        tenants = (Tenant("t", owns, floor + int(rng.integers(0, 3))),)
    if leased is not None and leased.sum() > budget:
        leased = None
    most_leased = 1 if leased is None else max(1, int(leased.sum(axis=2).max()))
    mean = tokens.mean(axis=0)
    p = make_problem(
        miss=rng.integers(0, 3, (layers, experts)) * (mean > 0),
        work=work.mean(axis=0),
        capacity=capacity,
        tokens=mean,
        nop=nop,
        copy_ms=float(draw(st.integers(0, 1))),
        previous=previous if draw(st.booleans()) else None,
        leased=leased,
        budget=budget,
        max_replicas=draw(st.integers(most_leased, chiplets)),
        tenants=tenants,
        all_resident=all_resident,
        batches=draw(st.integers(1, 2)),
    )
    return dataclasses.replace(p, scenario_work_ms=work, search_moves=20)


@settings(max_examples=30)
@given(small_problems())
def test_bounds_below_optimum_below_placement_and_prices_reproduce_the_bound(p):
    best = optimum(p)
    assume(np.isfinite(best))  # leases, quotas and all_resident drawn together can leave no placement
    scale = max(1.0, abs(best))
    r = run(p, iterations=4)
    for name in ("root_bound", "joint_bound", "lagrangian_bound", "bound"):
        assert getattr(r, name) <= best + TOL * scale, name
    assert r.bound >= r.root_bound - TOL * scale  # the MILP and the Lagrangian only add
    if r.placement is not None:
        assert not check_feasible(p, r.placement)
        assert r.objective >= best - TOL * scale
    assert r.closed  # every layer of an instance this small closes
    again = lagrangian_value(p, r.prices)
    assert again.bound == pytest.approx(r.lagrangian_bound, rel=1e-9, abs=1e-9)
    assert again.layer_bounds == pytest.approx(r.layer_bounds, rel=1e-9, abs=1e-9)
    # the joint class MILP closes on instances this small: it is at least the Lagrangian
    assert r.joint_bound >= r.lagrangian_bound - TOL * scale


@settings(max_examples=10)
@given(small_problems())
def test_placed_counts_are_feasible_with_the_same_replicas_per_class(p):
    classes = device_classes(p)
    best = brute_force_counts(p, classes)
    placed = place_counts(p, classes, best)
    if placed is not None:  # None only when the even shares leave an expert too few chiplets
        assert not check_feasible(p, placed)
        for k in range(classes.count):
            assert (placed.resident[..., classes.of == k].sum(axis=2) == best[..., k]).all()


def brute_force_counts(p: ResidencyProblem, classes) -> np.ndarray:
    """Replicas per class [L, E, K] of the joint class model's solution (via decompose)."""
    try:
        r = run(p, iterations=1, search_rounds=0)
    except ComoeError:  # no placement at all (the first property test covers feasible instances)
        assume(False)
    counts = np.zeros((p.layers, p.experts, classes.count), dtype=np.int64)
    if r.placement is not None:
        for k in range(classes.count):
            counts[..., k] = r.placement.resident[..., classes.of == k].sum(axis=2)
    return counts


@settings(max_examples=25)
@given(small_problems(), st.integers(0, 3))
def test_annealing_keeps_every_constraint_and_never_worsens(p, seed):
    start = _some_placement(p)
    assume(start is not None)
    found = anneal(p, start, proposals=300, seed=seed)
    assert not check_feasible(p, found)
    assert score(p, found).total <= score(p, start).total + TOL
    assert (found.pages_per_chiplet() == start.pages_per_chiplet()).all()  # moves keep pages
    if p.leased is not None:
        assert not (p.leased & ~found.resident).any()
    again = anneal(p, start, proposals=300, seed=seed)
    assert (again.resident == found.resident).all()  # seeded: deterministic


def test_annealing_separates_experts_that_burst_together():
    # two chiplets, two pages each; a and b burst together, c and d together: {a, b} | {c, d}
    # has makespan 8 in both scenarios, {a, c} | {b, d} has 4
    work = [[[4, 4, 0, 0]], [[0, 0, 4, 4]]]
    p = scenario_problem(work, [2, 2], tokens=[[1, 1, 1, 1]], nop=[0, 0], all_resident=True)
    bad = Placement(np.array([[[1, 0], [1, 0], [0, 1], [0, 1]]], dtype=bool))
    good = anneal(p, bad, proposals=200)
    assert score(p, bad).total == pytest.approx(8.0)
    assert score(p, good).total == pytest.approx(4.0)


def test_annealing_runs_a_fixed_count_whatever_the_clock():
    """The proposals are a count, not sized by the measured speed: on a clock that jumps an hour
    per reading, a deadline far off gives the placement the annealing gives without one; one
    that has passed leaves the placement as it is."""
    from comoe_opt.deadline import Deadline

    work = [[[4, 4, 0, 0]], [[0, 0, 4, 4]]]
    p = scenario_problem(work, [2, 2], tokens=[[1, 1, 1, 1]], nop=[0, 0], all_resident=True)
    bad = Placement(np.array([[[1, 0], [1, 0], [0, 1], [0, 1]]], dtype=bool))
    hour = iter(range(0, 10**9, 3600))
    crawling = Deadline(1e12, clock=lambda: float(next(hour)))
    free = anneal(p, bad, proposals=200)
    timed = anneal(p, bad, proposals=200, deadline=crawling)
    assert (timed.resident == free.resident).all() and score(p, timed).total == pytest.approx(4.0)
    passed = Deadline(0.0, clock=lambda: 0.0)
    assert (anneal(p, bad, proposals=200, deadline=passed).resident == bad.resident).all()

    # `exact`'s longer runs fit the proposals to a deadline's time left, on its own clock: with
    # time to spare the count is the ceiling; with none left no layer gets a proposal
    still = Deadline(1e9, clock=lambda: 0.0)
    assert (anneal(p, bad, proposals=200, fit_to=still).resident == free.resident).all()
    ticks = iter(range(10**9))
    spent = Deadline(0.5, clock=lambda: float(next(ticks)))  # a second per reading: 0.5 s is gone
    assert (anneal(p, bad, proposals=200, fit_to=spent).resident == bad.resident).all()


def _some_placement(p: ResidencyProblem) -> Placement | None:
    try:
        r = run(p, iterations=1, search_rounds=0, anneal_proposals=0)
    except ComoeError:
        return None
    return r.placement


@settings(max_examples=25)
@given(small_problems(), st.integers(0, 3))
def test_annealing_scores_kept_up_to_date_equal_a_fresh_score(p, seed):
    """The annealing's incremental value (two rows of the cut enumeration per move, NoP, misses
    and copies per expert) is the layer's objective computed afresh, after every move taken."""
    from comoe_opt.residency.search.anneal import _Layer, _masks, _Scores

    start = _some_placement(p)
    assume(start is not None)
    table = CutTable.for_speeds(related_speeds(p.scenario_work_ms))
    rng = np.random.default_rng(seed)
    for layer in range(p.layers):
        lay = _Layer(p, table, start.resident[layer], layer, np.zeros(len(p.tenants), dtype=np.int64))
        state = _Scores(lay, _masks(start.resident[layer]))
        slots = [int(i) for i in np.flatnonzero(start.resident[layer])]
        room = np.full(len(p.tenants), 10**6)
        for _ in range(40 if slots else 0):
            move = lay._propose(rng, state.masks, slots, room)
            if move is None:
                continue
            a, new_a, b, new_b, moved = move
            v = state.value_of(a, new_a, b, new_b)
            state.take()
            for i, slot in moved:
                slots[i] = slot
            packed = device_sets.from_ints(state.masks, device_sets.words(p.chiplets))
            fresh = lay.value(resident_of(packed, p.chiplets))
            assert v == pytest.approx(fresh, rel=1e-9, abs=1e-12)
            assert state.value == pytest.approx(fresh, rel=1e-9, abs=1e-12)
            assert sorted(slots) == list(np.flatnonzero(resident_of(packed, p.chiplets)))
