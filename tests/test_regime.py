"""The regime map: calibration on static, the paper's claims, the best point, and the
shortcuts the replay takes (each checked against the computation it skips)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from conftest import small_table
from hypothesis import given
from hypothesis import strategies as st

from comoe_opt.best_split.shares import share_lp, solve_share_lp
from comoe_opt.evaluator import fastmap
from comoe_opt.evaluator.calibration import attention_for_share, calibrated, static_rest_ms
from comoe_opt.evaluator.claims import ABLATIONS, AXES, CLAIMS, MAP_STRATEGIES, best_point, point_table
from comoe_opt.evaluator.runs import distinct_runs, eval_run, evaluate_strategy, run_many
from comoe_opt.instance import instance_from_table
from comoe_opt.trace import instance_batches


def _instance(**runtime):
    table = small_table()
    table["runtime"] = runtime
    return instance_from_table(table, "small.toml")


@pytest.mark.parametrize("share", [0.1, 0.28, 0.5])
def test_attention_share_makes_attention_that_share_of_static_latency(share):
    instance = _instance(attention_share=share)
    result = evaluate_strategy(instance, "static")
    assert result["attention_ms"] == pytest.approx(share * result["mean_ms"], rel=1e-9)


def test_static_latency_is_affine_in_attention():
    """What the calibration rests on: static's latency minus attention does not depend on it."""
    batches = instance_batches(_instance())
    rests = []
    for attention in (0.0, 0.7, 3.0):
        metrics = evaluate_strategy(_instance(attention_ms=attention), "static")
        rests.append(metrics["mean_ms"] - attention)
    assert rests == pytest.approx([rests[0]] * 3, rel=1e-12)
    assert rests[0] == pytest.approx(static_rest_ms(_instance(), batches), rel=1e-12)


def test_without_a_share_the_instance_is_unchanged():
    instance = _instance(attention_ms=0.9)
    assert calibrated(instance, instance_batches(instance)) is instance


def test_attention_for_share_solves_share_equation():
    for share, rest in ((0.28, 3.4), (0.0, 1.0), (0.9, 0.2)):
        attention = attention_for_share(share, rest)
        assert attention / (attention + rest) == pytest.approx(share)
    with pytest.raises(ValueError):
        attention_for_share(1.0, 1.0)


# ------------------------------------------------------------------ claims


def _point(**changes) -> dict[str, dict[str, float]]:
    """A point where every claim holds, with `strategy_metric=value` changes."""
    base = {"mean_ms": 4.0, "p95_ms": 5.0, "load_gb_per_batch": 10.0, "balance": 0.5, "replica_factor": 1.0}
    point = {s: dict(base) for s in MAP_STRATEGIES}
    point["hot"].update(p95_ms=4.5)
    point["transition"].update(load_gb_per_batch=1.5, mean_ms=3.0, p95_ms=3.5)
    point["comoe"].update(mean_ms=1.6, p95_ms=1.7, load_gb_per_batch=1.0, balance=0.85, replica_factor=1.2)
    for s in ABLATIONS:
        point[s].update(p95_ms=2.0)
    for key, value in changes.items():
        strategy, metric = key.split("__")
        point[strategy.replace("_", "-")][metric] = value
    return point


def _rows(points: dict[tuple, dict]) -> pd.DataFrame:
    rows = []
    for axes, point in points.items():
        for strategy, metrics in point.items():
            rows.append({**dict(zip(AXES, axes, strict=True)), "method": strategy, **metrics})
    return pd.DataFrame(rows)


def test_every_claim_holds_at_the_hand_made_point():
    table = point_table(_rows({(253, 2000, 512, 0.28): _point()}))
    row = table.iloc[0]
    assert row["claims_held"] == len(CLAIMS)
    assert row["half-of-static.margin"] == pytest.approx(0.5 - 1.6 / 4.0)
    assert row["prefetch-cut.margin"] == pytest.approx((1 - 1.5 / 10) - 0.8)
    assert row["ablations.margin"] == pytest.approx(2.0 / 1.7 - 1)


@pytest.mark.parametrize(
    ("change", "claim"),
    [
        ({"transition__p95_ms": 1.65}, "lowest"),  # transition's P95 is lower
        ({"comoe__load_gb_per_batch": 2.0}, "lowest"),
        ({"hot__p95_ms": 5.0}, "hot-p95"),  # a tie is not a win
        ({"transition__load_gb_per_batch": 2.5}, "prefetch-cut"),  # a 75% cut
        ({"comoe__replica_factor": 1.0}, "balance"),
        ({"comoe__balance": 0.79}, "balance"),
        ({"no_credits__p95_ms": 1.7}, "ablations"),  # one ablation only ties
        ({"comoe__mean_ms": 2.01}, "half-of-static"),
    ],
)
def test_each_claim_fails_alone_when_its_condition_breaks(change, claim):
    row = point_table(_rows({(253, 2000, 512, 0.28): _point(**change)})).iloc[0]
    assert not row[f"{claim}.holds"]
    assert row["claims_held"] == len(CLAIMS) - 1


def test_nothing_to_cut_when_static_loads_nothing():
    point = _point(static__load_gb_per_batch=0.0, hot__load_gb_per_batch=0.0)
    point["transition"]["load_gb_per_batch"] = 0.0
    point["comoe"]["load_gb_per_batch"] = 0.0
    row = point_table(_rows({(320, 2000, 512, 0.28): point})).iloc[0]
    assert row["prefetch-cut.margin"] == -math.inf
    assert row["lowest.holds"]  # nobody loads: CoMoE's loading is (jointly) lowest


def test_best_point_has_most_claims_then_static_loading_nearest_the_paper():
    points = {
        (253, 2000, 512, 0.1): _point(comoe__mean_ms=3.0),  # 5 claims
        (256, 2000, 512, 0.1): _point(static__load_gb_per_batch=30.0),  # 6 claims, far from 12.95
        (320, 2000, 512, 0.1): _point(static__load_gb_per_batch=12.0),  # 6 claims, near
    }
    best = best_point(point_table(_rows(points)))
    assert best["hardware.capacity_gb"] == 320


def test_a_point_missing_a_strategy_is_an_error():
    rows = _rows({(253, 2000, 512, 0.28): _point()})
    with pytest.raises(Exception, match="lacks single-scale"):
        point_table(rows[rows["method"] != "single-scale"])


# --------------------------------------------------------- replay shortcuts


@given(
    st.integers(1, 12),
    st.integers(1, 5),
    st.integers(0, 2**32 - 1),
    st.floats(0.0, 1.0),
)
def test_share_lp_without_choices_equals_the_lp(experts, chiplets, seed, resident_rate):
    rng = np.random.default_rng(seed)
    resident = np.zeros((experts, chiplets), dtype=bool)
    homes = rng.integers(chiplets, size=experts)
    placed = rng.random(experts) < resident_rate
    resident[np.flatnonzero(placed), homes[placed]] = True
    work, cost = rng.random((experts, chiplets)), rng.random((experts, chiplets)) * 0.1
    z, objective, shares = share_lp(work, resident, cost)
    active = np.arange(experts)
    allowed = resident | ~resident.any(axis=1, keepdims=True)
    z_lp, objective_lp, _ = solve_share_lp(work, cost, active, allowed)
    assert objective == pytest.approx(objective_lp, rel=1e-9, abs=1e-12)
    assert z == pytest.approx(z_lp, rel=1e-9, abs=1e-12)
    assert np.allclose(shares.sum(axis=1), 1.0)


@given(st.integers(0, 2**32 - 1), st.integers(1, 6), st.integers(2, 6), st.booleans())
def test_a_forced_flow_is_what_the_flow_returns(seed, used, chiplets, choice):
    """Every unit with one usable chiplet: the shortcut's assignment is the min-cost flow's;
    one unit with two chiplets: no shortcut."""
    rng = np.random.default_rng(seed)
    ready = np.full((used, chiplets), np.inf)
    homes = rng.integers(chiplets, size=used)
    ready[np.arange(used), homes] = rng.random(used)
    units = np.arange(used)[:, None]
    if choice:
        ready[0] = 0.3
        assert fastmap.forced_assignment(units, ready) is None
        return

    class Runtime:
        speeds = fastmap.ChipletSpeeds(
            read_ms=np.full(chiplets, 0.5), flop_ms=np.full(chiplets, 0.01), hop_ms=np.zeros(chiplets)
        )

    forced = fastmap.forced_assignment(units, ready)
    flow = fastmap.min_cost_flow(Runtime, 0, units, ready, np.full(chiplets, 0.5), np.isfinite(ready))
    assert (forced[:, 0] == homes).all()
    assert np.array_equal(forced, flow)


def test_runs_differing_only_in_label_run_once():
    instance = _instance()
    runs = [eval_run(instance, "static", 6, x=1), eval_run(instance, "static", 6, x=2)]
    runs.append(eval_run(instance, "transition", 6, x=1))
    assert distinct_runs(runs) == 2
    calls = []
    results = run_many(runs, progress=lambda: calls.append(1))
    assert len(calls) == 2
    assert [r["x"] for r in results] == [1, 2, 1]
    assert results[0]["mean_ms"] == results[1]["mean_ms"]


def test_runs_start_longest_first_and_come_back_in_the_callers_order(monkeypatch):
    """`run_many` starts the strategies that plan with a model first (comoe before eplb and the
    oracle), and returns the results in the order it was given the runs."""
    import comoe_opt.evaluator.runs as runs_module

    started = []

    def record(run):
        started.append(run.strategy)
        return {"s": run.strategy}

    monkeypatch.setattr(runs_module, "run_eval", record)
    names = ["eplb", "oracle", "comoe", "static"]
    results = run_many([eval_run(_instance(), s, 6) for s in names])
    assert started == ["comoe", "oracle", "eplb", "static"]
    assert [r["s"] for r in results] == names


def test_claims_printed_by_paper_match_the_map():
    """`paper` prints the claims from its Table 4 and 5 rows with the map's margins."""
    from comoe_opt.evaluator.paper import format_claims, regime_point

    point = _point(hot__p95_ms=6.0)
    table4 = [{"strategy": s, **point[s]} for s in ("static", "hot", "transition", "comoe")]
    table5 = [{"strategy": s, **point[s]} for s in ("comoe", *ABLATIONS)]
    text = format_claims(table4, table5)
    assert text.count("* holds:") == len(CLAIMS) - 1
    assert "* fails: hot replication beats static on P95 latency" in text
    where = regime_point(_instance(attention_share=0.1))
    assert "capacity 4 GB per chiplet" in where and "attention 0.1 of static's latency" in where


def _rebalance_reference(problem, out, leased, previous):
    """The swap search of `assign._rebalance` written as loops (its definition)."""
    share = problem.work_ms[0] / np.maximum(out.sum(axis=1), 1)[:, None]
    load = (share * out).sum(axis=0)
    movable = out & ~leased
    for _ in range(4 * problem.experts):
        c = int(np.argmax(load))
        best = None
        for e in np.flatnonzero(movable[:, c]):
            f_idx, d_idx = np.nonzero(movable & ~out[e][None, :] & ~out[:, c][:, None])
            if f_idx.size == 0:
                continue
            new_c = load[c] - share[e, c] + share[f_idx, c]
            new_d = load[d_idx] - share[f_idx, d_idx] + share[e, d_idx]
            peak = np.maximum(new_c, new_d)
            copies = np.zeros(f_idx.size)
            if previous is not None:
                before = (~previous[e, c]).astype(int) + (~previous[f_idx, d_idx]).astype(int)
                copies = (~previous[e, d_idx]).astype(int) + (~previous[f_idx, c]).astype(int) - before
            gain = problem.batches * (load[c] - peak) - problem.copy_ms * copies
            i = int(np.argmax(gain))
            if gain[i] > 1e-12 and peak[i] < load[c] - 1e-12 and (best is None or gain[i] > best[0]):
                best = (gain[i], e, int(f_idx[i]), int(d_idx[i]))
        if best is None:
            return
        _, e, f, d = best
        out[e, c], out[e, d], out[f, d], out[f, c] = False, True, False, True
        movable[e, c], movable[e, d], movable[f, d], movable[f, c] = False, True, False, True
        load[c] += share[f, c] - share[e, c]
        load[d] += share[e, d] - share[f, d]


@given(st.integers(0, 2**32 - 1), st.integers(2, 10), st.integers(2, 5), st.booleans())
def test_vectorised_rebalance_is_the_loop(seed, experts, chiplets, with_previous):
    from types import SimpleNamespace

    from comoe_opt.residency.heuristics.assign import _rebalance

    rng = np.random.default_rng(seed)
    out = np.zeros((experts, chiplets), dtype=bool)
    for e in range(experts):
        k = int(rng.integers(1, chiplets + 1)) if rng.random() < 0.3 else 1
        out[e, rng.choice(chiplets, k, replace=False)] = True
    leased = out & (rng.random((experts, chiplets)) < 0.1)
    previous = rng.random((experts, chiplets)) < 0.5 if with_previous else None
    problem = SimpleNamespace(
        work_ms=rng.random((1, experts, chiplets)).round(1),  # rounded: ties between swaps
        experts=experts,
        batches=int(rng.integers(1, 5)),
        copy_ms=float(rng.random()),
    )
    expected, got = out.copy(), out.copy()
    _rebalance_reference(problem, expected, leased, previous)
    _rebalance(problem, 0, got, leased, previous)
    assert np.array_equal(expected, got)


def test_ties_go_to_the_point_where_the_claims_hold_most_robustly():
    points = {
        (253, 2000, 512, 0.1): _point(static__load_gb_per_batch=12.9),  # smallest margin 0.05
        # smallest margin 0.1, static loading farther from the paper's: robustness decides
        (256, 2000, 512, 0.1): _point(
            comoe__balance=0.95, comoe__replica_factor=1.5, static__load_gb_per_batch=20.0
        ),
    }
    best = best_point(point_table(_rows(points)))
    assert best["hardware.capacity_gb"] == 256
