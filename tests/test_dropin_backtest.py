"""The drop-in's backtest: it picks the constants a hand-made history calls for, a caller can fix
them, and `lp` never scores worse than EPLB + lp on the backtest's own held-back steps."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import comoe_opt
from comoe_opt.balancers.dropin import backtest as bt
from comoe_opt.balancers.dropin.rebalance import Report

STEPS, LAYERS, EXPERTS, SLOTS, GPUS = 64, 2, 8, 12, 4


def _rates(hot: int) -> np.ndarray:
    rates = np.full(EXPERTS, 40.0)
    rates[hot] = 1200.0  # it needs every spare slot: no plan serves both halves
    return rates


def _report(history: np.ndarray, **options: object) -> Report:
    weight = history.sum(axis=0)
    return comoe_opt.rebalance_experts(
        weight, SLOTS, 1, 1, GPUS, history=history, explain=True, **({"calibrate": True} | options)
    )[3]


def test_a_load_that_shifts_prefers_the_short_half_life():
    # expert 0 hot for the first half of the steps, expert 5 for the second: only the recent steps
    # say where the spare slots go, and the held-back newest quarter rewards planning on them
    rng = np.random.default_rng(5)
    first = rng.poisson(_rates(0), size=(STEPS // 2, LAYERS, EXPERTS))
    second = rng.poisson(_rates(5), size=(STEPS // 2, LAYERS, EXPERTS))
    report = _report(np.concatenate([first, second]).astype(float))
    assert report.backtest is not None
    assert report.backtest.chosen.half_life == STEPS * min(s for s in bt.HALF_LIFE_SHARES if s is not None)


def test_a_stationary_load_prefers_a_long_half_life():
    # the same skewed rates throughout, counts drawn at them: a long memory averages the counting
    # noise out; the short half-life plans on a few steps of it
    rng = np.random.default_rng(6)
    rates = rng.gamma(0.7, 30.0, size=(LAYERS, EXPERTS))
    history = rng.poisson(rates, size=(STEPS, LAYERS, EXPERTS)).astype(float)
    report = _report(history)
    assert report.backtest is not None
    chosen = report.backtest.chosen.half_life
    assert chosen is None or chosen >= STEPS / 2


def test_fixed_constants_are_the_only_candidate():
    rng = np.random.default_rng(7)
    history = rng.poisson(0.4, size=(STEPS, LAYERS, EXPERTS)).astype(float) + np.eye(EXPERTS)[0]
    free = _report(history)
    assert free.backtest is not None and any(c.smooth for c in free.backtest.candidates)  # sparse steps
    fixed = _report(history, move_cost=0.01, half_life=16.0, smooth=False)
    assert fixed.backtest is not None
    assert fixed.backtest.candidates == (bt.Constants(0.01, 16.0, False),)
    assert fixed.backtest.chosen == bt.Constants(0.01, 16.0, False)
    assert _report(history[:4]).backtest is None  # too few steps to hold any back


def test_smoothing_keeps_signal_and_drops_counting_noise():
    rng = np.random.default_rng(8)
    raw = rng.poisson(0.5, size=(1, 4000, 2)).astype(float)  # pure counting noise
    raw[0, :, 1] = np.where(np.arange(4000) % 2, 300.0, 100.0)  # pure signal, far above its noise
    w = raw / 2.0
    out = bt.smoothed(w, raw)
    assert np.abs(out[0, :, 0] - w[0, :, 0].mean()).max() < 0.2 * np.abs(w[0, :, 0] - w[0, :, 0].mean()).max()
    assert np.allclose(out[0, :, 1], w[0, :, 1], rtol=0.02)


def test_bad_constants_are_refused_by_name():
    history = np.ones((16, LAYERS, EXPERTS))
    for options, name in (
        ({"half_life": 0.0}, "half_life"),
        ({"half_life": "long"}, "half_life"),
        ({"smooth": 1}, "smooth"),
        ({"calibrate": "yes"}, "calibrate"),
        ({"move_cost": -1.0}, "move_cost"),
    ):
        try:
            _report(history, **options)
        except ValueError as error:
            assert str(error).startswith(name), error
        else:
            raise AssertionError(f"{options} not refused")


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), shape=st.floats(0.2, 3.0), with_previous=st.booleans())
def test_lp_never_worse_than_eplb_on_the_held_back_steps(seed: int, shape: float, with_previous: bool):
    rng = np.random.default_rng(seed)
    history = rng.poisson(rng.gamma(shape, 3.0, size=(16, LAYERS, EXPERTS))).astype(float)
    history[:, :, 0] += 1.0  # no all-zero step
    weight = history.sum(axis=0)
    previous = np.tile(np.arange(SLOTS) % EXPERTS, (LAYERS, 1)) if with_previous else None
    *plan, report = comoe_opt.rebalance_experts(
        weight,
        SLOTS,
        1,
        1,
        GPUS,
        history=history,
        previous=previous,
        dispatch="lp",
        explain=True,
        calibrate=True,
    )
    assert report.backtest is not None
    assert report.backtest.ours <= report.backtest.eplb + 1e-12
    eplb = comoe_opt.rebalance_experts(weight, SLOTS, 1, 1, GPUS, method="eplb")[0]
    for layer in report.backtest.kept_layers:  # the map in service, as good as EPLB's there
        assert previous is not None
        assert np.array_equal(np.sort(plan[0][layer]), np.sort(previous[layer]))
    for layer in report.backtest.eplb_layers:  # EPLB's replicas there (slots may be renumbered)
        assert np.array_equal(
            np.bincount(plan[0][layer], minlength=EXPERTS), np.bincount(eplb[layer], minlength=EXPERTS)
        )
