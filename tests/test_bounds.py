"""Bounds never lie: every reported bound is at most the true optimum, every `optimal` is optimal.

Each method is checked against a brute-force optimum over every replica map
of tiny instances (mean-load and scenario objectives, related and unrelated
chiplet speeds, tight capacity, no spare budget, leases and quotas), and the
defects an independent check found are pinned by hand-made cases.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
from conftest import make_problem
from hypothesis import given, settings
from hypothesis import strategies as st

from comoe_opt.deadline import Deadline
from comoe_opt.mapping.placement import default_placement
from comoe_opt.residency.heuristics import HEURISTICS, warm_starts
from comoe_opt.residency.models.cut_model import cut_model_applies, solve_with_cuts
from comoe_opt.residency.objective import check_feasible, score
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.problem import ResidencyProblem, Tenant
from comoe_opt.residency.solve import solve
from comoe_opt.results import BoundError, NoReport, SolveResult, Status, relative_gap

TOL = 1e-6


def brute_force(p: ResidencyProblem) -> tuple[float, Placement | None]:
    """The exact optimum over every replica map (capacity-feasible ones only are scored)."""
    shape = (p.layers, p.experts, p.chiplets)
    best, arg = float("inf"), None
    per_chiplet = [list(itertools.product([False, True], repeat=p.layers * p.experts))] * p.chiplets
    for columns in itertools.product(*per_chiplet):
        resident = np.array(columns, dtype=bool).T.reshape(shape)
        if (resident.sum(axis=(0, 1)) > p.capacity_pages).any():
            continue
        placement = Placement(resident)
        if check_feasible(p, placement):
            continue
        total = score(p, placement).total
        if total < best:
            best, arg = total, placement
    return best, arg


def with_scenarios(p: ResidencyProblem, scenario_work: np.ndarray, moves: int = 50) -> ResidencyProblem:
    """`p` scored on scenarios [S, L, E, C]; the mean load is their mean (as residency_problem does)."""
    return dataclasses.replace(
        p, scenario_work_ms=scenario_work, work_ms=scenario_work.mean(axis=0), search_moves=moves
    )


# ------------------------------------------------------------- signed gaps


def test_gap_is_signed_and_measured_on_what_a_placement_changes():
    assert relative_gap(10.0, 9.0) == pytest.approx(0.1)
    assert relative_gap(10.0, 11.0) == pytest.approx(-0.1)
    # 9 of the 10 ms are a constant: the gap is on the 1 ms a placement changes
    assert relative_gap(10.0, 9.5, constant=9.0) == pytest.approx(0.5)


def test_a_bound_above_a_feasible_objective_is_an_internal_error():
    none = NoReport()
    with pytest.raises(BoundError, match="above the objective"):
        SolveResult("x", Status.FEASIBLE, objective=1.0, bound=1.1, runtime_s=0.0, report=none)
    SolveResult("x", Status.FEASIBLE, objective=1.0, bound=1 + 1e-9, runtime_s=0.0, report=none)  # round-off
    SolveResult("x", Status.NO_SOLUTION, objective=float("inf"), bound=1.0, runtime_s=0.0, report=none)


def test_constant_nop_is_left_out_of_the_gap():
    # every chiplet is 1 hop away: all NoP is constant, only the balance term depends on the placement
    p = make_problem(miss=[[5.0, 5.0]], work=[[2.0, 1.0]], capacity=[1, 1], tokens=[[100.0, 100.0]],
                     nop=[1.0, 1.0])  # fmt: skip
    r = solve(p, "milp", mip_gap=0.0, time_limit_s=math.inf)
    assert p.constant_ms == pytest.approx(200.0)
    assert r.constant == pytest.approx(200.0)
    assert r.objective == pytest.approx(202.0) and r.status is Status.OPTIMAL
    assert r.gap == pytest.approx((r.objective - r.bound) / 2.0)


# --------------------------------------------------------- hand-made defects


def test_unrelated_speeds_do_not_lift_the_bound_above_the_optimum():
    """Chiplet 0 reads pages fast, chiplet 1 computes fast: in the scenario with few tokens the
    expert is quick on 0, with many on 1. The mean load's floor (2.75) is above the optimum."""
    work = np.array([[[[1.0, 10.0]]], [[[10.0, 1.0]]]])  # [S=2, L=1, E=1, C=2]
    p = with_scenarios(make_problem(miss=[[0.0]], work=[[1.0]], capacity=[1, 1]), work)
    optimum, _ = brute_force(p)
    assert optimum == pytest.approx(10 / 11)  # split 10:1 in each scenario
    for method in ("milp", "full"):
        r = solve(p, method, mip_gap=0.0, time_limit_s=math.inf)
        assert r.bound <= optimum + TOL, method
        assert r.objective == pytest.approx(optimum, rel=1e-6), method


def test_full_and_exact_solve_the_scenario_objective():
    # two bursty experts: on the mean load one replica each is even; on the scenarios the burster
    # needs its second replica
    work = np.array([[[8.0, 0.0, 1.0]], [[0.0, 8.0, 1.0]]])
    work = np.repeat(work[..., None], 2, axis=-1)
    p = with_scenarios(make_problem(miss=[[0, 0, 0]], work=[[4, 4, 1]], capacity=[3, 3],
                                    all_resident=True), work)  # fmt: skip
    optimum, _ = brute_force(p)
    for method in ("full", "exact"):
        r = solve(p, method, mip_gap=0.0, time_limit_s=math.inf)
        assert r.status is Status.OPTIMAL, method
        assert r.objective == pytest.approx(optimum) and r.bound <= optimum + TOL, method


def test_exact_sees_which_experts_share_a_chiplet():
    # three equal experts, room for two on chiplet 0 and one on chiplet 1: two must share, so the
    # makespan is 8; the replica-count bound sees only the even split (6) and the largest expert (4)
    work = np.full((1, 1, 3, 2), 4.0)
    p = with_scenarios(
        make_problem(miss=[[0, 0, 0]], work=[[4, 4, 4]], capacity=[2, 1], all_resident=True), work
    )
    milp = solve(p, "milp", mip_gap=0.0, time_limit_s=math.inf)
    assert milp.report.replica_model_objective == pytest.approx(6.0)
    assert milp.bound == pytest.approx(8.0)  # the full model's, on an instance this small
    exact = solve(p, "exact", mip_gap=0.0, time_limit_s=math.inf)
    assert exact.status is Status.OPTIMAL
    assert exact.objective == pytest.approx(8.0) and exact.bound == pytest.approx(8.0)
    # the cut model on its own proves it too (here `exact` closes first with the full model's polish)
    cuts = solve_with_cuts(p, None, deadline=Deadline(math.inf), mip_gap=0.0)
    assert cuts.rounds.rounds >= 1 and cuts.bound == pytest.approx(8.0)


@pytest.mark.parametrize("capacity", [[4, 1, 1], [5, 3], [7, 1]])
def test_all_resident_with_uneven_capacity_is_solved(capacity):
    """Total capacity is one page per expert, per-chiplet capacities do not split evenly over the
    layers: EPLB's warm start leaves experts out and is skipped, never fatal."""
    layers, experts = 2, sum(capacity) // 2
    rng = np.random.default_rng(len(capacity))
    work = rng.integers(1, 5, (layers, experts)).astype(float)
    p = make_problem(miss=np.ones((layers, experts)), work=work, capacity=capacity, all_resident=True)
    assert solve(p, "eplb").status is Status.NO_SOLUTION
    milp = solve(p, "milp", mip_gap=0.0, time_limit_s=math.inf)
    full = solve(p, "full", mip_gap=0.0, time_limit_s=math.inf)
    assert milp.status.has_solution and full.status is Status.OPTIMAL
    assert milp.solution.resident.any(axis=2).all()
    assert milp.bound <= full.objective + TOL and full.bound <= milp.objective + TOL
    assert milp.objective == pytest.approx(full.objective, rel=1e-6)


def test_eplb_honours_leases():
    leased = np.zeros((1, 3, 2), dtype=bool)
    leased[0, 2, 0] = True  # the coldest expert's replica on chiplet 0 must stay
    p = make_problem(miss=[[1, 1, 1]], work=[[5, 3, 1]], capacity=[2, 2], tokens=[[5, 3, 1]], leased=leased)
    r = solve(p, "eplb")
    assert r.status is Status.FEASIBLE
    assert r.solution.resident[0, 2, 0] and not check_feasible(p, r.solution)
    assert r.solution.pages == 4


def test_greedy_with_token_balance_spends_the_spare_budget():
    # balance on tokens: extra replicas buy nothing on the mean load, yet the pages are there
    tokens = np.array([[8.0, 4.0, 2.0, 2.0]])
    p = make_problem(miss=np.ones((1, 4)), work=tokens / 4, capacity=[3, 3], tokens=tokens, budget=6,
                     all_resident=True)  # fmt: skip
    r = solve(p, "greedy")
    assert r.solution.pages == 6
    assert r.objective <= solve(p, "static").objective + TOL


def test_gap_placement_follows_the_replica_budget(table):
    from comoe_opt.instance import instance_from_table
    from comoe_opt.trace import instance_batches

    table["hardware"]["capacity_gb"] = 4  # 4 slots per chiplet over 3 layers: 1 slot per layer each
    table["model"]["layers"] = 1  # one layer: 4 slots per chiplet, 16 in all, for 8 experts
    table["policy"]["replica_budget_pages"] = 10  # 1.25 x 8 experts
    instance = instance_from_table(table, "t.toml")
    placement = default_placement(instance, instance_batches(instance))
    assert placement.sum() == 10


# ------------------------------------------------- property: bound <= opt <= objective


@st.composite
def tiny_problems(draw):
    """One layer, 2-3 experts, 2-3 chiplets (at most 8 replica bits), every limit drawn."""
    experts, chiplets = draw(st.sampled_from([(2, 2), (2, 3), (3, 2)]))
    rng = np.random.default_rng(draw(st.integers(0, 2**20)))
    capacity = rng.integers(0, 3, chiplets)
    all_resident = draw(st.booleans())
    if all_resident and capacity.sum() < experts:
        capacity[0] += experts - capacity.sum()
    budget = int(capacity.sum()) if draw(st.booleans()) else max(experts if all_resident else 1,
                                                                    int(capacity.sum()) - 1)  # fmt: skip
    tokens = rng.integers(0, 6, (1, experts)).astype(float)
    read = rng.uniform(0.5, 2.0, chiplets)
    flop = rng.uniform(0.05, 0.5, chiplets)
    if draw(st.booleans()):  # related speeds: one factor per chiplet
        flop = read * 0.2
    previous = np.zeros((1, experts, chiplets), dtype=bool)
    for c in range(chiplets):
        previous[0, rng.permutation(experts)[: capacity[c]], c] = True
    leased = previous & (rng.random(previous.shape) < 0.3) if draw(st.booleans()) else None
    if leased is not None and (all_resident or leased.sum() > budget):
        leased = None
    most_leased = 1 if leased is None else max(1, int(leased.sum(axis=2).max()))
    tenants = ()
    if draw(st.booleans()) and not all_resident:
        owns = rng.random((1, experts)) < 0.5
        floor = 0 if leased is None else int(leased[owns].sum())
        tenants = (Tenant("t", owns, floor + int(rng.integers(0, 2))),)
    used = (tokens > 0).astype(float)
    p = make_problem(
        miss=rng.integers(0, 4, (1, experts)) * used,
        work=(used[..., None] * read + tokens[..., None] * flop),
        capacity=capacity,
        tokens=tokens,
        nop=rng.random(chiplets) * 0.2,
        copy_ms=float(draw(st.integers(0, 2))),
        previous=previous if draw(st.booleans()) else None,
        leased=leased,
        budget=budget,
        max_replicas=draw(st.integers(most_leased, chiplets)),
        tenants=tenants,
        all_resident=all_resident,
        batches=draw(st.integers(1, 3)),
    )
    if draw(st.booleans()):  # balance scenarios: per-micro-batch token counts
        s_tokens = rng.integers(0, 6, (draw(st.integers(1, 3)), 1, experts)).astype(float)
        work = (s_tokens > 0)[..., None] * read + s_tokens[..., None] * flop
        p = with_scenarios(p, work)
    return p


@settings(max_examples=40)
@given(tiny_problems())
def test_search_annealing_and_class_bound_keep_the_promise(p):
    """With the search and the annealing on (and so the class bound, with scenarios), `milp` and
    `exact` still bracket the brute-force optimum, `exact` is never worse than `milp`, and an
    `optimal` is optimal."""
    p = dataclasses.replace(p, search_moves=30, anneal_proposals=60)
    optimum, _ = brute_force(p)
    scale = max(1.0, abs(optimum))
    results = {m: solve(p, m, mip_gap=0.0, time_limit_s=math.inf) for m in ("milp", "exact")}
    for name, r in results.items():
        assert r.bound <= optimum + TOL * scale, name
        assert r.objective >= optimum - TOL * scale, name
        if r.status is Status.OPTIMAL:
            assert r.objective <= optimum + TOL * scale, name
        if r.report.certificate is not None:
            assert r.report.certificate.bound <= optimum + TOL * scale, name
    assert results["exact"].objective <= results["milp"].objective + TOL * scale


@settings(max_examples=120)
@given(tiny_problems())
def test_bound_below_optimum_below_every_method(p):
    optimum, _ = brute_force(p)
    assert np.isfinite(optimum)  # the empty placement, or the generator's, is always feasible
    scale = max(1.0, abs(optimum))
    # no time limit: every phase ends on its work limit (residency/schedule.py), so that whether
    # a method reaches OPTIMAL does not depend on the machine's speed or load
    results = {m: solve(p, m, mip_gap=0.0, time_limit_s=math.inf) for m in ("milp", "exact", "full")}
    results["lp"] = solve(p, "lp", time_limit_s=math.inf)
    assert results["lp"].bound <= optimum + TOL * scale
    for name, r in results.items():
        if name == "lp":
            continue
        assert r.status.has_solution, name
        assert r.bound <= optimum + TOL * scale, name
        assert r.objective >= optimum - TOL * scale, name
        assert not check_feasible(p, r.solution), name
        if r.status is Status.OPTIMAL:
            assert r.objective <= optimum + TOL * scale, f"{name} says optimal"
    assert results["full"].status is Status.OPTIMAL  # the exact model closes on tiny instances
    # exact runs milp's steps first: never worse
    assert results["exact"].objective <= results["milp"].objective + TOL * scale
    if cut_model_applies(p):
        assert results["exact"].status is Status.OPTIMAL  # row generation closes too
        assert results["exact"].report.cut_rounds is None or results["exact"].report.cut_rounds >= 1
    for name in HEURISTICS:
        h = solve(p, name, time_limit_s=math.inf)
        if h.status.has_solution:
            if name in warm_starts():  # the MILP starts from these: never worse than any of them
                assert results["milp"].objective <= h.objective + TOL * scale, name
            assert h.objective >= optimum - TOL * scale, name
