"""The drop-in's time objective (balancers/dropin/timing.py): without weight reads it is the
max/mean token load; a timed pass takes the swap off the hot GPU that a brute force over the same
swaps finds best by time, its times kept those of the plan; a timed call never plans worse by time
than its token plan; a bad `timing` is one ArgumentError."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from comoe_opt import rebalance_experts
from comoe_opt.balancers.dropin.config import SearchConfig, Work
from comoe_opt.balancers.dropin.objective import Shape, normalised, step_weights
from comoe_opt.balancers.dropin.rebalance import ArgumentError
from comoe_opt.balancers.dropin.step_search import StepSearch, gpu_step_loads, step_peaks
from comoe_opt.balancers.dropin.timing import StepTimes, interval_price
from comoe_opt.balancers.eplb import deepseek_eplb
from comoe_opt.costs import LayerTime


def _instance(seed: int, gpus: int, nodes: int, steps: int = 6, layers: int = 2, experts: int = 24):
    rng = np.random.default_rng(seed)
    history = rng.poisson(rng.gamma(0.6, 3.0, size=(layers, experts)), size=(steps, layers, experts))
    history = history.astype(np.float64)
    history[..., 0] += 1.0  # every step has a selection
    plan = deepseek_eplb(history.sum(axis=0), experts + gpus, nodes, nodes, gpus)[0]
    return history, plan


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**16), st.floats(1e-4, 1.0), st.floats(0.0, 1.0))
def test_without_weight_reads_the_time_is_the_token_load(seed, flop, link):
    history, plan = _instance(seed, 4, 1)
    raw = history.transpose(1, 0, 2)
    w_t = np.ascontiguousarray(normalised(raw, 4).transpose(0, 2, 1))
    times = StepTimes.of((0.0, flop, link), raw, 4)
    timed = step_peaks(plan, w_t, 4, times)
    assert np.allclose(timed, gpu_step_loads(plan, w_t, 4).max(axis=1), rtol=1e-12)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**16), st.sampled_from([(4, 1), (4, 2), (6, 3)]), st.floats(0.01, 10.0))
def test_a_timed_pass_takes_the_best_swap_off_the_hot_gpu(seed, gpus_nodes, read):
    gpus, nodes = gpus_nodes
    history, plan = _instance(seed, gpus, nodes)
    raw = history.transpose(1, 0, 2)
    w = normalised(raw, gpus)
    w_t = np.ascontiguousarray(w.transpose(0, 2, 1))
    times = StepTimes.of((read, 1.0, 0.5), raw, gpus)
    run = StepSearch(plan, w, Shape(gpus, nodes, "even", True), None, 0.0, None, Work(), gpus, None, times)
    p = step_weights(w.shape[1], None)
    before = run.objective.copy()
    per_gpu, per_node = plan.shape[1] // gpus, gpus // nodes
    expected = []
    for layer in range(plan.shape[0]):
        weight = np.zeros(gpus)
        np.add.at(weight, run.values[layer].argmax(axis=0), p)
        hot = int(weight.argmax())
        node = hot // per_node
        best = np.inf
        for a in range(hot * per_gpu, (hot + 1) * per_gpu):
            for g in range(node * per_node, (node + 1) * per_node):
                for c in range(g * per_gpu, (g + 1) * per_gpu) if g != hot else ():
                    trial = plan.copy()
                    trial[layer, a], trial[layer, c] = trial[layer, c], trial[layer, a]
                    best = min(best, float(step_peaks(trial, w_t, gpus, times)[layer] @ p))
        expected.append(best)
    run.descend(lambda: False, 1)
    for layer in range(plan.shape[0]):
        assert np.isclose(run.objective[layer], min(before[layer], expected[layer]), rtol=1e-5, atol=1e-9)
    # the times kept in place are the plan's
    assert np.allclose(run.objective, step_peaks(run.slots, w_t, gpus, times) @ p)


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**16), st.sampled_from([(8, 2), (16, 2)]), st.floats(0.01, 1.0))
def test_a_timed_call_never_plans_worse_by_time_than_its_token_plan(seed, gpus_nodes, read):
    gpus, nodes = gpus_nodes
    history, _ = _instance(seed, gpus, nodes, steps=8, layers=3, experts=32)
    args = (history.sum(axis=0), 32 + gpus, nodes, nodes, gpus)
    config = SearchConfig(eplb_guard=False)
    timing = LayerTime.of_gpus(read, 0.01, 0.005, gpus)
    tokens = rebalance_experts(*args, history=history, config=config, half_life=None)[0]
    timed = rebalance_experts(*args, history=history, config=config, half_life=None, timing=timing)[0]
    raw = history.transpose(1, 0, 2)
    w_t = np.ascontiguousarray(normalised(raw, gpus).transpose(0, 2, 1))
    times = StepTimes.of((read, 0.01, 0.005), raw, gpus)
    assert np.array_equal(np.sort(timed, axis=1), np.sort(tokens, axis=1))  # the same replica counts
    value = step_peaks(timed, w_t, gpus, times).mean(axis=1)
    assert (value <= step_peaks(tokens, w_t, gpus, times).mean(axis=1) + 1e-9).all()


def test_the_report_names_the_time_search():
    history, _ = _instance(3, 16, 2, steps=8, layers=2, experts=48)
    args = (history.sum(axis=0), 64, 2, 2, 16)
    report = rebalance_experts(
        *args, history=history, explain=True, timing=LayerTime.of_gpus(0.1, 0.01, 0.0, 16)
    )
    assert report[-1].search == "by steps, then by steps on time"


@pytest.mark.parametrize(
    ("timing", "says"),
    [
        ((0.1, 0.01, 0.0), "must be a comoe_opt.costs.LayerTime"),
        (LayerTime.of_gpus(0.1, 0.01, 0.0, 8), "must time 4 alike GPUs"),
        (LayerTime(np.array([0.1, 0.1, 0.2, 0.1]), np.full(4, 0.01), np.zeros(4), 0.0), "alike GPUs"),
        (LayerTime.of_gpus(-0.1, 0.01, 0.0, 4), "finite, >= 0 and not all 0"),
        (LayerTime.of_gpus(0.0, 0.0, 0.0, 4), "not all 0"),
    ],
)
def test_a_bad_timing_is_one_argument_error(timing, says):
    history, _ = _instance(0, 4, 1)
    with pytest.raises(ArgumentError, match=says):
        rebalance_experts(history.sum(axis=0), 28, 1, 1, 4, history=history, timing=timing)


def test_a_move_over_the_interval_is_its_share_of_the_stall_by_hand():
    # 2 GPUs, one step of 4 experts with 2 selections each: 4 per GPU, 2 experts' slots busy per
    # GPU, balanced time max(2 x 1, 4 x 0.1) + 4 x 0.5 = 4 ms; a 6-ms copy over 3 steps, 1/2 of it
    # a move's share of the stall: 6 / (2 x 3 x 4) = 0.25
    raw = np.full((1, 1, 4), 2.0)
    assert interval_price(6.0, (1.0, 0.1, 0.5), raw, 2, 3) == pytest.approx(0.25)
    assert interval_price(6.0, (1.0, 0.1, 0.5), np.zeros((1, 1, 4)), 2, 3) == 0.0


def test_replan_every_prices_moves_by_the_copy_time_and_needs_timing():
    history, plan = _instance(5, 8, 2, steps=8, layers=2, experts=32)
    args = (history.sum(axis=0), 40, 2, 2, 8)
    timing = LayerTime(np.full(8, 0.2), np.full(8, 0.01), np.full(8, 0.005), 0.9)
    rates = (0.2, 0.01, 0.005)
    price = interval_price(0.9, rates, history.transpose(1, 0, 2), 8, 100)
    previous = np.roll(plan, 5, axis=1)
    by_interval = rebalance_experts(
        *args, history=history, previous=previous, timing=timing, replan_every=100
    )
    by_price = rebalance_experts(*args, history=history, previous=previous, timing=timing, move_cost=price)
    assert all(np.array_equal(a, b) for a, b in zip(by_interval, by_price, strict=True))
    with pytest.raises(ArgumentError, match="give timing too"):
        rebalance_experts(*args, history=history, replan_every=100)
