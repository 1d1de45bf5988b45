"""Slow loop: hand-checked optima, MILP vs exact full model vs heuristics, limits, rolling horizon."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import make_problem as problem
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from comoe_opt.errors import ComoeError
from comoe_opt.instance import load_instance
from comoe_opt.planning import rolling_horizon
from comoe_opt.residency.heuristics import HEURISTICS, warm_starts
from comoe_opt.residency.models.milp import build_replica_model
from comoe_opt.residency.objective import check_feasible, score
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.problem import Tenant, residency_problem
from comoe_opt.residency.solve import solve
from comoe_opt.results import Status
from comoe_opt.stats.demand import window_demand
from comoe_opt.trace import instance_batches

TOL = 1e-6


# ------------------------------------------------------------ hand-checked


def test_two_slots_keep_the_two_costliest_misses():
    # 3 experts, 2 chiplets with one page each. Keeping experts 0 and 1 leaves
    # expert 2's load (1 ms) and a makespan of 2 (work 2 | 1 + 1): 3 ms.
    p = problem(miss=[[5, 3, 1]], work=[[2, 1, 1]], capacity=[1, 1])
    for method in ("milp", "full"):
        result = solve(p, method, time_limit_s=math.inf)
        assert result.status == Status.OPTIMAL
        assert result.objective == pytest.approx(3.0)
        assert result.solution.replicas()[0].tolist() == [1, 1, 0]
    assert solve(p, "milp", time_limit_s=math.inf).bound == pytest.approx(3.0)


def test_a_heavy_expert_is_replicated_to_balance():
    # expert 0's work 4 on one chiplet gives makespan 4; two replicas split it: (4 + 0.5) / 2.
    p = problem(miss=[[10, 1]], work=[[4, 0.5]], capacity=[2, 2])
    result = solve(p, "milp", time_limit_s=math.inf)
    assert result.objective == pytest.approx(2.25)
    assert result.solution.replicas()[0].tolist()[0] == 2
    assert result.status == Status.OPTIMAL
    assert solve(p, "full", time_limit_s=math.inf).objective == pytest.approx(2.25)


def test_copy_cost_keeps_what_is_there():
    # expert 0 already sits on chiplet 1; copying expert 1 (10 ms) costs more than its misses (5 ms).
    prev = [[[False, True], [False, False]]]
    p = problem(miss=[[5, 5]], work=[[1, 1]], capacity=[1, 1], copy_ms=10.0, previous=prev)
    result = solve(p, "milp", time_limit_s=math.inf)
    assert result.objective == pytest.approx(6.0)
    assert result.solution.resident[0].tolist() == [[False, True], [False, False]]
    assert result.report.terms.pages_moved == 0


def test_window_length_scales_per_batch_terms_not_copies():
    prev = [[[False, True], [False, False]]]
    p = problem(miss=[[5, 5]], work=[[1, 1]], capacity=[1, 1], copy_ms=10.0, previous=prev, batches=3)
    # now copying expert 1 pays: 3 * (1 + 0) + 10 = 13 < 3 * (1 + 5) = 18
    result = solve(p, "milp", time_limit_s=math.inf)
    assert result.objective == pytest.approx(13.0)
    assert result.report.terms.pages_moved == 1


def test_tenant_quota_caps_pages():
    owner = Tenant("a", np.array([[True, True, False]]), max_pages=1)
    p = problem(miss=[[5, 4, 1]], work=[[1, 1, 1]], capacity=[2, 2], tenants=(owner,))
    for method in ("milp", "full", *HEURISTICS):
        placement = solve(p, method, time_limit_s=math.inf).solution
        assert int(placement.resident[0, :2].sum()) <= 1, method
        assert not check_feasible(p, placement)


def test_infeasible_capacity_names_the_shortfall():
    with pytest.raises(ComoeError, match="short by 2 pages"):
        problem(miss=[[1, 1, 1, 1]], work=[[1, 1, 1, 1]], capacity=[1, 1], all_resident=True)


def test_leases_beyond_capacity_name_the_chiplet():
    leased = np.zeros((1, 3, 2), dtype=bool)
    leased[0, :, 0] = True
    with pytest.raises(ComoeError, match="chiplet 0 must keep 3 leased pages"):
        problem(miss=[[1, 1, 1]], work=[[1, 1, 1]], capacity=[2, 2], leased=leased)


def test_all_resident_keeps_every_expert():
    p = problem(miss=[[0, 0, 3, 1]], work=[[1, 1, 1, 1]], capacity=[2, 2], all_resident=True)
    for method in ("milp", "full", *HEURISTICS):
        assert (solve(p, method, time_limit_s=math.inf).solution.replicas() >= 1).all(), method


# ------------------------------------------------------- property tests


@st.composite
def small_problems(draw):
    layers = draw(st.integers(1, 2))
    experts = draw(st.integers(2, 4))
    chiplets = draw(st.integers(1, 3))
    capacity = draw(st.lists(st.integers(0, 3), min_size=chiplets, max_size=chiplets))
    miss = draw(st.lists(st.integers(0, 9), min_size=layers * experts, max_size=layers * experts))
    work = draw(st.lists(st.integers(0, 6), min_size=layers * experts, max_size=layers * experts))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    previous = rng.random((layers, experts, chiplets)) < 0.3
    for c in range(chiplets):  # a previous placement that fits
        held = np.argwhere(previous[:, :, c])
        for l, e in held[capacity[c] :]:
            previous[l, e, c] = False
    leased = previous & (rng.random(previous.shape) < 0.5) if draw(st.booleans()) else None
    tenants = ()
    if draw(st.booleans()):  # a tenant whose quota is what it holds now
        owns = rng.random((layers, experts)) < 0.5
        tenants = (Tenant("t", owns, int(previous[owns].sum())),)
    return problem(
        miss=np.array(miss, dtype=float).reshape(layers, experts),
        work=np.array(work, dtype=float).reshape(layers, experts) / 2,
        capacity=capacity,
        tokens=rng.integers(0, 5, (layers, experts)),
        nop=rng.random(chiplets) * 0.1,
        copy_ms=float(draw(st.integers(0, 4))),
        batches=draw(st.integers(1, 3)),
        previous=previous,
        leased=leased,
        budget=draw(st.one_of(st.none(), st.integers(0, sum(capacity)))) if leased is None else None,
        max_replicas=draw(st.integers(1, chiplets)) if leased is None else None,
        tenants=tenants,
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_problems())
def test_milp_matches_the_exact_full_model_and_beats_heuristics(p):
    full = solve(p, "full", mip_gap=0.0, time_limit_s=math.inf)
    assume(full.status == Status.OPTIMAL)
    milp = solve(p, "milp", mip_gap=0.0, time_limit_s=math.inf)
    scale = max(1.0, abs(full.objective))
    # the replica-count model is a relaxation: its bound never exceeds the true optimum
    assert milp.bound <= full.objective + TOL * scale
    assert milp.bound <= milp.objective + TOL * scale
    assert milp.objective >= full.objective - TOL * scale
    for name, declared in HEURISTICS.items():
        if not declared.leases and p.leased is not None and p.leased.any():
            continue  # re-plans from scratch (EPLB, the engines' balancers): it does not honour leases
        heuristic = solve(p, name, time_limit_s=math.inf)
        if not declared.warm_start and not heuristic.status.has_solution:
            continue  # an engine's balancer may not plan within the problem's limits
        assert not check_feasible(p, heuristic.solution), name
        assert heuristic.objective >= full.objective - TOL * scale, name
        if declared.warm_start:  # the MILP starts from these: never worse than any of them
            assert milp.objective <= heuristic.objective + TOL * scale, name
    for result in (full, milp):
        placement = result.solution
        assert not check_feasible(p, placement)
        assert (placement.pages_per_chiplet() <= p.capacity_pages).all()
        assert placement.pages <= p.budget_pages
        assert score(p, placement).total == pytest.approx(result.objective, rel=1e-6, abs=1e-6)


@settings(max_examples=25, deadline=None)
@given(small_problems())
def test_lp_bound_is_below_the_replica_model_optimum(p):
    lp = solve(p, "lp", time_limit_s=math.inf)
    milp = solve(p, "milp", mip_gap=0.0, time_limit_s=math.inf)
    assert lp.objective <= milp.objective + TOL * max(1.0, milp.objective)


# ------------------------------------------------------------ on a trace


@pytest.fixture(scope="module")
def paper():
    instance = load_instance("instances/paper-baseline.toml")
    return instance, instance_batches(instance)


def test_paper_window_replica_model_is_small_and_proves_the_gap(paper):
    instance, batches = paper
    demand = window_demand(batches.window(0, 100), instance.policy)
    p = residency_problem(instance, demand)
    model = build_replica_model(p)
    assert len(model.w) <= 3 * p.layers * p.experts  # no chiplet index: no chiplet symmetry
    result = solve(p, "milp", time_limit_s=math.inf, mip_gap=1e-3)
    assert result.bound <= result.objective
    for name in warm_starts():  # the MILP starts from these: never worse than any of them
        assert result.objective <= solve(p, name, time_limit_s=math.inf).objective + TOL


def test_rolling_horizon_respects_leases_and_counts_moves(paper):
    instance, batches = paper
    short = batches.window(0, 400)
    plans = list(rolling_horizon(instance, short, "greedy"))
    assert [p.window for p in plans] == [0, 1, 2, 3]
    resident = [plan.result.solution.resident for plan in plans]
    assert plans[0].pages_moved == int(resident[0].sum())
    for w in range(1, len(plans)):
        assert plans[w].pages_moved == int((resident[w] & ~resident[w - 1]).sum())
        if w >= 2:
            # pages copied for window w-1 are leased through window w (lease_windows = 1)
            copied = resident[w - 1] & ~resident[w - 2]
            assert (resident[w] | ~copied).all()
    assert plans[1].planned_on == (0, 100) and plans[2].planned_on == (100, 200)


# ------------------------------------------------------------------- CLI

SMALL = """
name = "small"
[model]
layers = 2
experts_per_layer = 4
top_k = 2
page_gb = 1.0
hidden_size = 64
bytes_per_element = 2
[hardware]
chiplets = 2
capacity_gb = {capacity}
local_bandwidth_gb_s = 1000
peak_tflops = 100
d2d_bandwidth_gb_s = 100
nop_hops = [1, 2]
hop_latency_ns = 10
prefetch_buffer_gb = 1
[trace]
kind = "synthetic"
zipf_alpha = 1.0
rho = 0.5
drift_every = 10
tokens_per_batch = 8
micro_batches = 20
seed = 3
[policy]
window_batches = 10
"""


def small_instance(tmp_path, capacity: int):
    path = tmp_path / "small.toml"
    path.write_text(SMALL.format(capacity=capacity))
    return path


def test_cli_solve_json_and_sglang_round_trip(tmp_path, capsys):
    import json

    from comoe_opt.cli import main
    from comoe_opt.formats import read_sglang

    instance = small_instance(tmp_path, capacity=5)
    out = tmp_path / "sglang.json"
    assert (
        main(["solve", str(instance), "--export", "sglang", "-o", str(out), "--work-limits", "--json"]) == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["status"] == "optimal" and report["gap"] <= 1e-3
    assert report["bound"] <= report["objective"]
    placement = read_sglang(out, chiplets=2)
    assert (placement.replicas() >= 1).all()  # every logical expert present
    assert main(["solve", str(instance), "--rolling", "--method", "greedy", "--json"]) == 0
    rolling = json.loads(capsys.readouterr().out)
    assert [w["window"] for w in rolling["windows"]] == [0, 1]


def test_cli_solve_user_errors_are_one_line(tmp_path, capsys):
    from comoe_opt.cli import main

    instance = small_instance(tmp_path, capacity=1)
    out = tmp_path / "x.json"
    code = main(["solve", str(instance), "--method", "static", "--export", "sglang", "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "SGLang" in err
    assert not out.exists()
    assert main(["solve", str(instance), "--window", "7"]) == 2
    assert "outside" in capsys.readouterr().err


def test_spare_pages_take_replicas_without_raising_the_objective():
    from comoe_opt.residency.heuristics.fill import fill_spare

    # room for 6 pages, 3 experts: the optimum needs 3; the spare ones replicate the burstiest expert
    p = problem(miss=[[5, 5, 5]], work=[[1, 1, 1]], capacity=[3, 3], tokens=[[9, 1, 1]])
    result = solve(p, "milp", time_limit_s=math.inf)
    assert result.solution.pages > 3 and result.report.spare_replicas > 0
    assert result.solution.replicas()[0, 0] == 2  # the expert with the largest peak per replica
    assert not check_feasible(p, result.solution)
    base = Placement(np.array([[[True, False], [False, True], [True, False]]]))
    filled = fill_spare(p, base)
    assert score(p, filled).total <= score(p, base).total + 1e-9
    # with copies priced, only replicas already in place may be added: none here
    priced = problem(
        miss=[[5, 5, 5]], work=[[1, 1, 1]], capacity=[3, 3], tokens=[[9, 1, 1]], copy_ms=1.0,
        previous=base.resident,
    )  # fmt: skip
    assert fill_spare(priced, base).pages == base.pages


def test_hot_counts_leased_replicas_against_its_pages():
    # 5 pages for 4 experts that must all stay resident; expert 0's two leased replicas already
    # use the one page `hot` would spend on an extra replica, so there is none left to add.
    leased = np.zeros((1, 4, 2), dtype=bool)
    leased[0, 0, :] = True
    p = problem(miss=[[1, 1, 1, 1]], work=[[4, 3, 2, 1]], capacity=[3, 2], leased=leased, all_resident=True)
    placement = HEURISTICS["hot"](p)
    assert not check_feasible(p, placement)
    assert placement.replicas()[0].tolist() == [2, 1, 1, 1]


def test_hot_replicates_only_in_spare_pages():
    # 6 pages for 8 experts: nothing is spare, so `hot` is `static` and never evicts for a replica;
    # `hot-evict` takes its share (1 page of 6) for a replica of the hottest expert.
    short = problem(
        miss=[[8, 7, 6, 5, 4, 3, 2, 1]], work=[[8, 7, 6, 5, 4, 3, 2, 1]], capacity=[3, 3],
        tokens=[[8, 7, 6, 5, 4, 3, 2, 1]],
    )  # fmt: skip
    hot, static, evicting = (HEURISTICS[m](short) for m in ("hot", "static", "hot-evict"))
    assert np.array_equal(hot.replicas(), static.replicas())
    assert hot.distinct == 6 and hot.replica_factor() == 1.0
    assert evicting.distinct == 5 and evicting.replicas()[0, 0] == 2  # an expert evicted for a replica
    # 12 pages for 8 experts: 4 spare, of which hot spends at most 20% of the pages (2)
    roomy = problem(
        miss=[[8, 7, 6, 5, 4, 3, 2, 1]], work=[[8, 7, 6, 5, 4, 3, 2, 1]], capacity=[6, 6],
        tokens=[[8, 7, 6, 5, 4, 3, 2, 1]],
    )  # fmt: skip
    spare = HEURISTICS["hot"](roomy)
    assert spare.distinct == 8 and spare.replicas()[0].tolist() == [2, 2, 1, 1, 1, 1, 1, 1]
