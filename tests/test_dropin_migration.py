"""The drop-in given the engine's current map (`previous=`): experts that stay keep their GPU and
slot, moves are paid for and counted, and EPLB's re-pack is relabelled onto the map in service."""

from __future__ import annotations

import numpy as np
import pytest

import comoe_opt
from comoe_opt.balancers.dropin import objective as ds
from comoe_opt.balancers.dropin.rebalance import align_gpus, keep_in_place

NO_LIMIT = 1e9


def _moved(new: np.ndarray, old: np.ndarray, experts: int, gpus: int) -> int:
    """By hand: each GPU's replicas of each expert beyond what it held before."""
    total = 0
    per_gpu = new.shape[1] // gpus
    for layer in range(new.shape[0]):
        for g in range(gpus):
            span = slice(g * per_gpu, (g + 1) * per_gpu)
            for e in range(experts):
                total += max(0, int((new[layer, span] == e).sum()) - int((old[layer, span] == e).sum()))
    return total


def test_keep_in_place_by_hand():
    previous = np.array([[0, 1, 2, 3, 4, 5]])  # 2 GPUs x 3 slots
    plan = np.array([[2, 6, 0, 3, 4, 7]])  # GPU 0 keeps 0 and 2, GPU 1 keeps 3 and 4
    assert keep_in_place(plan, previous, 2).tolist() == [[0, 6, 2, 3, 4, 7]]


def test_align_gpus_recovers_a_relabelled_map():
    rng = np.random.default_rng(0)
    previous = np.stack([rng.permutation(np.arange(16) % 12) for _ in range(3)])  # 16 slots, 4 GPUs
    relabelled = previous.reshape(3, 4, 4)[:, [2, 0, 3, 1]].reshape(3, 16)
    aligned = align_gpus(relabelled, previous, 12, 4, 1)
    assert np.array_equal(keep_in_place(aligned, previous, 4), previous)


def _setting(seed: int = 0, drift: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    rates = rng.gamma(0.6, 8.0, size=(4, 16))
    before = rng.poisson(rates, size=(32, 4, 16)).astype(float)
    if drift:  # the loads move on
        rates = rates * rng.gamma(2.0, 0.5, size=rates.shape)
    after = rng.poisson(rates, size=(32, 4, 16)).astype(float)
    previous = comoe_opt.rebalance_experts(before.sum(axis=0), 24, 1, 1, 4, history=before, moves=2000)[0]
    return previous, after, after.sum(axis=0)


def test_experts_that_stay_keep_their_gpu_and_slot():
    previous, steps, weight = _setting()
    plan, _, _, report = comoe_opt.rebalance_experts(
        weight, 24, 1, 1, 4, history=steps, previous=previous, time_budget_s=NO_LIMIT, explain=True
    )
    per_gpu, kept = 6, 0
    for layer in range(4):
        for g in range(4):
            new, old = (
                plan[layer, g * per_gpu : (g + 1) * per_gpu],
                previous[layer, g * per_gpu : (g + 1) * per_gpu],
            )
            for e in set(new.tolist()) & set(old.tolist()):
                # every copy that stays on the GPU stays in a slot it held
                in_place = int(((new == e) & (old == e)).sum())
                assert in_place == min(int((new == e).sum()), int((old == e).sum()))
                kept += in_place
    # a slot changes only to take an arrival: the slots that hold one are the experts moved
    assert kept == (plan == previous).sum() == 96 - report.moved


def test_moves_are_counted_and_priced():
    previous, steps, weight = _setting(1)
    reports = {}
    for cost in (0.0, 0.002, 1.0):
        plan, _, _, report = comoe_opt.rebalance_experts(
            weight, 24, 1, 1, 4, history=steps, previous=previous, move_cost=cost,
            time_budget_s=NO_LIMIT, explain=True, calibrate=False,  # one half-life for every price
        )  # fmt: skip
        assert report.moved == _moved(plan, previous, 16, 4)
        reports[cost] = report
    assert reports[1.0].moved == 0  # no move buys a whole mean GPU load of balance
    assert reports[0.0].moved >= reports[0.002].moved > 0
    assert reports[0.0].score <= reports[1.0].score


def test_eplbs_repack_is_kept_in_place_when_it_is_already_in_service():
    rng = np.random.default_rng(3)
    weight = rng.gamma(0.7, 100.0, size=(3, 12))
    eplb = comoe_opt.rebalance_experts(weight, 16, 1, 1, 4, method="eplb")[0]
    shuffled = eplb.reshape(3, 4, 4)[:, [3, 1, 0, 2]].reshape(3, 16)  # the same plan, GPUs relabelled
    again, _, _, report = comoe_opt.rebalance_experts(
        weight, 16, 1, 1, 4, method="eplb", previous=shuffled, explain=True
    )
    assert report.moved == 0 and report.eplb_moved == 0
    assert np.array_equal(again, shuffled)


def test_far_fewer_moves_than_eplb_at_no_worse_planned_balance():
    """The same rates, fresh steps: EPLB re-packs on the noise, ours moves what pays."""
    previous, steps, weight = _setting(2, drift=False)
    plan, _, _, report = comoe_opt.rebalance_experts(
        weight, 24, 1, 1, 4, history=steps, previous=previous, time_budget_s=NO_LIMIT, explain=True
    )
    eplb = comoe_opt.rebalance_experts(weight, 24, 1, 1, 4, method="eplb")[0]
    w = ds.normalised(steps.transpose(1, 0, 2), 4)
    even = ds.Shape(4, 1, "even")
    assert ds.scores(plan, w, even).mean() <= ds.scores(eplb, w, even).mean() + 1e-9
    assert report.moved * 3 <= _moved(eplb, previous, 16, 4) * 2  # here 32 against 53
    # and on fresh steps at the same rates, which neither plan has seen, it is no worse either
    rates = np.random.default_rng(2).gamma(0.6, 8.0, size=(4, 16))  # _setting's first draw
    fresh_steps = np.random.default_rng(7).poisson(rates, size=(256, 4, 16)).astype(float)
    fresh = ds.normalised(fresh_steps.transpose(1, 0, 2), 4)
    assert ds.scores(plan, fresh, even).mean() <= ds.scores(eplb, fresh, even).mean()


@pytest.mark.parametrize("dispatch", ["even", "lp"])
def test_previous_in_hierarchical_mode_keeps_each_expert_on_one_node(dispatch):
    rng = np.random.default_rng(6)
    steps = rng.poisson(rng.gamma(0.6, 6.0, size=(16, 2, 16))).astype(float)
    previous = comoe_opt.rebalance_experts(steps[:8].sum(axis=0), 24, 4, 2, 4, method="eplb")[0]
    plan = comoe_opt.rebalance_experts(
        steps.sum(axis=0), 24, 4, 2, 4, history=steps, previous=previous, dispatch=dispatch, moves=500
    )[0]
    for layer in range(2):
        node_of = {}
        for slot, expert in enumerate(plan[layer].tolist()):
            assert node_of.setdefault(expert, slot // 12) == slot // 12  # groups stay packed on nodes
        assert len(node_of) == 16
