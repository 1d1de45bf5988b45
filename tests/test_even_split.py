"""The slow loop planned for the engines' even split (`policy.split = "even"`,
residency/even_split.py, residency/search/even_descent.py): the objective by hand, the best
split's bound holding for it, the descent never worse and within every limit, no false `optimal`
against a brute force."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from conftest import small_table
from hypothesis import given
from hypothesis import strategies as st
from test_scenarios import brute_force, scenario_problem, scenario_problems

from comoe_opt.instance import instance_from_table
from comoe_opt.residency.even_split import even_layer
from comoe_opt.residency.layer_slots import over_layer_slots
from comoe_opt.residency.objective import check_feasible, score
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.problem import ResidencyProblem, residency_problem
from comoe_opt.residency.search.even_descent import even_descent
from comoe_opt.residency.solve import solve
from comoe_opt.results import Status
from comoe_opt.stats.demand import window_demand
from comoe_opt.trace import instance_batches

TOL = 1e-6


def even(p: ResidencyProblem, read: float = 0.0) -> ResidencyProblem:
    """`p` (scenario work = tokens at 1 ms each) planned for the even split, every busy replica
    reading its page in `read` ms: the scenarios' work is the roofline of the whole load, as
    residency_problem builds it, so that the best split's objective is the same problem's."""
    tokens = p.scenario_work[..., 0]  # [S, L, E]
    chiplets = p.chiplets
    work = np.maximum((tokens > 0) * read, tokens)[..., None].repeat(chiplets, axis=-1)
    rates = (np.full(chiplets, read), np.ones(chiplets))
    return dataclasses.replace(
        p,
        split="even",
        scenario_tokens=tokens,
        work_rates=rates,
        scenario_work_ms=work,
        work_ms=work.mean(axis=0),
    )


def test_even_split_by_hand() -> None:
    # A (4 tokens) on chiplets 0 and 1, B (2 tokens) on 0. Even: A gives 2 to each, so chiplet 0
    # serves 2 + 2 = 4 and chiplet 1 serves 2; the best split moves A's tokens to 1: (4 + 2) / 2 = 3.
    p = even(scenario_problem([[[4.0, 2.0]]], capacity=[2, 2]))
    resident = np.array([[True, True], [True, False]])
    assert even_layer(p, resident, 0)[0] == pytest.approx(4.0)
    assert score(dataclasses.replace(p, split="best"), Placement(resident[None])).balance_ms == pytest.approx(
        3.0
    )
    # with a page read of 3 ms per busy replica: A's halves take max(3, 2) = 3 each, B max(3, 2)
    assert even_layer(even(p, read=3.0), resident, 0)[0] == pytest.approx(6.0)


@given(scenario_problems(), st.sampled_from([0.0, 2.0]))
def test_the_best_split_bounds_the_even_split_for_every_placement(p, read) -> None:
    p_even = even(p, read)
    p_best = dataclasses.replace(p_even, split="best")
    rng = np.random.default_rng(p.experts * 7 + p.chiplets)
    for _ in range(8):
        placement = Placement(rng.random((1, p.experts, p.chiplets)) < 0.6)
        if check_feasible(p_even, placement):
            continue
        assert score(p_best, placement).total <= score(p_even, placement).total + TOL


@given(scenario_problems(), st.sampled_from([0.0, 2.0]))
def test_descent_keeps_every_limit_and_never_raises_the_objective(p, read) -> None:
    p = even(p, read)
    start = p.previous
    found = even_descent(p, start)
    assert not check_feasible(p, found)
    if p.all_resident:
        assert found.resident.any(axis=2).all()
    assert (found.pages_per_chiplet() <= start.pages_per_chiplet()).all()  # drops free pages only
    assert score(p, found).total <= score(p, start).total + TOL
    assert np.array_equal(even_descent(p, start).resident, found.resident)  # deterministic


@given(scenario_problems(), st.sampled_from([0.0, 2.0]))
def test_milp_for_the_even_split_keeps_its_bound_and_claims_no_false_optimum(p, read) -> None:
    p = even(p, read)
    exact = brute_force(p)  # the even split's optimum over every replica map
    result = solve(p, "milp", mip_gap=0.0, time_limit_s=math.inf)
    scale = max(1.0, exact)
    assert result.bound <= exact + TOL * scale
    assert result.objective >= exact - TOL * scale
    assert score(p, result.solution).total == pytest.approx(result.objective, rel=1e-9, abs=1e-9)
    if result.status == Status.OPTIMAL:
        assert result.objective <= exact + TOL * scale


def test_descent_gives_a_hot_expert_a_replica_on_every_chiplet() -> None:
    # expert 0 takes 8 tokens, 1..3 one each; two chiplets of 3 pages, full. Start: 0, 1, 2 on
    # chiplet 0 and 1, 2, 3 on chiplet 1: chiplet 0 serves 8 + 0.5 + 0.5 = 9. A replace gives 0
    # a replica on chiplet 1 in place of 1's or 2's second: 4 + 1 + 0.5 on each, the optimum 5.5.
    p = even(scenario_problem([[[8.0, 1.0, 1.0, 1.0]]], capacity=[3, 3], all_resident=True, moves=50))
    start = Placement(np.array([[[True, False], [True, True], [True, True], [False, True]]]))
    found = even_descent(p, start)
    assert score(p, start).balance_ms == pytest.approx(9.0)
    assert (
        score(p, found).balance_ms
        == pytest.approx(5.5)
        == pytest.approx(brute_force(p) - score(p, found).nop_ms)
    )
    assert found.resident[0, 0].all()


def test_an_instance_planned_for_the_even_split_stays_within_its_layer_slots() -> None:
    table = small_table()  # 3 layers x 8 experts on 4 devices
    table["hardware"]["capacity_gb"] = 9
    table["policy"].update(all_resident=True, layer_slots=3, balance_scenarios=4, split="even")
    instance = instance_from_table(table, "small.toml")
    problem = residency_problem(
        instance, window_demand(instance_batches(instance).window(0, 4), instance.policy)
    )
    result = solve(problem, "milp")
    assert result.solution is not None and not over_layer_slots(problem, result.solution)
    # an engine's slot map is full and every slot takes a share: every slot holds a replica
    assert (result.solution.resident.sum(axis=1) == 3).all()
    assert result.bound <= result.objective + TOL * max(1.0, result.objective)
    best = solve(dataclasses.replace(problem, split="best"), "milp")
    # the even-split plan beats the best split's plan scored under the even split
    assert result.objective <= score(problem, best.solution).total + TOL


def test_solve_plans_a_dump_for_the_dispatch_asked(tmp_path, cli) -> None:
    rng = np.random.default_rng(5)
    counts = rng.poisson(rng.gamma(0.6, 6.0, size=16), size=(12, 2, 16))
    dump = tmp_path / "d.npz"
    np.savez(dump, logical_count=counts)
    runs = {}
    for dispatch in ("best", "even"):
        out = tmp_path / f"{dispatch}.json"
        args = ("--gpus", 4, "--slots", 24, "--scenarios", 6, "--work-limits", "--dispatch", dispatch)
        run = cli("solve", "--counts", dump, *args, "-o", out, "--json")
        assert run.code == 0, run.err
        runs[dispatch] = json.loads(run.out)
        assert runs[dispatch]["bound"] <= runs[dispatch]["objective"] * (1 + 1e-9)
    # the same bound (the best split's); the even split's objective is never below the best's optimum
    assert runs["even"]["bound"] == pytest.approx(runs["best"]["bound"])
    if runs["best"]["status"] == "optimal":
        assert runs["even"]["objective"] >= runs["best"]["objective"] * (1 - 1e-3)


@given(st.integers(0, 2**16), st.sampled_from([0.0, 2.0]))
def test_the_descents_kept_state_and_local_scores_are_its_full_ones(seed, read) -> None:
    # The descent keeps each scenario's loads and every expert's replica work up to date move by
    # move, and scores a replace on the chiplets it touches: both must equal the full computation.
    from comoe_opt.residency.search.even_descent import _LayerDescent

    rng = np.random.default_rng(seed)
    experts, chiplets = 6, 5
    p = even(scenario_problem(rng.integers(0, 6, (3, 1, experts)), [4] * chiplets, moves=0), read)
    held = rng.random((experts, chiplets)) < 0.5
    held[np.arange(experts), rng.integers(0, chiplets, experts)] = True
    descent = _LayerDescent(p, held, 0, np.zeros(0, dtype=np.int64))
    for _ in range(6):  # random swaps and replaces, as the descent applies them
        e, f = rng.choice(experts, 2, replace=False)
        c, d = rng.integers(0, chiplets, 2)
        if held[e, c] and not held[f, c] and held[e].sum() > 1:
            descent._replace(int(e), int(c), int(f))
        elif held[e, c] and held[f, d] and not held[e, d] and not held[f, c] and c != d:
            descent._swap(int(c), int(e), int(f), int(d))
        fresh = _LayerDescent(p, held.copy(), 0, np.zeros(0, dtype=np.int64))
        for name in ("r", "now", "fewer", "more", "nopsum", "copies"):
            assert np.array_equal(getattr(descent, name), getattr(fresh, name)), name
        assert np.array_equal(descent.loads, fresh.loads)
        ee, cc = np.nonzero(held)
        ff = rng.integers(0, experts, len(ee))
        ok = (ee != ff) & ~held[ff, cc]
        ee, cc, ff = ee[ok], cc[ok], ff[ok]
        loads = descent.loads[None] + descent._losses(ee, cc) + descent._gains(ff, cc)
        peaks, spread = descent._replace_scores(ee, cc, ff)
        assert np.allclose(peaks, loads.max(axis=2).mean(axis=1), rtol=1e-12, atol=1e-12)
        assert np.allclose(spread, (loads**2).sum(axis=2).mean(axis=1) - descent.spread, rtol=1e-9, atol=1e-9)
