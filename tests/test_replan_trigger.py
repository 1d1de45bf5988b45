"""The re-plan trigger (balancers/dropin/trigger.py): silent on the load its plan was made for,
firing after a drift once the extra time reaches a re-plan's price (hand-checked: a step that
costs exactly the price), its change point, and the trigger-driven spans the replay takes."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from comoe_opt.balancers.dropin.trigger import CALIBRATION, ReplanTrigger, layer_peaks
from comoe_opt.balancers.eplb import deepseek_eplb


def _steps(rng: np.random.Generator, rates: np.ndarray, n: int) -> np.ndarray:
    return rng.poisson(rates, size=(n, *rates.shape)).astype(np.float64)


def test_layer_peaks_by_hand():
    # 2 GPUs, slots [0, 1 | 2, 2]: expert 2 has two slots on GPU 1
    phy2log = np.array([[0, 1, 2, 2]])
    counts = np.array([[[3.0, 1.0, 4.0]]])  # GPU 0: 4, GPU 1: 4 -> 1.0
    assert layer_peaks(phy2log, counts, 2)[0, 0] == pytest.approx(1.0)
    counts = np.array([[[6.0, 2.0, 0.0]]])  # GPU 0: 8, GPU 1: 0 -> 8 / 4 = 2.0
    assert layer_peaks(phy2log, counts, 2)[0, 0] == pytest.approx(2.0)


def test_the_price_is_reached_exactly_when_the_extra_time_sums_to_it():
    phy2log = np.array([[0, 1, 2, 3]])
    even = np.array([[1.0, 1.0, 1.0, 1.0]])  # perfectly balanced: max/mean 1
    trigger = ReplanTrigger(2, move_cost=0.5, min_history=1)
    trigger.start(phy2log, moved=2)  # price 0.5 x 2 = 1 layer-step
    assert trigger.price == pytest.approx(1.0)
    assert not any(trigger.observe(even) for _ in range(CALIBRATION + 3))  # level 1, no spread
    assert trigger.level == pytest.approx(1.0) and trigger.cusum == 0.0
    half = np.array([[1.5, 1.5, 0.5, 0.5]])  # max/mean 3 / 2 = 1.5: extra 0.5
    assert not trigger.observe(half) and trigger.cusum == pytest.approx(0.5)
    assert trigger.observe(half) and trigger.cusum == pytest.approx(1.0)
    assert trigger.since == 2  # the change point: two steps back


def test_silent_on_its_own_load_and_fires_after_a_drift():
    rng = np.random.default_rng(0)
    layers, experts, gpus = 4, 32, 8
    rates = rng.gamma(0.7, 40.0, size=(layers, experts))
    history = _steps(rng, rates, 64)
    phy2log = deepseek_eplb(history.sum(axis=0), experts + gpus, 1, 1, gpus)[0]
    trigger = ReplanTrigger(gpus, move_cost=0.02)
    trigger.start(phy2log, moved=200)  # a price of 4 layer-steps: dozens of the noise's spreads
    assert not any(trigger.observe(step) for step in _steps(rng, rates, 500))
    drifted = rates[:, rng.permutation(experts)]
    fired = [trigger.observe(step) for step in _steps(rng, drifted, 100)]
    assert any(fired)
    first = fired.index(True)
    assert first + 1 >= trigger.min_history and first < 40
    assert trigger.since >= trigger.min_history


def test_bad_arguments_and_observe_before_start_are_refused():
    with pytest.raises(ValueError, match="min_history"):
        ReplanTrigger(0)
    with pytest.raises(ValueError, match="before start"):
        ReplanTrigger(2).observe(np.ones((1, 4)))
    trigger = ReplanTrigger(2, min_history=1)
    trigger.start(np.array([[0, 1]]))
    assert not any(trigger.observe(np.array([[5.0, 0.0]])) for _ in range(CALIBRATION))  # calibrating


def test_trigger_spans_cover_the_steps_and_the_replay_plans_them_alike():
    from comoe_opt.replay import EplbLayout, replay
    from comoe_opt.replay.planners import EplbOnSteps
    from comoe_opt.replay.triggered import Recent, interval_spans, trigger_spans

    assert interval_spans(10, 4, 3) == [(0, 4), (4, 7), (7, 10)]
    rng = np.random.default_rng(1)
    layers, experts, gpus = 2, 16, 4
    rates = rng.gamma(0.7, 40.0, size=(layers, experts))
    steps = np.concatenate([_steps(rng, rates, 60), _steps(rng, rates[:, ::-1].copy(), 60)]).astype(np.int64)
    layout = EplbLayout(experts + gpus, 1, 1, gpus)
    planner = Recent(EplbOnSteps(layout), 32)
    spans = trigger_spans(planner, steps, 16, ReplanTrigger(gpus, move_cost=0.01))
    assert spans[0] == (0, 16) and spans[-1][1] == steps.shape[0]
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
    assert any(60 <= s[0] <= 90 for s in spans[2:])  # a re-plan after the drift at step 60
    run = replay(planner, steps, spans, 1)
    assert len(run.placements) == len(spans)
