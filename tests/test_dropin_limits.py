"""The drop-in's size limits: refused in one ValueError line naming the argument, before any
array is built; and the search's arrays stay bounded where experts or slots are many."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import comoe_opt
from comoe_opt.balancers.dropin import objective as ds
from comoe_opt.balancers.dropin import rebalance as ep_balance
from comoe_opt.balancers.dropin.config import DEFAULT
from comoe_opt.balancers.dropin.even_search import EvenSearch
from comoe_opt.balancers.dropin.neighbourhood import slot_pairs


@pytest.mark.parametrize(
    "weight_shape, args, named",
    [
        ((1, 10**6), (10**6, 1, 1, 1), "weight has 1,000,000 experts per layer"),
        ((1, 10**6), (10**6, 1, 1, 1000), "weight has 1,000,000 experts"),
        ((2000, 8), (8, 1, 1, 1), "weight has 2,000 layers"),
        ((1, 8), (10**6, 1, 1, 1), "num_replicas must be at most 8,192"),
        ((1, 8), (4096, 1, 1, 2048), "num_gpus must be at most 1,024"),
    ],
)
def test_sizes_past_the_limits_are_one_value_error(weight_shape, args, named):
    weight = np.ones(weight_shape)
    with pytest.raises(ValueError, match=named) as caught:
        comoe_opt.rebalance_experts(weight, *args)
    assert "\n" not in str(caught.value)


def _bursty(layers: int, experts: int, steps: int = 40, seed: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.poisson(rng.gamma(0.4, 6.0, size=(steps, layers, experts))).astype(float)


def test_covariances_held_a_few_layers_at_a_time_give_the_same_plan():
    """With room for one layer's pairwise covariances only, every layer's are computed again when
    needed: the same numbers, so the same plan as with all layers held."""
    steps = _bursty(5, 24)
    args = (steps.sum(axis=0), 32, 1, 1, 8)
    held = comoe_opt.rebalance_experts(*args, history=steps, moves=3000)
    one_room = comoe_opt.rebalance_experts(
        *args, history=steps, moves=3000, config=replace(DEFAULT, cross_bytes=8 * 24 * 24)
    )
    for a, b in zip(held, one_room, strict=True):
        assert np.array_equal(a, b)


def test_a_node_with_too_many_slots_searches_its_hottest_gpus():
    """Past `max_neighbourhood` a layer scores only the moves off its hottest GPUs: still a valid
    plan (every expert placed, the slots per GPU kept) that never scores worse than its start."""
    config = replace(DEFAULT, max_neighbourhood=200)
    steps = _bursty(3, 32)
    weight = steps.sum(axis=0)
    plan, _, logcnt, report = comoe_opt.rebalance_experts(
        weight, 48, 1, 1, 8, history=steps, explain=True, config=config
    )
    assert (logcnt >= 1).all() and (logcnt.sum(axis=1) == 48).all()
    assert report.objective <= report.eplb_objective + 1e-12
    moments = ds.step_moments(ds.normalised(steps.transpose(1, 0, 2), 8), DEFAULT.half_life)
    search = EvenSearch(plan, moments, ds.Shape(8, 1, "even"), None, 0.0, config=config)
    si, _, hot = slot_pairs(48, 6, 48, 8, search.mu[0], config.max_neighbourhood)
    assert hot is not None and 0 < hot.sum() < 8
    assert hot[si // 6].all()  # every swap takes a slot off a hot GPU


def test_limits_are_documented():
    text = (Path(__file__).resolve().parent.parent / "docs" / "api.md").read_text(encoding="utf-8")
    for limit in (
        ep_balance.MAX_EXPERTS,
        ep_balance.MAX_REPLICAS,
        ep_balance.MAX_GPUS,
        ep_balance.MAX_LAYERS,
    ):
        assert f"{limit:,}" in text
