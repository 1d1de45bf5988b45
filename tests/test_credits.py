"""Credits that track the link, the three virtual channels, the paper's replica accounting, and
CoMoE-Chip against its own parts (formulations/latency.md §3)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from conftest import small_table

from comoe_opt.evaluator import runtime as runtime_module
from comoe_opt.evaluator.claims import AXES, MAP_STRATEGIES, point_table
from comoe_opt.evaluator.metrics import summarize
from comoe_opt.evaluator.runs import evaluate_strategy
from comoe_opt.evaluator.runtime import SampleLog, _Link, simulate
from comoe_opt.evaluator.strategies import strategy
from comoe_opt.instance import instance_from_table, load_instance, with_overrides
from comoe_opt.residency.heuristics.assign import assign_replicas
from comoe_opt.residency.problem import residency_problem
from comoe_opt.stats.demand import window_demand
from comoe_opt.trace import instance_batches

# ------------------------------------------------------------------ the link


def test_a_prefetch_is_issued_only_if_it_lands_by_the_deadline():
    link = _Link(vcs=True, page_ms=2.0)
    assert link.issue_prefetch(1.0, deadline=2.9) is None  # lands at 3.0
    assert link.prefetch == 0.0  # a refused page takes no credit
    assert link.issue_prefetch(1.0, deadline=3.0) == 3.0
    assert link.prefetch_start(0.5) == 3.0  # the next one queues behind it


def test_beside_copies_a_prefetch_gets_half_the_link_and_delays_them():
    link = _Link(vcs=True, page_ms=2.0, background=1.0)  # 1 ms of copies left
    assert link.issue_prefetch(0.0, deadline=math.inf) == pytest.approx(3.0)  # 1 ms at half, 1.5 alone
    assert link.background == pytest.approx(2.0)  # the copies gave up 1 ms of link


def test_on_demand_loads_preempt_prefetch_and_copies_but_not_tokens():
    link = _Link(vcs=True, page_ms=2.0, background=10.0, prefetch=5.0)
    assert link.ahead(1.0) == 0.0  # tokens and loads have channels of their own
    link.load(1.0, 3.0)
    assert (link.background, link.prefetch, link.demand) == (13.0, 8.0, 4.0)


def test_a_cancelled_prefetch_returns_its_credit():
    link = _Link(vcs=True, page_ms=2.0, prefetch=6.0)
    link.cancel(remaining=1.5, at=3.0)
    assert link.prefetch == 4.5


def test_one_fifo_without_virtual_channels_blocks_tokens_and_loads():
    link = _Link(vcs=False, page_ms=2.0, background=5.0)
    assert link.ahead(1.0) == 4.0  # head-of-line: 4 ms of pages queued ahead
    assert link.issue_prefetch(5.0, deadline=0.0) == 7.0  # no credit: never refused
    link.load(1.0, 9.0)
    assert link.background == 10.0


# ------------------------------------------------------------------ the runtime


def _small(d2d: float, **hardware) -> object:
    table = small_table()
    table["hardware"].update(d2d_bandwidth_gb_s=d2d, prefetch_buffer_gb=2, **hardware)
    table["model"].update(layers=4)
    table["trace"].update(micro_batches=16, rho=0.9)
    return instance_from_table(table, "small.toml")


@pytest.mark.parametrize("d2d", [50.0, 5000.0])
def test_credited_prefetches_land_before_their_layer_is_routed(d2d, monkeypatch):
    instance = _small(d2d)
    late, seen = [], []
    original = runtime_module._Runtime._cancel_unused

    def check(self, layer, used, routed):
        for p in self.pending[layer]:
            seen.append(p)
            late.append(p.end > routed + 1e-9)
        original(self, layer, used, routed)

    monkeypatch.setattr(runtime_module._Runtime, "_cancel_unused", check)
    log = simulate(instance, instance_batches(instance), strategy("comoe"))
    assert not any(late)
    assert len(seen) == log.prefetch_issued
    if d2d > 1000:  # a fast link lets pages land in time: the test is not empty
        assert log.prefetch_issued > 0
    else:  # 20 ms a page: longer than a layer, every candidate is refused
        assert log.prefetch_issued == 0 and log.prefetch_denied > 0


def test_without_credits_prefetches_arrive_late_and_tokens_wait():
    instance = _small(50.0)
    batches = instance_batches(instance)
    free = simulate(instance, batches, strategy("no-credits"))
    credited = simulate(instance, batches, strategy("comoe"))
    assert free.prefetch_issued > 0 and credited.prefetch_issued == 0
    assert free.latency_ms.max() > credited.latency_ms.max()


# ------------------------------------------------------------------ replica accounting


def test_paper_replica_factor_counts_buffered_pages_in_use():
    log = SampleLog.empty(2, 3)
    log.resident_pages, log.distinct_experts = [10], [8]
    log.batch_pages[:] = 10
    log.batch_distinct[:] = 8
    log.buffered_in_use[:] = [0, 4]
    metrics = summarize(log)
    assert metrics["replica_factor"] == pytest.approx(10 / 8)
    assert metrics["replica_factor_paper"] == pytest.approx((10 / 8 + 14 / 8) / 2)


def test_a_strategy_without_buffers_has_the_same_factor_both_ways():
    instance = _small(50.0)
    metrics = evaluate_strategy(instance, "static")
    assert metrics["replica_factor_paper"] == pytest.approx(metrics["replica_factor"])
    assert metrics["buffered_in_use_per_batch"] == 0.0


# ------------------------------------------------------------------ replica assignment


def test_tight_capacity_does_not_stack_the_last_layers():
    """Every page full, one expert per layer left out: each layer's experts spread evenly."""
    table = small_table()
    table["model"].update(layers=8, experts_per_layer=8)
    table["hardware"].update(capacity_gb=14)  # 56 pages for 64 experts
    instance = instance_from_table(table, "small.toml")
    demand = window_demand(instance_batches(instance), instance.policy)
    problem = residency_problem(instance, demand)
    counts = np.ones((8, 8), dtype=np.int64)
    counts[:, 7] = 0
    placement = assign_replicas(problem, counts)
    assert (placement.resident.sum(axis=(0, 1)) == 14).all()
    per_layer = placement.resident.sum(axis=1)  # [L, C]
    assert per_layer.max() <= 3  # 7 experts over 4 chiplets: at most 2, one swap of slack


# ------------------------------------------------------------------ CoMoE and its parts


def test_comoe_never_loses_to_its_parts_at_a_slow_link_point():
    """A point of the regime map's slow-link slice (D2D 128 GB/s, 10x local bandwidth, attention
    10% of static's latency) on its first 12 micro-batches, planned every 4."""
    instance = with_overrides(
        load_instance("instances/paper-baseline.toml"),
        {
            "hardware.d2d_bandwidth_gb_s": 128.0,
            "hardware.local_bandwidth_gb_s": 20000.0,
            "runtime.attention_share": 0.1,
            "policy.window_batches": 4,
        },
    )
    strategies = ("static", "hot", "transition", "comoe")
    rows = [evaluate_strategy(instance, s, micro_batches=12) for s in strategies]
    mean = {r["strategy"]: r["mean_ms"] for r in rows}
    for part in ("static", "hot", "transition"):
        assert mean["comoe"] <= 1.01 * mean[part], (part, mean)


def _point(**changes: float) -> dict[str, dict[str, float]]:
    base = {
        "mean_ms": 1.0,
        "p95_ms": 1.0,
        "load_gb_per_batch": 1.0,
        "balance": 0.7,
        "replica_factor": 1.0,
        "replica_factor_paper": 1.0,
        "demand_load_gb_per_batch": 1.0,
        "pages_migrated": 0.0,
    }
    point = {s: dict(base) for s in MAP_STRATEGIES}
    for key, value in changes.items():
        name, metric = key.split("__")
        point[name.replace("_", "-")][metric] = value
    return point


def _table(point: dict) -> pd.Series:
    axes = dict(zip(AXES, (253, 2000, 128, 0.1), strict=True))
    rows = [{**axes, "method": s, **m} for s, m in point.items()]
    return point_table(pd.DataFrame(rows)).iloc[0]


def test_the_map_says_why_a_part_is_faster():
    row = _table(_point(comoe__mean_ms=1.2, comoe__demand_load_gb_per_batch=2.0, comoe__pages_migrated=30))
    assert not row["parts.holds"]
    assert "on-demand" in row["parts.why"] and "re-plan copies (30 pages)" in row["parts.why"]
    assert _table(_point(comoe__mean_ms=1.009))["parts.holds"]  # within 1%
    assert _table(_point(comoe__mean_ms=1.009))["parts.why"] == ""


def test_claim_four_both_ways():
    row = _table(_point(comoe__balance=0.85, comoe__replica_factor_paper=1.1))
    assert row["balance-paper.holds"] and not row["balance.holds"]


def test_the_flow_maps_pairs_only_where_the_median_expert_is_compute_bound():
    from types import SimpleNamespace

    from comoe_opt.evaluator.fastmap import _compute_bound
    from comoe_opt.evaluator.layer import ChipletSpeeds

    experts = np.array([[0, 1], [0, 2], [1, 2], [0, 3]])  # tokens per expert: 3, 2, 2, 1 (median 2)

    def rt(read: float) -> SimpleNamespace:
        one = np.ones(2)
        return SimpleNamespace(speeds=ChipletSpeeds(read_ms=read * one, flop_ms=0.005 * one, hop_ms=0 * one))

    assert _compute_bound(rt(0.005), experts)  # a page read = one token: split hot experts
    assert not _compute_bound(rt(0.05), experts)  # a read = ten tokens: whole experts
