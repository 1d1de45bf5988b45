"""One cost model: the slow loop, the fast loop and the evaluator price the same page, token, hop
and copy identically on every shipped instance, and by hand on a small one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT

from comoe_opt.evaluator.runtime import _DeviceLinks, _Runtime
from comoe_opt.evaluator.strategies import STRATEGIES
from comoe_opt.instance import instance_from_table, load_instance, with_overrides
from comoe_opt.mapping.problem import layer_costs
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.problem import residency_problem
from comoe_opt.stats.demand import demand_from_counts
from comoe_opt.trace import generate
from comoe_opt.trace.batching import make_batches

SHIPPED = sorted((ROOT / "instances").glob("*.toml"))


def _prices(path: Path) -> None:
    instance = load_instance(path)
    model, hw, costs = instance.model, instance.hardware, instance.costs
    counts = np.ones((model.layers, model.experts_per_layer))
    demand = demand_from_counts(counts, 8, model.top_k)
    first = residency_problem(instance, demand)
    previous = Placement(np.zeros((model.layers, model.experts_per_layer, hw.chiplets), dtype=bool))
    later = residency_problem(instance, demand, previous)
    # slow loop: a copy at the topology's link, NoP at the token's link time, work at read/FLOP rates
    assert first.copy_ms == 0.0  # the initial load is not a migration
    assert later.copy_ms == pytest.approx(costs.replan_copy_ms * instance.policy.migration_weight, rel=1e-12)
    assert np.allclose(later.nop_ms_per_token, 2 * np.asarray(hw.nop_hops) * costs.token_link_ms, rtol=1e-12)
    # fast loop: a missing page arrives after one page load; a token's hop and run time
    resident = np.zeros((model.experts_per_layer, hw.chiplets), dtype=bool)
    tick = 1e-9
    layer = layer_costs(instance, resident, tick_s=tick)
    assert np.all(layer.ready == np.ceil(costs.page_load_ms * 1e-3 / tick - 1e-9))
    assert np.allclose(layer.finish * tick, costs.hop_ms * 1e-3, atol=tick)
    assert np.allclose(layer.token_time * tick, np.maximum(costs.flop_ms * 1e-3, tick), atol=tick)


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_the_loops_price_alike_on_every_shipped_instance(path: Path) -> None:
    _prices(path)
    instance = load_instance(path)
    costs = instance.costs
    if instance.hardware.copy_topology == "devices":
        links = _DeviceLinks.of(instance)
        assert (links.intra_ms, links.inter_ms) == (costs.copy_intra_ms, costs.copy_inter_ms)
        slower = costs.copy_intra_ms if instance.hardware.nodes == 1 else costs.copy_inter_ms
        assert costs.replan_copy_ms == slower  # the slow loop prices the evaluator's link
    else:
        assert costs.replan_copy_ms == costs.page_load_ms  # one shared die-to-die link


def test_runtime_reads_the_same_costs(table) -> None:
    instance = instance_from_table(table, "small.toml")
    batches = make_batches(generate(instance.model, instance.trace), 8, "token-order")
    runtime = _Runtime(instance, batches, STRATEGIES["static"], 0.0, 0)
    costs = instance.costs
    assert runtime.page_ms == costs.page_load_ms and runtime.token_ms == costs.token_link_ms
    assert np.array_equal(runtime.speeds.read_ms, costs.read_ms)
    assert np.array_equal(runtime.speeds.hop_ms, costs.hop_ms)


def test_costs_by_hand(table) -> None:
    """page 1 GB, d2d 50 GB/s, local 100 GB/s, 10 TFLOP/s, 16 x 2 B tokens, hops 1/2 at 20 ns."""
    table["model"]["expert_gflop_per_token"] = 2.0
    costs = instance_from_table(table, "small.toml").costs
    assert costs.page_load_ms == pytest.approx(20.0)  # 1 GB / 50 GB/s
    assert np.allclose(costs.read_ms, 10.0)  # 1 GB / 100 GB/s
    assert np.allclose(costs.flop_ms, 0.2)  # 2 GFLOP / 10 TFLOP/s = 2e-4 s
    assert np.allclose(costs.hop_ms, [2e-5, 2e-5, 4e-5, 4e-5])  # 20 ns per hop
    assert costs.token_link_ms == pytest.approx(32 / 50e9 * 1e3)
    assert costs.replan_copy_ms == costs.page_load_ms
    devices = with_overrides(
        instance_from_table(table, "small.toml"),
        {"hardware.copy_topology": "devices", "hardware.devices_per_node": 2},
    )
    assert devices.costs.replan_copy_ms == pytest.approx(1 / 40 * 1e3)  # two nodes: the 40 GB/s link
    one_node = with_overrides(devices, {"hardware.devices_per_node": 0})
    assert one_node.costs.replan_copy_ms == pytest.approx(1 / 300 * 1e3)


def test_a_copy_is_spread_over_the_steps_a_plan_serves() -> None:
    # a window of 8 planned steps whose plan serves 3,000: the objective weighs 8 steps of balance,
    # so a copy (made once per re-plan) is priced at 8 / 3,000 of its time; 0 keeps the window's own
    instance = load_instance(ROOT / "instances" / "paper-baseline.toml")
    model, hw = instance.model, instance.hardware
    demand = demand_from_counts(np.ones((model.layers, model.experts_per_layer)), 8, model.top_k)
    previous = Placement(np.zeros((model.layers, model.experts_per_layer, hw.chiplets), dtype=bool))
    own = residency_problem(instance, demand, previous, batches=8)
    served = with_overrides(instance, {"policy.replan_every": 3000, "policy.migration_weight": 1.0})
    interval = residency_problem(served, demand, previous, batches=8)
    assert own.copy_ms == pytest.approx(instance.costs.replan_copy_ms * instance.policy.migration_weight)
    assert interval.copy_ms == pytest.approx(instance.costs.replan_copy_ms * 8 / 3000, rel=1e-12)
    assert interval.batches == own.batches == 8
