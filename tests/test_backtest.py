"""The migration weight chosen per call by backtest (`policy.migration_weight = -1`,
planning/backtest.py): the one-standard-error rule by hand, the largest weight where copies never
pay, a smaller one where re-placing pays, the same choice on the same input, a user's weight kept,
and the choice reported by `compare`."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import small_table

from comoe_opt.errors import ComoeError, InputError
from comoe_opt.evaluator.compare import CompareSettings, compare, markdown
from comoe_opt.instance import instance_from_table
from comoe_opt.planning import backtest
from comoe_opt.planning.backtest import WEIGHTS, Origin, choose
from comoe_opt.planning.rolling import rolling_horizon
from comoe_opt.planning.window import plan_window, steps_demand

# the backtest re-plans with the planner it is given: the greedy heuristic prices copies as the
# models do (copy_ms per page against the balance it buys) and plans these windows in milliseconds
METHOD = "greedy"


def _instance(**policy):
    """8 experts x 3 layers on 4 devices, 3 slots per device and layer; windows of 4 steps planned
    on the 2 before. Copies cost `replan_copy_ms` = page / link = 1 GB / 10 GB/s = 100 ms."""
    table = small_table()
    table["hardware"].update(capacity_gb=9, d2d_bandwidth_gb_s=10)
    table["trace"].update(tokens_per_batch=256)
    table["policy"].update(
        window_batches=4,
        history_windows=2,
        all_resident=True,
        balance="tokens",
        balance_scenarios=8,
        anneal_proposals=0,  # compare plans CoMoE with milp: a small search keeps it fast
        search_moves=50,
        migration_weight=-1,
    )
    table["policy"].update(policy)
    return instance_from_table(table, "small.toml")


def _steps(windows: int, hot_from: int) -> np.ndarray:
    """[windows x 4, 3, 8] counts: 20 per expert, 400 on one expert; expert 0 is the hot one before
    window `hot_from`, expert 5 from it on (small seeded noise on every count)."""
    rng = np.random.default_rng(0)
    out = []
    for w in range(windows):
        for _ in range(4):
            counts = np.full((3, 8), 20)
            counts[:, 0 if w < hot_from else 5] = 400
            out.append(counts + rng.integers(0, 3, counts.shape))
    return np.array(out)


def _origin(window: int, scores: dict[float, list[float]]) -> Origin:
    return Origin(window, {w: np.array(v, dtype=float) for w, v in scores.items()}, dict.fromkeys(scores, 0))


def test_one_standard_error_rule_by_hand():
    # per-step scores on 4 held-out steps; weight 0 is best (mean 10). Excess over it, paired:
    # 0.03: [0, 0, 0, 0.4] mean 0.1, sd 0.2, se 0.1 -> within; 0.1: [0.2]*4 mean 0.2, se 0 -> out
    base = [10.0, 11.0, 9.0, 10.0]
    scores = {
        0.0: base,
        0.03: [10.0, 11.0, 9.0, 10.4],
        0.1: [10.2, 11.2, 9.2, 10.2],
        0.3: [11.0, 12.0, 10.0, 11.0],
        1.0: [12.0, 13.0, 11.0, 12.0],
    }
    choice = choose([_origin(5, scores)], 7)
    assert choice.weight == 0.03 and choice.chosen_at == 7 and choice.origins == (5,)
    assert choice.excess_ms[0.03] == pytest.approx(0.1) and choice.se_ms[0.03] == pytest.approx(0.1)
    # all alike, not one weight told apart from the one in force: that one is kept
    alike = [_origin(5, dict.fromkeys(WEIGHTS, base))]
    assert choose(alike, 7, current=0.1).weight == 0.1 and choose(alike, 7, current=0.3).weight == 0.3
    # pooled origins: a second origin where 0.03 is clearly worse pulls the choice to 0
    worse = {**scores, 0.03: [12.0, 13.0, 11.0, 12.0]}
    assert choose([_origin(5, scores), _origin(6, worse)], 8).weight == 0.0


def test_a_tie_with_the_weight_in_force_keeps_it():
    # the weights above 0 moved nothing at the origin (its history held nothing new): weight 0's
    # churn scored worse, 0.03-1 tie with the prior exactly, so nothing argues for leaving it
    tied = [10.0, 11.0, 9.0, 10.0]
    scores = {0.0: [10.5, 11.0, 9.4, 10.0], **dict.fromkeys(WEIGHTS[1:], tied)}
    origin = Origin(
        5, {w: np.array(v) for w, v in scores.items()}, {0.0: 900, **dict.fromkeys(WEIGHTS[1:], 0)}
    )
    assert choose([origin], 7, current=backtest.PRIOR).weight == backtest.PRIOR
    # weight 1 told apart from the prior by one fewer page moved, at the same balance: the rule
    # picks the fewest copies within one standard error, as before
    apart = Origin(5, origin.step_ms, {**origin.copies, 0.1: 1})
    assert choose([apart], 7, current=backtest.PRIOR).weight == 1.0
    # a weight not on the grid (a user's) is never "in force" for the rule
    assert choose([origin], 7, current=0.2).weight == 1.0


def test_stationary_trace_keeps_the_largest_weight():
    plans = list(rolling_horizon(_instance(), _steps(5, hot_from=99), METHOD))
    chosen = [p.weight for p in plans if p.weight.chosen_at == p.window]
    assert [c.window for c in chosen] == [backtest.FIRST_WINDOW]
    # nothing to gain from a copy: the prior moved a page weight 1 did not, for no better balance
    assert chosen[0].copies[backtest.PRIOR] > chosen[0].copies[max(WEIGHTS)] == 0
    assert chosen[0].weight == max(WEIGHTS)
    assert [p.weight.weight for p in plans] == [backtest.PRIOR] * 3 + [max(WEIGHTS)] * 2
    assert sum(p.pages_moved for p in plans[backtest.FIRST_WINDOW :]) == 0  # none once chosen


def test_shifting_trace_pays_for_copies():
    # the hot expert moves at window 1: window 2 is re-planned on windows 0-1 (half old, half new)
    # from window 1's plan (made on window 0): the held-out window 2 rewards copies more than
    # the plan's history foresees, so a weight below the largest wins even at the copies' full time
    plans = list(rolling_horizon(_instance(), _steps(4, hot_from=1), METHOD))
    choice = plans[backtest.FIRST_WINDOW].weight
    assert choice.chosen_at == backtest.FIRST_WINDOW and choice.origins == (2,)
    assert choice.weight < max(WEIGHTS)
    assert choice.copies[choice.weight] > choice.copies[max(WEIGHTS)]
    assert choice.mean_ms[choice.weight] < choice.mean_ms[max(WEIGHTS)]


def test_copies_counted_not_timed_choose_the_best_balance():
    instance = _instance(backtest_copy_share=0.0)
    choice = list(rolling_horizon(instance, _steps(4, hot_from=1), METHOD))[3].weight
    best = min(choice.mean_ms.values())
    assert choice.mean_ms[choice.weight] <= best + choice.se_ms[choice.weight] + 1e-12
    # the same origin charged the copies' whole time never prefers more copies than this
    timed = list(rolling_horizon(_instance(), _steps(4, hot_from=1), METHOD))[3].weight
    assert timed.weight >= choice.weight


def test_same_input_same_choice():
    runs = [list(rolling_horizon(_instance(), _steps(4, hot_from=1), METHOD)) for _ in range(2)]
    first, second = ([p.weight.to_dict() for p in run] for run in runs)
    assert first == second
    assert [p.placement.resident.tobytes() for p in runs[0]] == [
        p.placement.resident.tobytes() for p in runs[1]
    ]


def test_a_users_weight_is_kept(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("a fixed weight runs no backtest")

    monkeypatch.setattr(backtest, "held_out", fail)
    plans = list(rolling_horizon(_instance(migration_weight=0.3), _steps(4, hot_from=1), METHOD))
    assert [(p.weight.weight, p.weight.chosen_at) for p in plans] == [(0.3, None)] * 4


def test_bad_weights_are_named():
    with pytest.raises(InputError, match=r"policy\.migration_weight"):
        _instance(migration_weight=-0.5)
    instance = _instance()
    steps = _steps(2, hot_from=9)
    first = plan_window(instance, steps_demand(instance, steps[:4]), migration_weight=0.1).placement
    with pytest.raises(ComoeError, match="migration_weight = -1"):
        plan_window(instance, steps_demand(instance, steps[4:]), first)


def test_compare_reports_the_backtest():
    instance = _instance()
    result = compare(
        instance, _steps(4, hot_from=1), CompareSettings(peers=("eplb", "comoe"), bound_windows=0)
    )
    report = result["migration_weight"]
    assert len(report["per_window"]) == 4 and report["backtests"][0]["window"] == backtest.FIRST_WINDOW
    assert set(report["backtests"][0]["mean_ms"]) == {f"{w:g}" for w in WEIGHTS}
    assert "policy.migration_weight per window" in markdown(result)


def test_solve_rolling_reports_the_weight(write_toml, cli):
    table = small_table()
    table["trace"].update(micro_batches=16)
    table["policy"].update(window_batches=4, migration_weight=-1, anneal_proposals=0, search_moves=20)
    rows = cli("solve", write_toml(table), "--rolling", "--method", METHOD, "--json").json()["windows"]
    weights = [row["migration_weight"] for row in rows]
    assert [w["weight"] for w in weights[: backtest.FIRST_WINDOW]] == [backtest.PRIOR] * backtest.FIRST_WINDOW
    chosen = weights[backtest.FIRST_WINDOW]
    assert chosen["chosen_at"] == backtest.FIRST_WINDOW and chosen["weight"] in WEIGHTS
    assert set(chosen["mean_ms"]) == {f"{w:g}" for w in WEIGHTS}
    # the one-standard-error rule, from the evidence the report gives: the largest weight whose
    # excess over the best is within one standard error, or the weight in force where the two moved
    # the same pages and scored the same
    excess, se = ({float(k): v for k, v in chosen[key].items()} for key in ("excess_ms", "se_ms"))
    assert min(excess.values()) == 0.0
    rule = max(w for w in WEIGHTS if excess[w] <= se[w])
    if chosen["weight"] != rule:
        kept, key = chosen["weight"], f"{rule:g}"
        assert kept == backtest.PRIOR, (kept, rule)
        assert chosen["copies"][f"{kept:g}"] == chosen["copies"][key]
        assert chosen["mean_ms"][f"{kept:g}"] == chosen["mean_ms"][key]


def test_a_planner_that_prices_no_copy_runs_no_backtest(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("EPLB re-plans from scratch: no weight to choose")

    monkeypatch.setattr(backtest, "held_out", fail)
    plans = list(rolling_horizon(_instance(), _steps(4, hot_from=1), "eplb"))
    assert {(p.weight.weight, p.weight.chosen_at) for p in plans} == {(backtest.PRIOR, None)}
