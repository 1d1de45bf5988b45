"""`comoe-opt compare`: SGLang's LP dispatch and our min-cost flow reach the same optimum (up to
whole tokens), the routings order as they must, and the verb runs on a trace and on a dump."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from conftest import small_table
from scipy.optimize import linprog

from comoe_opt.evaluator.compare import CROSSFIT, ROUTINGS, STATIC, CompareSettings, compare
from comoe_opt.evaluator.frontier import peer_points
from comoe_opt.evaluator.sweep import redundancy_sweep
from comoe_opt.instance import instance_from_table
from comoe_opt.mapping import LayerCosts, MappingProblem, solve_min_cost_flow
from comoe_opt.mapping.problem import NEVER
from comoe_opt.replay import Rolling, Window, replay, serve
from comoe_opt.residency.placement import Placement
from comoe_opt.trace import instance_batches
from comoe_opt.trace.batching import step_counts, windows


def device_peak(counts: np.ndarray, resident: np.ndarray, routing: str) -> np.ndarray:
    """[n, L] the busiest device's tokens of counts [n, L, E] on replica map [L, E, C]."""
    return serve(resident.astype(np.int64), counts, routing).peak


def _lp_max_load(counts: np.ndarray, resident: np.ndarray) -> float:
    """SGLang's LPLB: min M s.t. each expert's tokens split over its replicas, every device <= M."""
    experts, devices = resident.shape
    pairs = [(e, c) for e in range(experts) for c in range(devices) if resident[e, c]]
    n = len(pairs) + 1  # x per (expert, replica), then M
    a_eq = np.zeros((experts, n))
    a_ub = np.zeros((devices, n))
    for i, (e, c) in enumerate(pairs):
        a_eq[e, i] = 1.0
        a_ub[c, i] = 1.0
    a_ub[:, -1] = -1.0
    cost = np.zeros(n)
    cost[-1] = 1.0
    res = linprog(cost, A_ub=a_ub, b_ub=np.zeros(devices), A_eq=a_eq, b_eq=counts, method="highs")
    assert res.status == 0
    return float(res.fun)


def _flow_max_load(counts: np.ndarray, resident: np.ndarray) -> int:
    """Our min-cost flow on whole tokens: one tick per token, every replica ready at once."""
    experts, devices = resident.shape
    costs = LayerCosts(
        ready=np.where(resident, 0, NEVER).astype(np.int64),
        start=np.zeros(devices, dtype=np.int64),
        token_time=np.ones(devices, dtype=np.int64),
        finish=np.zeros(devices, dtype=np.int64),
        resident=resident,
    )
    tokens = np.repeat(np.arange(experts), counts)[:, None]
    return int(solve_min_cost_flow(MappingProblem(tokens, costs)).report.makespan_ticks)


@pytest.mark.parametrize("seed", range(12))
def test_flow_reaches_the_lp_optimum_in_whole_tokens(seed):
    rng = np.random.default_rng(seed)
    experts, devices = int(rng.integers(3, 9)), int(rng.integers(2, 6))
    resident = rng.random((experts, devices)) < 0.35
    resident[np.arange(experts), rng.integers(0, devices, experts)] = True  # every expert placed
    counts = rng.integers(0, 30, experts)
    counts[0] += 1
    lp = _lp_max_load(counts.astype(float), resident)
    ours = device_peak(counts[None, None, :], resident[None], "lp")[0, 0]
    assert ours == pytest.approx(lp, rel=1e-9, abs=1e-9)  # the cut condition is the LP's optimum
    flow = _flow_max_load(counts, resident)
    assert flow == int(np.ceil(lp - 1e-9))  # and the flow its optimum in whole tokens
    assert device_peak(counts[None, None, :], resident[None], "flow")[0, 0] == flow


def test_even_split_by_hand():
    """formulations/mapping.md, "The even split": an expert's tokens dealt over its slots in turn from
    its offset among the step's selections (vLLM's position modulo, in expert order)."""
    from comoe_opt.best_split.even import even_loads

    # expert 0 (5 tokens) on devices 0 and 1: offset 0, slots get 3 and 2; expert 1 (4) on device 1
    slots = np.array([[[1, 1, 0], [0, 1, 0]]])
    assert even_loads(np.array([[[5, 4]]]), slots)[0, 0].tolist() == [3, 6, 0]
    # expert 1 (3 tokens) on devices 1 and 2 after expert 0's 3 selections: offset 3, so its first
    # slot (device 1) takes positions 4 and its second (device 2) positions 3 and 5
    slots = np.array([[[1, 0, 0], [0, 1, 1]]])
    assert even_loads(np.array([[[3, 3]]]), slots)[0, 0].tolist() == [3, 1, 2]
    # two slots of one expert on one device take two shares
    slots = np.array([[[2, 1]]])
    assert even_loads(np.array([[[6]]]), slots)[0, 0].tolist() == [4, 2]
    resident = np.array([[[True, True, False], [False, True, False]]])
    assert device_peak(np.array([[[5, 4]]]), resident, "lp")[0, 0] == pytest.approx(4.5)


def _instance():
    table = small_table()
    table["hardware"].update(capacity_gb=9)  # 3 slots per layer on each device: 12 for 8 experts
    table["trace"].update(micro_batches=12)
    table["policy"].update(window_batches=4, history_windows=1, all_resident=True, balance_scenarios=4)
    return instance_from_table(table, "small.toml")


PEERS = ("eplb", "sglang-vec", "vllm-default", "ascend-swift", "comoe")


def test_compare_orders_routings_and_bounds_every_peer():
    instance = _instance()
    steps = step_counts(instance_batches(instance))
    assert steps.sum(axis=2).min() == 8 * 2  # tokens x top-k per step and layer
    # hindsight and the bound on work limits (the default): nothing here depends on the clock
    result = compare(instance, steps, CompareSettings(peers=PEERS, bound_windows=2, crossfit=True))
    rows = {(r["peer"], r["routing"]): r for r in result["rows"]}
    for peer in PEERS:
        even, lp, flow = (rows[peer, routing] for routing in ("even", "lp", "flow"))
        assert lp["p95"] <= flow["p95"] + 1e-12
        if peer != "comoe":  # CoMoE's even row is its plan for the even split: another plan
            assert lp["p95"] <= even["p95"] + 1e-12
            assert lp["balancedness_sglang"] >= even["balancedness_sglang"] - 1e-12
        assert flow["gap_to_bound"] >= -1e-9  # milp's bound is a lower bound of every plan
    assert result["comoe_planned_for"] == {"even": "even", "lp": "best", "flow": "best"}
    assert rows["oracle", "flow"]["p50"] >= 1.0 and "hindsight" in {r["peer"] for r in result["rows"]}
    # the cross-fitted hindsight is a limit beside hindsight, never a planning peer
    assert rows[CROSSFIT, "flow"]["p95"] >= rows["oracle", "flow"]["p95"] - 1e-12
    # the static plan (EPLB's warm-up plan kept) is the frontier's no-copies end
    assert {p.planner for p in peer_points(result)} == {*PEERS, STATIC}
    assert all(rows[STATIC, r]["copies_per_replan"] == 0 == rows[STATIC, r]["migration_ms"] for r in ROUTINGS)
    for peer in (*PEERS, STATIC):  # net time: time saved per step against EPLB's row x interval - stall
        for routing in ROUTINGS:
            row, base = rows[peer, routing], rows["eplb", routing]
            saved = (base["step_ms_mean"] - row["step_ms_mean"]) * result["replan_every"]
            assert row["net_ms_per_replan"] == pytest.approx(saved - row["migration_ms"])
            assert row["layer_ms_p50"] <= row["layer_ms_p95"] and row["layer_ms_mean"] > 0
    # copies per re-plan, recounted from EPLB's own plans: pages resident now and not before
    eplb = replay(Rolling(instance, "eplb"), steps, windows(steps.shape[0], instance.policy.window_batches))
    moved = [int((b.resident & ~a.resident).sum()) for a, b in itertools.pairwise(eplb.placements)]
    assert rows["eplb", "even"]["copies_per_replan"] == pytest.approx(np.mean(moved))
    # window 0 is the warm-up: no row scores it
    assert result["scored_from"] == instance.policy.window_batches
    # the same table from two worker processes: every task is a function of the input alone
    settings = CompareSettings(peers=PEERS, bound_windows=2, crossfit=True, jobs=2)
    assert _table(compare(instance, steps, settings)) == _table(result)


def test_comoe_rows_come_from_the_plan_made_for_their_dispatch():
    instance = _instance()
    steps = step_counts(instance_batches(instance))

    def comoe_rows(splits):
        settings = CompareSettings(peers=("eplb", "comoe"), bound_windows=0, comoe_splits=splits)
        result = compare(instance, steps, settings)
        return {r["routing"]: _timeless(r) for r in result["rows"] if r["peer"] == "comoe"}

    both, best, even = comoe_rows(("best", "even")), comoe_rows(("best",)), comoe_rows(("even",))
    assert both["even"] == even["even"] and both["lp"] == best["lp"] and both["flow"] == best["flow"]
    assert even["lp"]["p95"] <= even["even"]["p95"] + 1e-12  # one plan: the best split's at most


def _timeless(row):
    return {k: v for k, v in row.items() if k not in ("plan_s", "net_ms_per_replan")}


def _table(result):
    """What compare reports, without the planning seconds (the one figure that is timed)."""
    rows = [{k: v for k, v in r.items() if k != "plan_s"} for r in result["rows"]]
    return rows, result["bound"], result["migration_weight"]


def test_crossfit_never_serves_a_step_with_a_plan_that_saw_it():
    """Each plan records the steps it saw and serves only steps it did not see: every window's two
    halves plan for each other; a one-step tail window is served by the plan in service."""
    steps = np.arange(9, dtype=float)[:, None, None] * np.ones((9, 1, 2))  # step i holds i
    seen: list[set[int]] = []

    class Recorder:
        name = "recorder"

        def plan(self, steps: np.ndarray, window: Window, in_service: Placement | None) -> Placement:
            seen.append({int(v) for v in steps[window.planned_on][:, 0, 0]})
            return Placement(np.ones((1, 2, 1), dtype=bool))

    run = replay(Recorder(), steps, [(0, 4), (4, 8), (8, 9)], foresight="crossfit")
    assert seen == [{0, 1, 2, 3}, {4, 6}, {5, 7}]  # window 0 the warm-up, planned on itself
    served = {int(i): k for k, (idx, _) in enumerate(run.parts) for i in idx}
    assert sorted(served) == [4, 5, 6, 7, 8]  # window 0 is not scored
    assert served[5] == 0 and served[7] == 0 and served[4] == 1 and served[6] == 1  # each half by the other's
    assert served[8] == 2 and run.parts[2][1] is run.placements[1]  # the tail: the plan in service
    assert len(run.plan_s) == 3 and len(run.copies) == 2


def test_redundancy_sweep_holds_more_memory_per_slot():
    instance = _instance()
    steps = step_counts(instance_batches(instance))
    out = redundancy_sweep(instance, steps, [0, 4], CompareSettings(peers=("eplb", "comoe"), bound_windows=1))
    first, second = out["points"]
    assert (first["slots_per_device"], second["slots_per_device"]) == (2, 3)
    assert second["gb_per_device"] > first["gb_per_device"]
    assert second["oracle"]["p95"] <= first["oracle"]["p95"] + 1e-12  # more replicas never hurt the oracle


def test_cli_compare_on_a_dump_and_user_errors(tmp_path, write_toml, cli):
    table = small_table()
    table["hardware"].update(capacity_gb=9)
    table["policy"].update(window_batches=4, history_windows=1, all_resident=True, balance_scenarios=4)
    path = write_toml(table)
    counts = np.random.default_rng(0).integers(0, 5, (8, 3, 8))  # two windows of 4: one scored
    dump = tmp_path / "dump.npz"
    np.savez(dump, logical_count=counts)
    run = cli(
        "compare",
        str(path),
        "--counts",
        str(dump),
        "--peers",
        "eplb,sglang-vec",
        "--bound-windows",
        "1",
        "--json",
    )
    assert run.code == 0
    result = json.loads(run.out)
    assert result["steps"] == 8 and {r["peer"] for r in result["rows"]} >= {"eplb", "sglang-vec", "oracle"}
    rows = {(r["peer"], r["routing"]): r for r in result["rows"]}
    for peer in ("eplb", "sglang-vec"):  # the numbers, not only their presence
        even, lp, flow = (rows[peer, routing] for routing in ("even", "lp", "flow"))
        assert 1.0 <= lp["p95"] <= min(even["p95"], flow["p95"]) + 1e-12  # a ratio of peak to mean
        assert lp["p50"] <= lp["p95"] <= lp["p99"]
        assert 0.0 < even["balancedness_sglang"] <= lp["balancedness_sglang"] + 1e-12 <= 1.0 + 1e-12
        assert flow["gap_to_bound"] >= -1e-9  # milp's bound is below every plan
    bad = cli("compare", str(path), "--peers", "nobody")
    assert bad.code == 2 and "unknown 'nobody'" in bad.err
    odd = cli("compare", str(path), "--redundant", "3")
    assert odd.code == 2 and "split evenly" in odd.err


def test_cli_lists_the_library_peers():
    from comoe_opt.cli.choices import COMPARE_PEERS
    from comoe_opt.evaluator.compare import COMPARE_PEERS as LIBRARY_PEERS

    assert COMPARE_PEERS == LIBRARY_PEERS


@pytest.mark.parametrize("devices", [6, 16, 32])
def test_lp_routing_peak_is_the_lps_optimum_beyond_enumerated_device_sets(devices):
    """`lp`'s largest device load is the fractional routing LP's optimum, also past the devices whose
    sets are enumerated (there by parametric min cut: 2^32 sets would not fit in memory)."""

    rng = np.random.default_rng(devices)
    experts = 24
    resident = np.zeros((1, experts, devices), dtype=bool)
    for e in range(experts):
        resident[0, e, rng.choice(devices, size=rng.integers(1, 4), replace=False)] = True
    counts = rng.poisson(3, size=(4, 1, experts))
    peaks = device_peak(counts, resident, "lp")[:, 0]
    pairs = np.argwhere(resident[0])  # (expert, device) of every replica; variables: their tokens, then T
    for step, peak in enumerate(peaks):
        served = np.zeros((experts, len(pairs) + 1))
        served[pairs[:, 0], np.arange(len(pairs))] = 1
        on_device = np.zeros((devices, len(pairs) + 1))
        on_device[pairs[:, 1], np.arange(len(pairs))] = 1
        on_device[:, -1] = -1
        cost = np.r_[np.zeros(len(pairs)), 1.0]
        lp = linprog(cost, A_ub=on_device, b_ub=np.zeros(devices), A_eq=served, b_eq=counts[step, 0])
        assert lp.status == 0
        assert peak == pytest.approx(lp.fun, abs=1e-9)


@pytest.mark.parametrize("devices", [24, 32])
def test_flow_routing_is_the_min_cost_flow_beyond_enumerated_device_sets(devices):
    """`flow`'s largest device load at DeepSeek-V3's device count is what our min-cost flow
    reaches on whole tokens (its peak comes from min cut there, not from the 2^C sets)."""
    rng = np.random.default_rng(devices + 1)
    experts = 20
    resident = np.zeros((experts, devices), dtype=bool)
    for e in range(experts):
        resident[e, rng.choice(devices, size=rng.integers(1, 4), replace=False)] = True
    counts = rng.poisson(40, size=(3, experts))
    counts[:, 0] += 1500  # one hot expert: its replicas are the bottleneck, not the mean
    peaks = device_peak(counts[:, None, :], resident[None], "flow")[:, 0]
    for step, peak in enumerate(peaks):
        assert peak == _flow_max_load(counts[step], resident)
