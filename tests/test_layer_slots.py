"""Plans laid out within `policy.layer_slots` (residency/layer_slots.py): serving engines give every
GPU the same slots in every layer, so no device may hold more of one layer than its share."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import small_table
from hypothesis import given, settings
from hypothesis import strategies as st

from comoe_opt.instance import instance_from_table
from comoe_opt.residency.layer_slots import laid_out, over_layer_slots
from comoe_opt.residency.objective import layer_shares
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.problem import residency_problem
from comoe_opt.residency.solve import solve
from comoe_opt.results import SolveResult, Status
from comoe_opt.stats.demand import window_demand
from comoe_opt.trace import instance_batches


def _problem(slots: int, seed: int = 3, scenarios: int = 0):
    table = small_table()  # 3 layers x 8 experts on 4 devices of 4 pages each
    table["hardware"]["capacity_gb"] = 3 * slots  # room for `slots` replicas of each layer per device
    table["trace"]["seed"] = seed
    table["policy"].update(all_resident=True, layer_slots=slots, balance_scenarios=scenarios)
    instance = instance_from_table(table, "small.toml")
    demand = window_demand(instance_batches(instance).window(0, 4), instance.policy)
    return residency_problem(instance, demand)


def test_a_device_over_its_share_hands_a_replica_to_one_under_it() -> None:
    problem = _problem(slots=3)
    resident = np.zeros((3, 8, 4), dtype=bool)
    for layer in range(3):
        for e in range(8):
            resident[layer, e, e % 4] = True  # two per device
    resident[0, [2, 3], 0] = True  # layer 0: device 0 holds 4 (> 3): experts 0, 4, 2, 3
    resident[0, 2, 2] = False
    resident[0, 3, 3] = False
    resident[0, 0, 1] = resident[0, 4, 2] = True  # devices 1..3 hold 3, 3, 1
    placement = Placement(resident)
    assert over_layer_slots(problem, placement) == [(0, 0)]
    result = SolveResult("by hand", Status.FEASIBLE, np.inf, -np.inf, 0.0, placement, report=_report(problem))
    fixed = laid_out(problem, result)
    held = fixed.solution.resident.sum(axis=1)
    assert held[0, 0] == 3 and held[0].max() == 3 and held[0].sum() == 10  # [4, 3, 2, 1] before
    assert fixed.report.layout_moves == 1
    assert (fixed.solution.resident[1:] == placement.resident[1:]).all()  # other layers untouched
    # the move taken is the best of every move off device 0 onto a device with room (brute force)
    scores = {}
    for e in np.flatnonzero(placement.resident[0, :, 0]):
        for h in (2, 3):
            if not placement.resident[0, e, h]:
                trial = placement.resident.copy()
                trial[0, e, 0], trial[0, e, h] = False, True
                scores[e, h] = problem.batches * layer_shares(problem, trial[0], 0)[0]
    chosen = fixed.solution.resident[0] & ~placement.resident[0]
    ((e, h),) = np.argwhere(chosen)
    assert scores[e, h] == pytest.approx(min(scores.values()))


def _report(problem):
    from comoe_opt.residency.report import HeuristicReport
    from comoe_opt.results import Timing

    return HeuristicReport(terms=None, timing=Timing(time_limit_s=None, total_s=0.0, phases={}))


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 50), slots=st.sampled_from([2, 3]), method=st.sampled_from(["greedy", "milp"]))
def test_every_method_plans_within_the_share_and_keeps_its_bound(seed: int, slots: int, method: str) -> None:
    problem = _problem(slots, seed, scenarios=3)
    result = solve(problem, method)
    assert result.solution is not None and not over_layer_slots(problem, result.solution)
    assert result.bound <= result.objective + 1e-9  # the bound of the plan without the share stands
    free = solve(dataclasses.replace(problem, layer_slots=0), method)
    if result.report.layout_moves == 0:
        assert result.objective == pytest.approx(free.objective)  # nothing to lay out: the same plan


def test_a_dump_planned_for_gpus_exports_the_slots_asked_for(tmp_path: Path, cli) -> None:
    rng = np.random.default_rng(7)  # Llama-4-Maverick's recorder rows: 48 layers, MoE on the odd ones
    counts = np.zeros((8, 48, 128), dtype=np.int64)
    counts[:, 1::2] = rng.poisson(rng.gamma(0.5, 8.0, size=128), size=(8, 24, 128))
    dump, out = tmp_path / "m.npz", tmp_path / "map.json"
    np.savez(dump, logical_count=counts)
    args = ["--gpus", 8, "--slots", 144, "--model", "llama-4-maverick", "--gpu", "h200"]
    run = cli("solve", "--counts", dump, *args, "--work-limits", "--export", "sglang", "-o", out, "--json")
    assert run.code == 0, run.err
    rows = json.loads(out.read_text())["physical_to_logical_map"]
    assert {len(row) for row in rows} == {144}  # 18 per GPU in every layer, as asked


def _wide_problem(seed: int):
    """16 devices (past the cut condition's enumeration: min cuts), 2 slots per layer each."""
    table = small_table()
    table["model"].update(layers=2, experts_per_layer=24)
    table["hardware"].update(chiplets=16, capacity_gb=8, nop_hops=1)
    table["trace"].update(seed=seed, tokens_per_batch=64)
    table["policy"].update(all_resident=True, layer_slots=2, balance_scenarios=4)
    instance = instance_from_table(table, "wide.toml")
    demand = window_demand(instance_batches(instance).window(0, 4), instance.policy)
    return residency_problem(instance, demand)


def _crowded(problem, seed: int) -> Placement:
    """Every expert on a random device, a third with a second replica: some devices over 2."""
    rng = np.random.default_rng(seed)
    resident = np.zeros((problem.layers, problem.experts, problem.chiplets), dtype=bool)
    for layer in range(problem.layers):
        resident[layer, np.arange(problem.experts), rng.integers(0, 8, problem.experts)] = True
        extra = rng.permutation(problem.experts)[: problem.experts // 3]
        resident[layer, extra, rng.integers(0, problem.chiplets, extra.size)] = True
    return Placement(resident)


@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 50))
def test_the_layouts_bounds_skip_only_moves_that_cannot_win(seed: int) -> None:
    # Past 12 devices a move's makespans are min cuts; the layout bounds each from the bottleneck
    # sets and solves only the moves whose bound can beat the best so far: the same plan as
    # solving every move, and every bound at or below the makespan it bounds.
    from comoe_opt.residency import layer_slots
    from comoe_opt.residency.objective import layer_makespan

    problem = _wide_problem(seed % 5)
    placement = _crowded(problem, seed)
    assert over_layer_slots(problem, placement)
    result = SolveResult("by hand", Status.FEASIBLE, np.inf, -np.inf, 0.0, placement, report=_report(problem))
    pruned = laid_out(problem, result)
    floor_of = layer_slots._Floor.of
    try:
        layer_slots._Floor.of = classmethod(lambda cls, *args: None)  # type: ignore[method-assign]
        solved = laid_out(problem, result)
    finally:
        layer_slots._Floor.of = floor_of  # type: ignore[method-assign]
    assert np.array_equal(pruned.solution.resident, solved.solution.resident)
    layer = placement.resident[0]
    floor = layer_slots._Floor.of(problem, layer, 0)
    assert floor is not None
    for e, g in zip(*np.nonzero(layer), strict=True):
        for h in range(problem.chiplets):
            if not layer[e, h]:
                trial = layer.copy()
                trial[e, g], trial[e, h] = False, True
                bound = floor.makespan(int(e), int(g), int(h))
                assert bound <= layer_makespan(problem, trial, 0) * (1 + 1e-12)


def test_a_layer_holding_more_replicas_than_its_slots_drops_one_that_keeps_another() -> None:
    # One memory for all layers lets a plan hold 9 replicas of a layer in 4 x 2 slots. Device 0
    # holds three experts' only replicas and no device has a free slot, so nothing on it can move
    # until a replica of expert 0 (held twice) goes: then one of device 0's moves there. Capacity
    # is exactly 2 slots x 3 layers, so a layer left over its slots is a device over its capacity.
    problem = _problem(slots=2)
    resident = np.zeros((3, 8, 4), dtype=bool)
    for layer in range(1, 3):
        resident[layer, np.arange(8), np.arange(8) % 4] = True  # two per device
    for e, c in [(1, 0), (2, 0), (3, 0), (4, 1), (0, 1), (5, 2), (6, 2), (7, 3), (0, 3)]:
        resident[0, e, c] = True
    placement = Placement(resident)
    result = SolveResult("by hand", Status.FEASIBLE, np.inf, -np.inf, 0.0, placement, report=_report(problem))
    fixed = laid_out(problem, result)  # scores the plan: raises if a device is over its capacity
    held = fixed.solution.resident
    assert held[0].sum(axis=0).max() == 2 and held[0].sum() == 8
    assert held[0].any(axis=1).all()  # every expert keeps a replica
    assert held[0, 0].sum() == 1 and fixed.report.layout_moves == 2  # one drop, one move
