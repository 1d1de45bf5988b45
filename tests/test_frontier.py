"""The copies–balance frontier of `compare`: Pareto curve and "beaten at equal copies" by hand, and
the sweep on a small instance."""

from __future__ import annotations

import json

import numpy as np
from conftest import small_table
from test_compare import _instance  # compare's small instance: 12 slots for 8 experts

from comoe_opt.evaluator.compare import CompareSettings, compare
from comoe_opt.evaluator.frontier import FrontierPoint, beaten_by, frontier, frontier_at, pareto, peer_points
from comoe_opt.trace import instance_batches
from comoe_opt.trace.batching import step_counts


def point(copies: float, p95: float, name: str = "comoe") -> FrontierPoint:
    return FrontierPoint(name, "migration_weight", 0.0, copies, p95, "flow")


def test_pareto_and_beaten_by_hand() -> None:
    # copies 0 -> 1.50, 10 -> 1.30, 20 -> 1.35 (dominated by 10), 40 -> 1.20, 40 -> 1.25 (dominated)
    points = [point(20, 1.35), point(0, 1.5), point(40, 1.25), point(10, 1.3), point(40, 1.2)]
    curve = pareto(points)
    assert [(p.copies, p.p95) for p in curve] == [(0, 1.5), (10, 1.3), (40, 1.2)]
    # a peer at 12 copies and P95 1.30: the curve's 10-copy point has fewer copies and the same P95
    assert beaten_by(point(12, 1.3, "eplb"), curve) == point(10, 1.3)
    # at 9 copies only the 0-copy point qualifies on copies, and its 1.50 is higher than 1.40
    assert beaten_by(point(9, 1.4, "eplb"), curve) is None
    # many copies, good balance: the 40-copy point is worse (1.20 > 1.10), so not beaten
    assert beaten_by(point(500, 1.1, "flashlb"), curve) is None
    # equal copies and equal P95 count as beaten (no more copies and no higher P95)
    assert beaten_by(point(40, 1.2, "x"), curve) == point(40, 1.2)
    assert frontier_at(curve, 39) == 1.3 and frontier_at(curve, 40) == 1.2 and frontier_at(curve, -1) is None


def test_peer_points_take_each_peers_best_routing() -> None:
    rows = [
        {"peer": "eplb", "routing": "even", "p95": 1.4, "copies_per_replan": 7.0},
        {"peer": "eplb", "routing": "lp", "p95": 1.2, "copies_per_replan": 7.0},
        {"peer": "oracle", "routing": "flow", "p95": 1.0},
        {"peer": "hindsight", "routing": "flow", "p95": 1.1, "copies_per_replan": 0.0},
    ]
    (only,) = peer_points({"rows": rows})
    assert (only.planner, only.routing, only.p95, only.copies) == ("eplb", "lp", 1.2, 7.0)


def test_frontier_on_a_small_instance() -> None:
    instance = _instance()
    steps = step_counts(instance_batches(instance))
    settings = CompareSettings(peers=("eplb", "sglang-vec", "comoe"), bound_windows=0)
    result = frontier(instance, steps, settings, weights=(0.0, 5.0), move_costs=(0.0, 0.016))
    weights = sorted(p["value"] for p in result["comoe"])
    assert weights == sorted({0.0, 5.0, instance.policy.migration_weight})
    assert {p["planner"] for p in result["peers"]} == {"eplb", "sglang-vec"}
    assert {p["planner"] for p in result["dropin"]} == {"drop-in even", "drop-in lp"}
    curve = [FrontierPoint(**p) for p in result["curve"]]
    points = {p["planner"]: FrontierPoint(**p) for p in [*result["peers"], *result["dropin"]]}
    for name, winner in result["beaten"].items():
        if winner is None:
            assert not any(c.dominates(points[name]) for c in curve)
        else:
            assert FrontierPoint(**winner).dominates(points[name]) and FrontierPoint(**winner) in curve
    # a free copy price never copies less than the highest price (the planner pays less per copy)
    by_weight = {p["value"]: p for p in result["comoe"]}
    assert by_weight[0.0]["copies"] >= by_weight[5.0]["copies"]
    # the same input gives the same frontier (work limits, not time limits)
    again = frontier(instance, steps, settings, weights=(0.0, 5.0), move_costs=(0.0, 0.016))
    assert again == result


def test_frontier_reuses_compare_peers_and_cli(write_toml, cli) -> None:
    instance = _instance()
    steps = step_counts(instance_batches(instance))
    settings = CompareSettings(peers=("eplb", "comoe"), bound_windows=0)
    peers = peer_points(compare(instance, steps, settings))
    result = frontier(instance, steps, settings, peers=peers, weights=(0.0,), move_costs=(0.002,))
    # the static plan (EPLB's first plan kept) is the frontier's no-copies end
    assert [p["planner"] for p in result["peers"]] == ["eplb", "comoe", "static"]
    assert result["peers"][-1]["copies"] == 0
    table = small_table()
    table["hardware"].update(capacity_gb=9)
    table["trace"].update(micro_batches=8)
    table["policy"].update(window_batches=4, history_windows=1, all_resident=True, balance_scenarios=4)
    run = cli(
        "compare",
        str(write_toml(table)),
        "--peers",
        "eplb,comoe",
        "--bound-windows",
        "0",
        "--frontier",
        "--json",
        "--migration-weights",
        "0",
        "--move-costs",
        "0.002",
    )
    assert run.code == 0, run.err
    out = json.loads(run.out)
    assert "frontier" in out and out["frontier"]["curve"]
    assert np.isfinite(out["frontier"]["default"]["p95"])
    weights = sorted(p["value"] for p in out["frontier"]["comoe"])
    assert weights == sorted({0.0, instance.policy.migration_weight})  # the instance's own is added
    bad = cli("compare", str(write_toml(table)), "--frontier", "--move-costs", "0,-1")
    assert bad.code == 2 and "--move-costs" in bad.err
