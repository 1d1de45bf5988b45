"""The MoE layer's modelled time (costs.py `LayerTime`, formulations/serving-time.md), by hand.

Rates in round numbers: a slot's weights read in 1 ms, a token's FLOPs 0.1 ms, its dispatch and
combine 0.01 ms, so each device's time max(A·1, T·0.1) + T·0.01 is read off the instance."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from conftest import small_table
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from comoe_opt.best_split.cut_condition import layer_makespans
from comoe_opt.best_split.split import Splitter
from comoe_opt.costs import Costs, LayerTime, token_link_in_ms
from comoe_opt.instance import instance_from_table
from comoe_opt.replay import Run, Static, replay, serve
from comoe_opt.residency.placement import Placement

TIMING = LayerTime(
    read_ms=np.array([1.0, 1.0]),
    flop_ms=np.array([0.1, 0.1]),
    link_ms=np.array([0.01, 0.01]),
    replan_copy_ms=2.0,
)


def test_a_device_is_bound_by_its_weight_reads_or_its_flops_then_its_tokens_links() -> None:
    # device 0: 5 tokens on 2 busy slots, max(2, 0.5) + 0.05; device 1: 20 tokens on 1, max(1, 2) + 0.2
    assert TIMING.device_ms(np.array([5.0, 20.0]), np.array([2.0, 1.0])) == pytest.approx([2.05, 2.2])
    assert TIMING.layer_ms(np.array([5.0, 20.0]), np.array([2.0, 1.0])) == pytest.approx(2.2)


def _slots() -> np.ndarray:
    """One layer: expert 0 on both devices, expert 1 on device 1 only ([L, E, C] slots)."""
    return np.array([[[1, 1], [0, 1]]])


def test_the_even_split_reads_only_the_slots_that_take_a_token() -> None:
    # expert 0's one token goes to its first slot (device 0), its slot on device 1 stays idle;
    # expert 1's 4 tokens to device 1: device 0 max(1, 0.1) + 0.01, device 1 max(1, 0.4) + 0.04
    served = serve(_slots(), np.array([[[1, 4]]]), "even", TIMING)
    assert served.layer_ms is not None and served.layer_ms[0, 0] == pytest.approx(1.04)
    assert served.peak[0, 0] == 4  # the token count is what it was


def test_lp_and_flow_time_one_whole_token_split_at_the_best_makespan() -> None:
    # the best makespan is 4 (expert 1 has one home, device 1); at a cap of 4 a split must send
    # expert 0's token to device 0: device 0 max(1, 0.1) + 0.01, device 1 max(1, 0.4) + 0.04, its
    # slot of expert 0 idle
    for dispatch in ("lp", "flow"):
        served = serve(_slots(), np.array([[[1, 4]]]), dispatch, TIMING)
        assert served.layer_ms is not None and served.layer_ms[0, 0] == pytest.approx(1.04)
    assert serve(_slots(), np.array([[[1, 4]]]), "lp").layer_ms is None  # untimed without rates


@settings(max_examples=40, deadline=None)
@given(
    resident=arrays(bool, (5, 3)),
    counts=arrays(np.int64, (5,), elements=st.integers(0, 9)),
)
def test_the_split_serves_every_token_within_the_best_makespan(resident, counts) -> None:
    resident[:, 0] |= ~resident.any(axis=1)  # every expert somewhere
    cap = int(np.ceil(layer_makespans(counts[None, :, None] * np.ones(3), resident)[0] - 1e-9))
    served = Splitter(resident).split(counts, cap)
    assert (served.sum(axis=1) == counts).all() and (served.sum(axis=0) <= cap).all()
    assert not (served[~resident]).any()  # only where a replica is


def test_tokens_reach_a_gpu_over_the_slower_share_of_its_two_links() -> None:
    # 16 GPUs in 2 nodes: of a GPU's tokens 7/16 come over NVLink-class 300 GB/s, 8/16 over a
    # 50 GB/s network; 1000 elements, FP8 dispatch (1 B) and BF16 combine (2 B): 3 kB a token
    model = SimpleNamespace(hidden_size=1000, bytes_per_element=1.0)
    hardware = SimpleNamespace(
        chiplets=16, nodes=2, copy_topology="devices", copy_intra_node_gb_s=300.0, copy_inter_node_gb_s=50.0
    )
    costs = SimpleNamespace(nop_ms_per_token=np.zeros(16))
    intra, inter = 7 / 16 * 3e-6 / 300 * 1e3, 8 / 16 * 3e-6 / 50 * 1e3
    assert token_link_in_ms(model, hardware, costs) == pytest.approx(np.full(16, max(intra, inter)))
    one_node = SimpleNamespace(**{**vars(hardware), "nodes": 1})
    assert token_link_in_ms(model, one_node, costs) == pytest.approx(np.full(16, 15 / 16 * 3e-6 / 300 * 1e3))


def test_an_instances_rates_give_its_layer_time() -> None:
    instance = instance_from_table(small_table(), "small.toml")
    costs: Costs = instance.costs
    timing = instance.layer_time
    assert timing.read_ms == pytest.approx(np.broadcast_to(costs.read_ms, timing.read_ms.shape))
    assert timing.flop_ms == pytest.approx(np.broadcast_to(costs.flop_ms, timing.flop_ms.shape))
    assert timing.replan_copy_ms == costs.replan_copy_ms


class _Plans:
    """A planner serving fixed placements in turn."""

    def __init__(self, placements: list[Placement]):
        self.placements = list(placements)

    @property
    def name(self) -> str:
        return "fixed"

    def plan(self, steps, window, in_service):
        return self.placements.pop(0)


def test_a_replans_stall_is_set_by_the_device_receiving_the_most_copies() -> None:
    a = np.zeros((1, 4, 2), dtype=bool)
    a[0, [0, 1], 0] = a[0, [2, 3], 1] = True
    b = a.copy()
    b[0, [2, 3], 0] = True  # two copies onto device 0, one onto device 1
    b[0, 0, 1] = True
    steps = np.ones((6, 1, 4))
    spans = [(0, 2), (2, 4), (4, 6)]
    run: Run = replay(_Plans([Placement(a), Placement(b), Placement(b)]), steps, spans)
    assert run.copies == [3, 0] and run.copies_into == [2, 0]
    assert run.migration_ms(2.0) == pytest.approx((2 * 2.0 + 0) / 2)
    kept = replay(Static(_Plans([Placement(a)])), steps, spans)  # plans once, then keeps it
    assert kept.copies == [0, 0] and kept.migration_ms(2.0) == 0.0
