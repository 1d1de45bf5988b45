"""Weight-read or compute bound: the crossover n* = t_read / t_flop and where a trace's loads sit."""

from __future__ import annotations

import numpy as np
import pytest

from comoe_opt.instance import instance_from_table
from comoe_opt.stats.regime import batch_regime


def _costs(table, **model):
    table["model"].update(model)
    return instance_from_table(table, "small.toml").costs


def test_crossover_by_hand(table) -> None:
    # page 1 GB at 100 GB/s = 10 ms; 0.5 GFLOP per token at 10 TFLOP/s = 0.05 ms: n* = 200 tokens
    costs = _costs(table, expert_gflop_per_token=0.5)
    experts = np.zeros((2, 4, 1, 1), dtype=np.int16)  # 2 steps x 4 tokens, all on expert 0
    experts[1, :2, 0, 0] = 3  # step 1: expert 0 has 2 tokens, expert 3 has 2
    regime = batch_regime(experts, 8, costs)
    assert regime.crossover_tokens == pytest.approx(200.0)
    assert regime.tokens_per_active_expert == pytest.approx((4 + 2 + 2) / 3)
    assert regime.bound == "weight-read" and regime.share_above_crossover == 0.0
    assert not regime.splitting_pays and "does not shorten layers" in regime.summary()


def test_compute_bound_when_loads_pass_the_crossover(table) -> None:
    costs = _costs(table, expert_gflop_per_token=50.0)  # 5 ms per token: n* = 2 tokens
    experts = np.zeros((1, 8, 2, 1), dtype=np.int16)
    experts[0, :, 1, 0] = np.arange(8) % 2  # layer 1: experts 0 and 1 with 4 tokens each
    regime = batch_regime(experts, 8, costs)
    assert regime.crossover_tokens == pytest.approx(2.0)
    assert regime.tokens_per_active_expert == pytest.approx((8 + 4 + 4) / 3)
    assert regime.bound == "compute" and regime.share_above_crossover == 1.0 and regime.splitting_pays


def test_layers_and_steps_are_counted_apart(table) -> None:
    """The same expert id in two layers or two steps is two loads, not one."""
    costs = _costs(table, expert_gflop_per_token=0.5)
    experts = np.zeros((3, 2, 4, 1), dtype=np.int16)
    assert batch_regime(experts, 8, costs).tokens_per_active_expert == pytest.approx(2.0)
