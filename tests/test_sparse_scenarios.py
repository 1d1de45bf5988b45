"""Smoothed balance scenarios for sparse steps: shares, the rolling-origin choice of the smoothing,
and the multinomial draws (stats/sparse.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from comoe_opt.stats.demand import balance_scenarios, demand_from_step_counts
from comoe_opt.stats.sparse import (
    PSEUDO_STEPS,
    choose_pseudo_steps,
    held_out_score,
    multinomial_scenarios,
    smoothed_shares,
)


def test_shares_by_hand() -> None:
    # one layer, 4 experts, 2 steps: counts 6, 2, 0, 0 (8 selections, 4 per step)
    steps = np.array([[[4, 0, 0, 0]], [[2, 2, 0, 0]]])
    assert np.allclose(smoothed_shares(steps, 0.0), [[0.75, 0.25, 0.0, 0.0]])
    # kappa 2 adds 2 steps x 4 per step / 4 experts = 2 to each count, over 8 + 8
    assert np.allclose(smoothed_shares(steps, 2.0), [[8 / 16, 4 / 16, 2 / 16, 2 / 16]])


@given(st.integers(0, 2**32 - 1), st.sampled_from(PSEUDO_STEPS))
def test_shares_are_distributions(seed: int, kappa: float) -> None:
    steps = np.random.default_rng(seed).integers(0, 3, (5, 3, 6))
    steps[:, :, 0] += 1  # every layer has selections
    shares = smoothed_shares(steps, kappa)
    assert np.allclose(shares.sum(axis=1), 1.0) and (shares >= 0).all()


def test_unseen_expert_rules_out_no_smoothing() -> None:
    """Expert 3 never fires before the last block and fires in it: raw shares give it probability 0,
    so kappa 0 scores -inf on that origin and a smoothed kappa wins."""
    steps = np.zeros((5, 1, 4), dtype=np.int64)
    steps[:, 0, 0] = 2
    steps[4, 0, 3] = 1
    assert held_out_score(steps[:4], steps[4:], 0.0) == -np.inf
    choice = choose_pseudo_steps(steps)
    assert choice.pseudo_steps > 0 and choice.scores[0.0] == -np.inf and choice.origins == 4


def test_backtest_smooths_sparse_uniform_steps_and_keeps_stable_skew() -> None:
    rng = np.random.default_rng(0)
    # 128 experts, 64 selections per step (0.5 per expert), uniform: raw shares are noise
    sparse = rng.multinomial(64, np.full(128, 1 / 128), size=(128, 2))
    assert choose_pseudo_steps(sparse).pseudo_steps >= 64
    # 32 experts, 4,096 selections per step, a steady strong skew: the raw shares carry over
    skew = np.arange(1, 33, dtype=float) ** -1.2
    dense = rng.multinomial(4096, skew / skew.sum(), size=(128, 2))
    assert choose_pseudo_steps(dense).pseudo_steps <= 1


def test_multinomial_scenarios_keep_layer_totals_and_are_seeded() -> None:
    shares = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    a = multinomial_scenarios(shares, np.array([10.0, 7.0]), 6)
    assert a.shape == (6, 2, 3)
    assert (a.sum(axis=2) == [10, 7]).all() and (a[:, 0, 2] == 0).all()
    assert np.array_equal(a, multinomial_scenarios(shares, np.array([10.0, 7.0]), 6))


def test_balance_scenarios_models() -> None:
    steps = np.random.default_rng(1).integers(0, 4, (12, 2, 5)).astype(float)
    steps[:, :, 0] += 1
    raw, none = balance_scenarios(steps, 4)
    assert none is None and raw.shape == (4, 2, 5)
    smooth, choice = balance_scenarios(steps, 4, "smoothed", 2.0)
    assert choice is not None and choice.pseudo_steps == 2.0 and smooth.shape == (4, 2, 5)
    assert np.allclose(smooth.sum(axis=2), np.rint(steps.sum(axis=2).mean(axis=0)))
    demand = demand_from_step_counts(steps, 3, 2, 4, "smoothed")
    assert demand.smoothing is not None and demand.smoothing.pseudo_steps in PSEUDO_STEPS
    assert demand.scenario_tokens is not None and demand.scenario_tokens.shape == (4, 2, 5)


def test_policy_keys_reach_the_planner(tmp_path) -> None:
    from conftest import small_table

    from comoe_opt.instance import instance_from_table
    from comoe_opt.planning.window import plan_window
    from comoe_opt.trace import instance_batches

    table = small_table()
    table["policy"].update(balance_scenarios=4, balance_scenario_model="smoothed", scenario_pseudo_steps=-1)
    instance = instance_from_table(table, "small.toml")
    plan = plan_window(instance, instance_batches(instance).window(0, 8), method="eplb")
    assert plan.demand.smoothing is not None and plan.demand.smoothing.origins == 4
    table["policy"].update(scenario_pseudo_steps=-2)
    with pytest.raises(Exception, match="scenario_pseudo_steps"):
        instance_from_table(table, "small.toml")
