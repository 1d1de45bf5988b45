"""The drop-in planning for the engine's dispatch (`even` or `lp`), with the opt-in time cap on an
injected clock, and its explain report. Hand-checkable cases; no test depends on wall-clock speed
(every search here ends by itself or on a fake clock)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import linprog

import comoe_opt
from comoe_opt.balancers.dropin import objective as ds
from comoe_opt.balancers.dropin.config import DEFAULT
from comoe_opt.balancers.dropin.rebalance import RISK, ArgumentError
from comoe_opt.balancers.dropin.starts import risk_pack
from comoe_opt.best_split.even import slot_replicas

NO_LIMIT = 1e9  # seconds: these searches end by themselves (no improving move left)


def _score(plan: np.ndarray, steps: np.ndarray, gpus: int, dispatch: str) -> np.ndarray:
    """[layers] mean per-step max/mean of `plan` on `steps` [S, layers, E] under `dispatch`."""
    w = ds.normalised(steps.transpose(1, 0, 2).astype(float), gpus)
    return ds.scores(plan, w, ds.Shape(gpus, 1, dispatch)).mean(axis=1)


def test_even_and_best_split_by_hand():
    # GPU 0 holds experts 0 and 1, GPU 1 holds 0 and 2; loads 2, 2, 0 (mean GPU load 2)
    plan = np.array([[0, 1, 0, 2]])
    w = ds.normalised(np.array([[[2.0, 2.0, 0.0]]]), 2)
    # even: expert 0 split 1 / 1, so GPU 0 carries 1 + 2 = 3 of a mean of 2
    assert ds.scores(plan, w, ds.Shape(2, 1, "even"))[0, 0] == pytest.approx(1.5)
    # best split: expert 0's tokens all go to GPU 1, 2 and 2
    assert ds.scores(plan, w, ds.Shape(2, 1, "lp"))[0, 0] == pytest.approx(1.0)


# three steps, each with two of three experts at load 2, on 2 GPUs x 2 slots: a doubled expert
# lets the best split balance every step perfectly; the even split cannot do better than 4/3
# on average (the step without the doubled expert, or with it and its GPU partner, is 3 : 1)
STEPS = np.array([[[2, 2, 0]], [[0, 2, 2]], [[2, 0, 2]]], dtype=float)


def test_lp_plans_for_the_best_split_and_even_for_the_even_split():
    weight = STEPS.sum(axis=0)
    common = dict(history=STEPS, time_budget_s=NO_LIMIT)
    lp = comoe_opt.rebalance_experts(weight, 4, 1, 1, 2, dispatch="lp", **common)[0]
    even = comoe_opt.rebalance_experts(weight, 4, 1, 1, 2, dispatch="even", **common)[0]
    assert _score(lp, STEPS, 2, "lp")[0] == pytest.approx(1.0)
    assert _score(even, STEPS, 2, "even")[0] == pytest.approx(4 / 3)
    assert _score(lp, STEPS, 2, "lp")[0] < _score(even, STEPS, 2, "even")[0]


def test_lp_improves_on_eplb_on_bursty_steps_and_reports_it():
    rng = np.random.default_rng(5)
    steps = rng.poisson(rng.gamma(0.4, 6.0, size=(24, 3, 16))).astype(float)
    weight = steps.sum(axis=0)
    plan, _, _, report = comoe_opt.rebalance_experts(
        weight, 20, 1, 1, 4, history=steps, dispatch="lp", time_budget_s=NO_LIMIT, explain=True
    )
    eplb = comoe_opt.rebalance_experts(weight, 20, 1, 1, 4, method="eplb")[0]
    ours, theirs = _score(plan, steps, 4, "lp"), _score(eplb, steps, 4, "lp")
    assert (ours <= theirs + 1e-9).all() and ours.mean() < theirs.mean()
    assert report.score == pytest.approx(ours.mean()) and report.eplb_score == pytest.approx(theirs.mean())
    assert not report.stopped_by_time and report.dispatch == "lp"


def test_lp_on_more_gpus_than_enumerable_is_never_worse_exactly():
    """16 GPUs: the search runs on a pool of GPU sets, its result is checked by min cut."""
    rng = np.random.default_rng(2)
    steps = rng.poisson(rng.gamma(0.5, 4.0, size=(6, 1, 32))).astype(float)
    weight = steps.sum(axis=0)
    plan = comoe_opt.rebalance_experts(weight, 48, 1, 1, 16, history=steps, dispatch="lp", moves=200)[0]
    eplb = comoe_opt.rebalance_experts(weight, 48, 1, 1, 16, method="eplb")[0]
    w = ds.normalised(steps.transpose(1, 0, 2), 16)
    ours = ds.scores(plan, w, ds.Shape(16, 1, "lp")).mean()
    assert ours <= ds.scores(eplb, w, ds.Shape(16, 1, "lp")).mean() + 1e-9


def _lp_peak(counts: np.ndarray, resident: np.ndarray) -> float:
    """min T such that each expert's load splits over its replicas with every GPU <= T (HiGHS)."""
    pairs = np.argwhere(resident)  # (expert, GPU) of every replica; variables: their loads, then T
    served = np.zeros((resident.shape[0], len(pairs) + 1))
    served[pairs[:, 0], np.arange(len(pairs))] = 1
    on_gpu = np.zeros((resident.shape[1], len(pairs) + 1))
    on_gpu[pairs[:, 1], np.arange(len(pairs))] = 1
    on_gpu[:, -1] = -1
    cost = np.r_[np.zeros(len(pairs)), 1.0]
    lp = linprog(cost, A_ub=on_gpu, b_ub=np.zeros(resident.shape[1]), A_eq=served, b_eq=counts)
    assert lp.status == 0
    return float(lp.fun)


@pytest.mark.parametrize("gpus", [24, 32])
def test_lp_scores_at_deepseek_v3_gpu_counts_are_the_routing_lps_optimum(gpus):
    """The drop-in's `lp` score (what its search keeps and the replay scores) at 24 and 32 GPUs,
    where the 2^G sets cannot be enumerated, is the routing LP's optimum over the mean GPU load."""
    rng = np.random.default_rng(gpus)
    experts, slots = 2 * gpus, 3 * gpus
    plan = np.concatenate([rng.permutation(experts), rng.integers(0, experts, slots - experts)])[None]
    steps = rng.poisson(rng.gamma(0.5, 6.0, size=(4, 1, experts))).astype(float)
    got = ds.scores(plan, ds.normalised(steps.transpose(1, 0, 2), gpus), ds.Shape(gpus, 1, "lp"))[0]
    resident = slot_replicas(plan, experts, gpus)[0] > 0  # [E, G]
    for step, score in enumerate(got):
        mean = steps[step, 0].sum() / gpus
        assert score == pytest.approx(_lp_peak(steps[step, 0], resident) / mean, rel=1e-5)
    # and the search at 32 GPUs, on a pool of sets checked by min cut, is never worse than EPLB
    weight = steps.sum(axis=0)
    ours = comoe_opt.rebalance_experts(weight, slots, 1, 1, gpus, history=steps, dispatch="lp", moves=200)
    eplb = comoe_opt.rebalance_experts(weight, slots, 1, 1, gpus, method="eplb")
    w = ds.normalised(steps.transpose(1, 0, 2), gpus)
    shape = ds.Shape(gpus, 1, "lp")
    assert ds.scores(ours[0], w, shape).mean() <= ds.scores(eplb[0], w, shape).mean() + 1e-9


class FakeClock:
    """Advances `tick` seconds on every reading."""

    def __init__(self, tick: float):
        self.now, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


def test_time_budget_on_an_injected_clock():
    rng = np.random.default_rng(1)
    steps = rng.poisson(rng.gamma(0.5, 8.0, size=(32, 4, 16))).astype(float)
    weight = steps.sum(axis=0)
    args = (weight, 20, 1, 1, 4)
    # every reading is a second later: a 0.5 s budget is spent before the first move, and the plan
    # is the search's start, per layer EPLB's packing or the covariance-aware one (whichever
    # scores better), so never worse than EPLB on the objective
    *spent, spent_report = comoe_opt.rebalance_experts(
        *args,
        history=steps,
        time_budget_s=0.5,
        clock=FakeClock(1.0),
        explain=True,
        half_life=DEFAULT.half_life,
    )
    eplb = comoe_opt.rebalance_experts(*args, method="eplb")
    moments = ds.step_moments(ds.normalised(steps.transpose(1, 0, 2), 4), DEFAULT.half_life)
    packed = risk_pack(eplb[0], moments, 4, 1, RISK)
    assert spent_report.stopped_by_time and spent_report.objective <= spent_report.eplb_objective
    assert all(
        np.array_equal(row, eplb[0][layer]) or np.array_equal(row, packed[layer])
        for layer, row in enumerate(spent[0])
    )
    # a clock that stands still: the search runs until no move improves, the same plan each time
    *free, report = comoe_opt.rebalance_experts(
        *args, history=steps, time_budget_s=0.5, clock=FakeClock(0.0), explain=True
    )
    again = comoe_opt.rebalance_experts(*args, history=steps, time_budget_s=0.5, clock=FakeClock(0.0))
    assert not report.stopped_by_time and report.score < report.eplb_score
    # the search from the same start, run to the end, never ends worse than the one stopped at once
    assert report.objective <= spent_report.objective + 1e-12
    assert not all(np.array_equal(a, b) for a, b in zip(free, spent, strict=True))  # it moved
    assert all(np.array_equal(a, b) for a, b in zip(free, again, strict=True))  # and deterministically


@pytest.mark.parametrize("kwargs", [{}, {"history": np.zeros((5, 3, 12))}])
def test_all_zero_history_plans_on_weight(kwargs):
    rng = np.random.default_rng(0)
    weight = rng.gamma(0.7, 100.0, size=(3, 12))
    got = comoe_opt.rebalance_experts(weight, 16, 1, 1, 4, moves=300, explain=True, **kwargs)
    want = comoe_opt.rebalance_experts(weight, 16, 1, 1, 4, moves=300)
    assert all(np.array_equal(a, b) for a, b in zip(got[:3], want, strict=True))
    assert got[3].planned_on.startswith("weight")
    if kwargs:
        assert "no step with any load" in got[3].planned_on


def test_explain_says_when_redundant_slots_buy_nothing():
    # every expert equally loaded in every step: one slot per expert already splits evenly
    flat = np.full((16, 2, 8), 10.0)
    report = comoe_opt.rebalance_experts(flat.sum(axis=0), 12, 1, 1, 4, history=flat, explain=True)[3]
    assert report.redundancy_gain == pytest.approx(0.0, abs=1e-12) and report.redundancy_measurable is False
    assert "NOT measurable" in report.summary()
    # one expert carries half of every step: its replicas are what balance the GPUs
    hot = flat.copy()
    hot[:, :, 0] = 70.0
    report = comoe_opt.rebalance_experts(hot.sum(axis=0), 12, 1, 1, 4, history=hot, explain=True)[3]
    assert report.redundancy_gain > 0.3 and report.redundancy_measurable is True
    assert "measurable" in report.summary() and "NOT" not in report.summary()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"dispatch": "flow"}, "dispatch must be one of even, lp"),
        ({"time_budget_s": -1.0}, "time_budget_s must be finite and non-negative"),
        ({"time_budget_s": float("nan")}, "time_budget_s must be finite"),
        ({"move_cost": True}, "move_cost must be a real number"),
        ({"previous": np.zeros((2, 16), dtype=np.int64)}, r"previous\[0\] holds no slot of expert 1"),
        ({"previous": np.zeros((2, 15), dtype=np.int64)}, r"previous must be \[2, 16\]"),
        ({"previous": np.full((2, 16), 0.5)}, "previous must hold integer expert ids"),
        ({"previous": np.full((2, 16), 12)}, r"previous must hold expert ids in 0\.\.11"),
    ],
)
def test_new_arguments_are_checked(change, message):
    weight = np.random.default_rng(0).gamma(0.7, 100.0, size=(2, 12))
    with pytest.raises(ArgumentError, match=message):
        comoe_opt.rebalance_experts(weight, 16, 1, 1, 4, **change)
