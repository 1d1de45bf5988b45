"""The drop-in gives the same map for the same input, whatever the clock does: engines run it on
every rank and expect every rank to agree. The searches here are cut by their work budget (the
input is too large to converge within it), so a budget read off the clock would show."""

from __future__ import annotations

import numpy as np
import pytest

import comoe_opt
from comoe_opt.balancers.dropin import rebalance as ep_balance
from comoe_opt.balancers.dropin.config import Work


class Clock:
    """A fake clock: each reading advances by the next of `ticks` (cycled); counts its readings."""

    def __init__(self, *ticks: float):
        self.now, self.ticks, self.readings = 0.0, ticks, 0

    def __call__(self) -> float:
        self.now += self.ticks[self.readings % len(self.ticks)]
        self.readings += 1
        return self.now


def _case(dispatch: str) -> tuple[tuple, np.ndarray, np.ndarray]:
    """(EPLB's arguments, history, a map in service): 8 GPUs, bursty steps; `even` on 64 experts
    in 80 slots per layer, `lp` (whose moves cost more to score) on 16 in 24."""
    rng = np.random.default_rng(33)
    layers, experts, slots = (6, 64, 80) if dispatch == "even" else (3, 16, 24)
    steps = rng.poisson(rng.gamma(0.4, 6.0, size=(64, layers, experts))).astype(np.int64)
    weight = steps.sum(axis=0)
    previous = comoe_opt.rebalance_experts(weight, slots, 1, 1, 8, method="eplb")[0]
    return (weight, slots, 1, 1, 8), steps, previous


@pytest.mark.parametrize("dispatch", ["even", "lp"])
@pytest.mark.parametrize("given_previous", [False, True])
def test_same_map_on_every_call_and_under_any_clock(dispatch, given_previous):
    args, steps, previous = _case(dispatch)
    kwargs = dict(history=steps, dispatch=dispatch, previous=previous if given_previous else None)
    first = comoe_opt.rebalance_experts(*args, explain=True, **kwargs)
    report = first[3]
    assert report.stopped_by_work or given_previous  # the budget, not convergence, ended it
    assert not report.stopped_by_time
    for clock in (Clock(1e-9), Clock(3600.0), Clock(1e-6, 1e4, 0.0, 86400.0)):
        again = comoe_opt.rebalance_experts(*args, clock=clock, **kwargs)
        for a, b in zip(first[:3], again, strict=True):
            assert np.array_equal(a, b)
        assert clock.readings <= 2  # the call's start and the report's seconds, never the search


def test_the_budget_bounds_the_work_and_effort_scales_it():
    """The default stops at its work budget; a larger `effort` searches further (never worse on
    the objective), and an infinite one runs until no move improves."""
    args, steps, _ = _case("even")
    runs = [
        comoe_opt.rebalance_experts(*args, history=steps, effort=effort, explain=True)[3]
        for effort in (1.0, 4.0, float("inf"))
    ]
    assert runs[0].stopped_by_work and not runs[2].stopped_by_work
    assert runs[2].objective <= runs[1].objective <= runs[0].objective <= runs[0].eplb_objective


def test_work_budget_grows_with_the_shape_not_the_clock():
    small = ep_balance.work_budget("even", 24, 40, 8, 128)
    assert ep_balance.work_budget("even", 48, 40, 8, 128) > small > 0
    assert ep_balance.work_budget("lp", 24, 40, 8, 128) > small


def test_opt_in_cap_is_the_only_clock():
    """With `time_budget_s`, a clock that jumps an hour a reading stops the search at its start."""
    args, steps, _ = _case("even")
    report = comoe_opt.rebalance_experts(
        *args, history=steps, time_budget_s=1.0, clock=Clock(3600.0), explain=True
    )[3]
    assert report.stopped_by_time and report.objective <= report.eplb_objective
    assert Work(10.0).fits(10.0) and not Work(10.0).fits(10.5)


@pytest.mark.parametrize("effort", [0, -1.0, float("nan"), "1", True])
def test_bad_effort_is_one_line(effort):
    args, _, _ = _case("even")
    with pytest.raises(ValueError, match=r"^effort must be"):
        comoe_opt.rebalance_experts(*args, effort=effort)
