"""The drop-in's guard (balancers/dropin/guard.py): a layer keeps the search's map only where it
balances the newest steps at least as well as EPLB's plan; elsewhere EPLB's serves."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import comoe_opt
from comoe_opt.balancers.dropin.guard import guarded, newest_steps
from comoe_opt.balancers.dropin.objective import Shape, normalised, scores
from comoe_opt.balancers.eplb import deepseek_eplb


def test_newest_steps_are_the_last_quarter_and_at_least_one() -> None:
    w = np.arange(2 * 8 * 3, dtype=float).reshape(2, 8, 3)
    assert np.array_equal(newest_steps(w), w[:, 6:])
    assert np.array_equal(newest_steps(w[:, :3]), w[:, 2:3])


def test_a_layer_that_balances_the_newest_steps_worse_takes_eplbs_plan() -> None:
    """2 GPUs, 4 experts, 1 slot each. The newest step loads experts 0 and 1 alone: ours puts them
    on one GPU in layer 0 (max/mean 2), on two in layer 1 (1, as EPLB's); EPLB's splits them."""
    shape = Shape(gpus=2, nodes=1, dispatch="even")
    steps = np.array([[1.0, 1.0, 1.0, 1.0]] * 3 + [[1.0, 1.0, 0.0, 0.0]])  # [S, E]
    w = np.stack([steps, steps])  # [layers, S, E]
    ours = np.array([[0, 1, 2, 3], [0, 2, 1, 3]])  # GPU 0 holds slots 0-1
    theirs = np.array([[0, 2, 1, 3], [0, 3, 1, 2]])
    assert np.allclose(scores(ours, w[:, 3:], shape)[:, 0], [2.0, 1.0])
    served, loses = guarded(ours, theirs, w, shape)
    assert loses.tolist() == [0]
    assert served[0].tolist() == theirs[0].tolist() and served[1].tolist() == ours[1].tolist()
    same, none = guarded(theirs, theirs, w, shape)  # ties keep ours
    assert none.size == 0 and same is theirs


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    dispatch=st.sampled_from(["even", "lp"]),
    steps=st.integers(1, 16),
    previous=st.booleans(),
)
def test_the_drop_in_never_balances_the_newest_steps_worse_than_eplb(seed, dispatch, steps, previous) -> None:
    """Per layer, on the newest quarter of its history, the drop-in's plan is at or below EPLB's
    plan of the same history, under the dispatch it planned for, with or without a map in service."""
    rng = np.random.default_rng(seed)
    layers, experts, replicas, gpus = 3, 8, 12, 4
    history = rng.poisson(rng.gamma(0.5, 4.0, size=(1, layers, experts)), size=(steps, layers, experts))
    history = history.astype(np.float64) + (np.arange(experts) == 0)  # no layer without load
    load = history.sum(axis=0)
    prev = None
    if previous:
        prev = deepseek_eplb(rng.permutation(load, axis=1), replicas, 1, 1, gpus)[0]
    plan = comoe_opt.rebalance_experts(load, replicas, 1, 1, gpus, history=history, previous=prev,
                                       dispatch=dispatch)[0]  # fmt: skip
    eplb = deepseek_eplb(load, replicas, 1, 1, gpus)[0]
    shape = Shape(gpus=gpus, nodes=1, dispatch=dispatch)
    newest = newest_steps(normalised(history.transpose(1, 0, 2), gpus))
    ours = scores(np.asarray(plan), newest, shape).mean(axis=1)
    theirs = scores(eplb, newest, shape).mean(axis=1)
    assert np.all(ours <= theirs + 1e-9)


def test_judged_steps_replace_the_newest() -> None:
    """2 GPUs, 4 experts. Three older steps load experts 0 and 2, the newest 0 and 1: ours (GPU 0
    holds 0 and 1) balances the older ones (max/mean 1 against EPLB's 2) and loses the newest (2
    against 1). On the newest quarter EPLB's serves; judged on every step alike ours does (1.25
    against 1.75)."""
    shape = Shape(gpus=2, nodes=1, dispatch="even")
    steps = np.array([[1.0, 0.0, 1.0, 0.0]] * 3 + [[1.0, 1.0, 0.0, 0.0]])
    w = steps[None]
    ours, theirs = np.array([[0, 1, 2, 3]]), np.array([[0, 2, 1, 3]])
    assert guarded(ours, theirs, w, shape)[1].tolist() == [0]
    served, loses = guarded(ours, theirs, w, shape, judged=w)
    assert loses.size == 0 and served is ours


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**16), previous=st.booleans())
def test_the_held_back_check_serves_the_search_or_eplb_per_layer(seed, previous) -> None:
    """With `held_back`, each layer of the search by steps serves either the plan the search makes
    without the check or EPLB's plan (the check only takes the search's map away)."""
    from comoe_opt.balancers.dropin.config import SearchConfig

    rng = np.random.default_rng(seed)
    layers, experts, replicas, gpus = 4, 32, 48, 16
    history = rng.poisson(rng.gamma(0.5, 8.0, size=(1, layers, experts)), size=(12, layers, experts))
    history = history.astype(np.float64) + 1.0
    history[8:] = history[8:, :, ::-1]  # the newest quarter turns
    load = history.sum(axis=0)
    prev = deepseek_eplb(rng.permutation(load, axis=1), replicas, 2, 2, gpus)[0] if previous else None
    args = (load, replicas, 2, 2, gpus)
    plain = SearchConfig(step_search_gpus=12)
    held = SearchConfig(step_search_gpus=12, held_back=True)
    ours = comoe_opt.rebalance_experts(*args, history=history, previous=prev, config=plain)[0]
    checked = comoe_opt.rebalance_experts(*args, history=history, previous=prev, config=held)[0]
    eplb = comoe_opt.rebalance_experts(*args, history=history, previous=prev, method="eplb")[0]

    def per_gpu(plan: np.ndarray, layer: int) -> list[list[int]]:  # each GPU's experts
        return np.sort(np.asarray(plan)[layer].reshape(gpus, -1), axis=1).tolist()

    for layer in range(layers):
        assert per_gpu(checked, layer) in (per_gpu(ours, layer), per_gpu(eplb, layer)), layer


def test_the_guard_judges_every_step_for_the_search_by_steps_and_the_newest_for_moments() -> None:
    from comoe_opt.balancers.dropin.config import SearchConfig
    from comoe_opt.balancers.dropin.rebalance import ArgumentError, _guard_on_all

    for steps, expected in (("auto", (False, True)), ("newest", (False, False)), ("all", (True, True))):
        config = SearchConfig(guard_steps=steps)
        assert (_guard_on_all(config, False), _guard_on_all(config, True)) == expected, steps
    history = np.ones((4, 1, 4))
    with pytest.raises(ArgumentError, match="guard_steps"):
        comoe_opt.rebalance_experts(history.sum(axis=0), 4, 1, 1, 2, history=history,
                                    config=SearchConfig(guard_steps="recent"))  # fmt: skip
