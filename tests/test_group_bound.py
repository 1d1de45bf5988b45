"""Scenario-group bounds never lie, grow with the groups, and their certificate recomputes.

Optima come from test_decompose's brute force over every placement of 2-layer instances. No
group solve has a time limit here: tiny groups close."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from test_decompose import optimum, scenario_problem, small_problems

from comoe_opt.deadline import Deadline
from comoe_opt.residency.bounds.check_bound import CertificateError
from comoe_opt.residency.bounds.check_group_bound import GroupCertificate, check_group_certificate
from comoe_opt.residency.bounds.decompose import (
    Prices,
    class_lp_certificate,
    device_classes,
    lagrangian_value,
    stepped_lagrangian,
)
from comoe_opt.residency.bounds.group_bound import group_bound, scenario_groups
from comoe_opt.residency.problem import ResidencyProblem

TOL = 1e-6
NONE = -np.inf  # no class value: a layer's value is its groups' alone


def free(p: ResidencyProblem) -> Prices:
    return Prices(np.zeros(device_classes(p).count), 0.0, np.zeros(len(p.tenants)))


def groups_only(p: ResidencyProblem, size: int, prices: Prices | None = None, **options) -> float:
    prices = free(p) if prices is None else prices
    return group_bound(p, prices, np.full(p.layers, NONE), group_size=size, **options).bound


def recomputed(p: ResidencyProblem, result) -> float:
    cert = GroupCertificate.from_json(result.certificate(p).to_json())
    value = check_group_certificate(p, cert)
    assert value == pytest.approx(result.bound, rel=1e-9, abs=1e-9)
    return value


# ------------------------------------------------------------ hand-checked


def test_groups_of_one_see_each_scenario_alone_and_one_group_sees_the_sharing():
    # three experts, one replica each, two chiplets: some pair shares a chiplet. Each scenario
    # makes one pair busy (4 + 4); alone it puts that pair apart (makespan 4), but one placement
    # for all three scenarios leaves one pair together: (8 + 4 + 4) / 3 = 16 / 3
    work = [[[4, 4, 0]], [[4, 0, 4]], [[0, 4, 4]]]
    p = scenario_problem(work, [2, 2], tokens=[[1, 1, 1]], nop=[0, 0], all_resident=True, max_replicas=1)
    assert optimum(p) == pytest.approx(16 / 3)
    assert groups_only(p, 1) == pytest.approx(4.0)
    assert groups_only(p, 3) == pytest.approx(16 / 3)
    for solver in ("cuts", "cpsat"):
        assert groups_only(p, 3, solver=solver) == pytest.approx(16 / 3, rel=1e-6)


def test_the_cpsat_group_solver_refuses_more_chiplets_than_it_can_enumerate():
    # its model has a row per chiplet set (2^C): past 12 chiplets it names the solver that scales
    work = [[[4, 4, 0]], [[4, 0, 4]]]
    p = scenario_problem(work, [1] * 13, tokens=[[1, 1, 1]], nop=[0] * 13, all_resident=True)
    with pytest.raises(ValueError, match=r"13 chiplets.*'cuts'"):
        groups_only(p, 2, solver="cpsat")


def test_a_layer_keeps_its_class_value_when_the_groups_prove_less():
    work = [[[4, 4, 0]], [[4, 0, 4]], [[0, 4, 4]]]
    p = scenario_problem(work, [2, 2], tokens=[[1, 1, 1]], nop=[0, 0], all_resident=True, max_replicas=1)
    result = group_bound(p, free(p), np.array([5.0]), group_size=1)
    assert result.bound == pytest.approx(5.0) and not result.groups
    assert recomputed(p, result) == pytest.approx(5.0)
    result = group_bound(p, free(p), np.array([5.0]), group_size=3)
    assert result.bound == pytest.approx(16 / 3) and list(result.groups) == [0]
    assert recomputed(p, result) == pytest.approx(16 / 3)


def test_partitions_cover_every_scenario_once():
    for size in (1, 2, 3, 5):
        groups = scenario_groups(7, size, seed=3)
        assert sorted(np.concatenate(groups).tolist()) == list(range(7))
        assert max(len(g) for g in groups) == size


# ------------------------------------------------------------ properties


@settings(max_examples=25, deadline=None)
@given(small_problems(), st.sampled_from(["cuts", "cpsat"]))
def test_group_bounds_stay_below_the_optimum_and_grow_with_the_groups(p, solver):
    best = optimum(p)
    assume(np.isfinite(best))
    scale = max(1.0, abs(best))
    cert = class_lp_certificate(p)
    assert cert is not None
    prices = Prices.of_duals(cert.coupling_duals)
    singles = groups_only(p, 1, prices, solver=solver)
    everything = groups_only(p, p.scenarios, prices, solver=solver)
    assert singles <= everything + 1e-6 * scale  # groups of one refine any partition
    assert everything <= best + TOL * scale
    layers = lagrangian_value(p, prices)
    combined = group_bound(p, prices, layers.layer_bounds, group_size=p.scenarios, solver=solver)
    assert layers.bound - TOL * scale <= combined.bound <= best + TOL * scale
    assert recomputed(p, combined) <= best + TOL * scale


@settings(max_examples=15, deadline=None)
@given(small_problems())
def test_both_group_solvers_agree_on_closed_groups(p):
    prices = free(p)
    a = group_bound(p, prices, np.full(p.layers, NONE), group_size=p.scenarios, solver="cuts")
    b = group_bound(p, prices, np.full(p.layers, NONE), group_size=p.scenarios, solver="cpsat")
    if all(g.closed for gs in a.groups.values() for g in gs) and all(
        g.closed for gs in b.groups.values() for g in gs
    ):
        assert a.bound == pytest.approx(b.bound, rel=1e-5, abs=1e-5)


# ------------------------------------------------------------ what the checker refuses


def test_a_claim_above_its_witness_or_a_broken_partition_is_refused():
    work = [[[4, 4, 0]], [[4, 0, 4]], [[0, 4, 4]]]
    p = scenario_problem(work, [2, 2], tokens=[[1, 1, 1]], nop=[0, 0], all_resident=True, max_replicas=1)
    cert = group_bound(p, free(p), np.array([NONE]), group_size=3).certificate(p)
    inflated = [[{**cert.groups[0][0], "bound": 6.0}]]
    with pytest.raises(CertificateError, match="achieves"):
        check_group_certificate(p, dataclasses.replace(cert, groups=inflated))
    partial = [[{**cert.groups[0][0], "scenarios": [0, 1]}]]
    with pytest.raises(CertificateError, match="partition"):
        check_group_certificate(p, dataclasses.replace(cert, groups=partial))
    with pytest.raises(CertificateError, match="≥ 0"):
        check_group_certificate(p, dataclasses.replace(cert, class_pages=[-1.0]))
    with pytest.raises(CertificateError, match="not a"):
        GroupCertificate.from_json('{"kind": "something else"}')


def test_the_pipeline_step_lifts_the_lagrangian_and_its_certificate_recomputes():
    # the class model proves 4 (each scenario's busy pair may sit apart); the group of all three
    # scenarios proves the optimum 16 / 3. `exact`'s step runs on tiny instances only when the full
    # model's polish leaves the gap open, so it is called here as `solve_milp` calls it
    from comoe_opt.deadline import Deadline
    from comoe_opt.residency.exact.pipeline import _group_bound, _Incumbent, _lagrangian, _Run
    from comoe_opt.residency.solve import solve

    work = [[[4, 4, 0]], [[4, 0, 4]], [[0, 4, 4]]]
    p = scenario_problem(work, [2, 2], tokens=[[1, 1, 1]], nop=[0, 0], all_resident=True, max_replicas=1)
    placed = solve(p, "milp", mip_gap=0.0).solution
    # a time limit the step can never reach, on a clock that does not move: the group step runs only
    # with a time limit (on work limits it is left out), and nothing here depends on speed
    run = _Run(p, Deadline(1e9, clock=lambda: 0.0), 0.0, exact=True)
    run.best = _Incumbent(placed, 16 / 3 + 1.0, "test", None)  # an open gap, so that both run
    run.certificate = class_lp_certificate(p)
    run.bound = run.certificate.bound
    _lagrangian(run)
    assert run.lagrangian == pytest.approx(4.0)
    _group_bound(run)
    groups = run.groups
    assert groups is not None and groups.bound == pytest.approx(16 / 3, rel=1e-6)
    assert run.bound == pytest.approx(groups.bound)
    text = json.dumps(json.loads(groups.certificate(p).to_json()))
    assert check_group_certificate(p, GroupCertificate.from_json(text)) == pytest.approx(groups.bound)


@settings(max_examples=15, deadline=None)
@given(small_problems())
def test_price_steps_keep_a_bound_at_least_the_first(p):
    """`exact`'s Lagrangian steps its prices from the class LP's: any prices give a bound, and the
    best kept is at least the first (no clock: every layer closes, the steps are counted)."""
    best = optimum(p)
    assume(np.isfinite(best))
    scale = max(1.0, abs(best))
    prices = Prices.of_duals(class_lp_certificate(p).coupling_duals)
    first = lagrangian_value(p, prices)
    stepped = stepped_lagrangian(p, prices, deadline=Deadline(math.inf))
    assert first.bound - TOL * scale <= stepped.bound <= best + TOL * scale
    assert lagrangian_value(p, stepped.prices).bound == pytest.approx(stepped.bound, rel=1e-9, abs=1e-9)


def test_the_checker_refuses_more_chiplets_than_it_enumerates():
    # the checker's own 2^C table, bounded: a witness over 17 chiplets is refused, not enumerated
    work = [[[4, 4, 0]], [[4, 0, 4]], [[0, 4, 4]]]
    p = scenario_problem(work, [1] * 17, tokens=[[1, 1, 1]], nop=[0] * 17, all_resident=True, max_replicas=1)
    cert = group_bound(p, free(p), np.array([NONE]), group_size=3).certificate(p)
    assert cert.groups[0], "the group closed: a witness to check"
    with pytest.raises(CertificateError, match="17 chiplets"):
        check_group_certificate(p, cert)
