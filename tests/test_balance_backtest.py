"""What the slow loop balances, chosen per call by backtest on modelled time (`policy.balance =
"auto"`, planning/balance_backtest.py): the choice is the mode whose re-plan of the origin serves it
faster (recomputed here), the same on the same input, and "auto" outside a rolling horizon plans as
"tokens", its prior."""

from __future__ import annotations

import numpy as np
from conftest import small_table

from comoe_opt.instance import instance_from_table, with_overrides
from comoe_opt.planning import balance_backtest
from comoe_opt.planning.balance_backtest import FIRST_WINDOW, BalanceBacktest
from comoe_opt.planning.rolling import Leases, rolling_horizon
from comoe_opt.planning.window import plan_window, steps_demand
from comoe_opt.trace.batching import windows

METHOD = "greedy"  # plans these windows in milliseconds; the choice does not depend on the method


def _instance(balance: str = "auto"):
    """8 experts x 3 layers on 4 devices, 3 slots per device and layer, windows of 4 steps."""
    table = small_table()
    table["hardware"].update(capacity_gb=9, copy_topology="devices")
    table["policy"].update(
        window_batches=4,
        history_windows=1,
        all_resident=True,
        balance=balance,
        balance_scenarios=4,
        migration_weight=0.1,
        layer_slots=3,
    )
    return instance_from_table(table, "small.toml")


def _steps(n: int) -> np.ndarray:
    """Sparse decode-like counts: most experts idle in a step, a few hot."""
    rng = np.random.default_rng(5)
    share = rng.dirichlet(np.full(8, 0.3), size=3)
    return np.array([[rng.multinomial(6, row) for row in share] for _ in range(n)])


def test_the_choice_is_the_mode_that_served_the_origin_faster() -> None:
    instance, steps = _instance(), _steps(16)
    plans = list(rolling_horizon(instance, steps, METHOD))
    choice = plans[FIRST_WINDOW].balance
    assert choice.chosen_at == FIRST_WINDOW and set(choice.ms_per_step) == {"tokens", "work"}
    assert choice.mode == min(choice.ms_per_step, key=lambda m: (choice.ms_per_step[m], m != "tokens"))
    assert all(p.balance.mode == "tokens" for p in plans[:FIRST_WINDOW])  # the prior
    # recomputed: origin 2 planned with each mode from window 1's plan, its leases, scored on its
    # own steps
    o = FIRST_WINDOW - 1
    spans = windows(steps.shape[0], 4)
    scorer = BalanceBacktest(instance, lambda a, b: steps[a:b])
    leases = Leases(instance.policy.lease_windows)
    for w in range(o):
        leases.renew(w, plans[w].placement, plans[w - 1].placement if w else None)
    for mode, ms in choice.ms_per_step.items():
        fixed = with_overrides(instance, {"policy.balance": mode})
        demand = steps_demand(fixed, steps[slice(*spans[o - 1])])
        plan = plan_window(
            fixed, demand, plans[o - 1].placement, leases.active(o), method=METHOD, batches=4,
            migration_weight=0.1,
        )  # fmt: skip
        assert scorer.ms_per_step(plan.placement, steps[slice(*spans[o])]) == ms


def test_same_input_same_choice_and_auto_alone_plans_as_tokens() -> None:
    runs = [list(rolling_horizon(_instance(), _steps(16), METHOD)) for _ in range(2)]
    assert [p.balance.to_dict() for p in runs[0]] == [p.balance.to_dict() for p in runs[1]]
    steps = _steps(4)
    auto, tokens = _instance(), _instance("tokens")
    planned = [plan_window(i, steps_demand(i, steps), method=METHOD).placement for i in (auto, tokens)]
    assert (planned[0].resident == planned[1].resident).all()
    assert balance_backtest.PRIOR == "tokens"
