"""One deadline for a whole solve: every phase is handed the time that remains.

Time is driven by a fake clock (advanced by monkeypatched phases, or by a
fixed step per reading), never by the wall clock: no test here depends on
the machine's speed or on a solver's time limit.
"""

from __future__ import annotations

import dataclasses
import importlib
import math

import numpy as np
import pytest
from conftest import make_problem, small_table

from comoe_opt import highs
from comoe_opt.deadline import Deadline
from comoe_opt.residency.models import cut_model as cuts
from comoe_opt.residency.objective import check_feasible, score
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.search import refine
from comoe_opt.residency.solve import solve
from comoe_opt.results import Status

solve_module = importlib.import_module("comoe_opt.residency.exact.pipeline")  # the models' phases


class FakeClock:
    """Seconds that pass only when a test says so (`advance`), or `step` per reading."""

    def __init__(self, step: float = 0.0):
        self.now, self.step, self.readings = 0.0, step, 0

    def __call__(self) -> float:
        self.readings += 1
        self.now += self.step
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def spread_problem():
    """Two layers, four experts, three chiplets with spare pages (the MILP has work to do)."""
    return make_problem(
        miss=[[5.0, 3.0, 2.0, 1.0], [4.0, 4.0, 1.0, 1.0]],
        work=[[4.0, 2.0, 1.0, 1.0], [3.0, 3.0, 2.0, 1.0]],
        capacity=[4, 3, 3],
        budget=9,
    )


def scenario_problem(moves: int = 200):
    """Two bursty experts on two chiplets, each bursting in its own scenario (the search helps)."""
    work = np.array([[[8.0, 0.0, 1.0, 1.0]], [[0.0, 8.0, 1.0, 1.0]]])
    s_work = np.repeat(work[..., None], 2, axis=-1)
    base = make_problem(miss=np.zeros((1, 4)), work=s_work.mean(axis=0), capacity=[3, 3], all_resident=True)
    return dataclasses.replace(base, scenario_work_ms=s_work, search_moves=moves)


def open_gap_problem():
    """Random bursts on three chiplets whose scenario gap no method closes in a few seconds."""
    rng = np.random.default_rng(1)
    work = rng.exponential(1.0, size=(6, 2, 6)) * (rng.random((6, 2, 6)) < 0.6)
    s_work = np.repeat(work[..., None], 3, axis=-1)
    mean = s_work.mean(axis=0)
    base = make_problem(miss=np.zeros((2, 6)), work=mean, capacity=[6, 5, 5], all_resident=True)
    return dataclasses.replace(base, scenario_work_ms=s_work, search_moves=200)


def slow_heuristics(monkeypatch, clock: FakeClock, seconds: float) -> list[str]:
    """The warm start's first heuristic takes `seconds` on the fake clock; the names that ran."""
    real = solve_module._heuristic
    ran: list[str] = []

    def slow(problem, name):
        clock.advance(0.0 if ran else seconds)
        ran.append(name)
        return real(problem, name)

    monkeypatch.setattr(solve_module, "_heuristic", slow)
    return ran


# ------------------------------------------------------------------ the object


def test_deadline_counts_down_on_its_clock_and_shares_what_remains():
    clock = FakeClock()
    deadline = Deadline(10.0, clock)
    clock.advance(4.0)
    assert deadline.remaining() == 6.0 and not deadline.expired()
    half = deadline.share(0.5)
    assert half.remaining() == 3.0
    with deadline.phase("a"):
        clock.advance(3.0)
    with deadline.phase("a"):  # a phase run twice adds up
        clock.advance(1.0)
    assert half.expired() and not deadline.expired()
    assert deadline.phases == {"a": 4.0} and half.phases == {"a": 4.0}  # one log
    clock.advance(5.0)
    assert deadline.remaining() == 0.0 and deadline.expired()
    timing = deadline.timing()
    assert timing.time_limit_s == 10.0 and timing.total_s == 13.0 and timing.phases == {"a": 4.0}


def test_an_unlimited_deadline_reports_no_limit():
    timing = Deadline(math.inf, FakeClock()).timing()
    assert timing.time_limit_s is None and timing.stopped_by_time_limit == ()
    assert timing.to_dict()["stopped_by_time_limit"] == []  # JSON: a list, and no infinity


# ----------------------------------------------------- phases get what remains


def test_highs_gets_what_the_warm_start_left(monkeypatch, highs_limits):
    clock = FakeClock()
    ran = slow_heuristics(monkeypatch, clock, 9.0)
    result = solve(spread_problem(), "milp", mip_gap=0.0, deadline=Deadline(10.0, clock))
    assert highs_limits and highs_limits[0] == pytest.approx(1.0)  # the replica MILP
    assert all(limit <= 1.0 + 1e-9 for limit in highs_limits)  # and any polish after it
    assert result.report.timing.phases["warm_start"] == pytest.approx(9.0)
    assert result.report.timing.time_limit_s == 10.0
    assert len(ran) > 1  # 9 of 10 s: the warm start went on after its first heuristic


def test_model_build_counts_against_the_deadline(monkeypatch, highs_limits):
    clock = FakeClock()
    real = solve_module.build_replica_model

    def slow_build(problem):
        clock.advance(3.0)
        return real(problem)

    monkeypatch.setattr(solve_module, "build_replica_model", slow_build)
    result = solve(spread_problem(), "milp", mip_gap=0.0, deadline=Deadline(10.0, clock))
    assert highs_limits[0] == pytest.approx(7.0)
    assert result.report.timing.phases["model_build"] == pytest.approx(3.0)
    assert result.report.build_s == pytest.approx(3.0)


def test_an_expired_warm_start_is_returned_flagged_without_a_milp(monkeypatch, highs_limits):
    clock = FakeClock()
    problem = spread_problem()
    ran = slow_heuristics(monkeypatch, clock, 12.0)  # the first heuristic alone passes the limit
    result = solve(problem, "milp", deadline=Deadline(1.0, clock))
    assert highs_limits == []  # HiGHS never started, not even for the LP bound
    assert result.status is Status.TIME_LIMIT
    assert result.solution is not None and not check_feasible(problem, result.solution)
    assert len(ran) == 1 and result.report.warm_start == ran[0]
    assert result.objective == pytest.approx(solve_module._heuristic(problem, ran[0]).objective)
    assert result.objective == pytest.approx(score(problem, result.solution).total)
    assert result.bound == -math.inf  # no bound, and the report says why
    assert result.report.replica_model_bound_from.startswith("none: the time limit passed")
    notes = " | ".join(result.report.timing.stopped_by_time_limit)
    assert "warm start: stopped" in notes and "model_build and milp: skipped" in notes
    assert result.to_dict()["bound"] is None


def test_a_deadline_passed_during_the_hand_over_does_not_start_highs(monkeypatch, highs_limits):
    clock = FakeClock()
    real = highs._hand_over

    def slow_hand_over(solver, model):
        real(solver, model)
        clock.advance(20.0)

    monkeypatch.setattr(highs, "_hand_over", slow_hand_over)
    problem = spread_problem()
    result = solve(problem, "milp", deadline=Deadline(10.0, clock))
    assert highs_limits == []
    assert result.status is Status.TIME_LIMIT and result.solution is not None  # the warm start
    assert result.report.replica_model_status == highs.NOT_STARTED
    assert result.report.placement_from.startswith("warm start")


def test_the_lp_bound_gets_what_remains(monkeypatch, highs_limits):
    """A MILP stopped before its root bound: the LP relaxation runs on the time left, not more."""
    clock = FakeClock()
    real = solve_module.solve_with_highs
    calls = []

    def stopped_first(model, **kwargs):
        calls.append(kwargs)
        if len(calls) == 1:
            clock.advance(6.0)
            return highs.HighsOutcome(Status.TIME_LIMIT, math.inf, -math.inf, 6.0, "time limit")
        return real(model, **kwargs)

    monkeypatch.setattr(solve_module, "solve_with_highs", stopped_first)
    result = solve(spread_problem(), "milp", mip_gap=0.0, deadline=Deadline(10.0, clock))
    assert highs_limits[0] == pytest.approx(4.0)
    assert result.report.replica_model_bound_from.startswith("LP relaxation")
    assert math.isfinite(result.bound) and result.bound <= result.objective + 1e-9


def test_the_full_method_gets_what_its_build_left(monkeypatch, highs_limits):
    clock = FakeClock()
    real = solve_module.build_full_model

    def slow_build(problem):
        clock.advance(4.0)
        return real(problem)

    monkeypatch.setattr(solve_module, "build_full_model", slow_build)
    result = solve(spread_problem(), "full", deadline=Deadline(10.0, clock))
    assert highs_limits == [pytest.approx(6.0)]
    assert result.report.timing.phases["full_model"] == pytest.approx(4.0)


def test_a_polish_whose_build_would_not_fit_is_skipped(highs_limits):
    """`milp` without the class bound: the polish may take all of the 10 s left (no later step
    could use them), and runs only when its build, foreseen at the measured pace, fits half."""
    problem = spread_problem()
    rows = solve_module._full_model_rows(problem)

    def polish_run(pace: float):
        run = solve_module._Run(problem, Deadline(10.0, FakeClock()), 0.0, exact=False)
        run.best = solve_module._Incumbent.of(solve_module._heuristic(problem, "greedy"))
        run.bound, run.seconds_per_row = -math.inf, pace
        solve_module._polish(run)
        return run

    skipped = polish_run(6.0 / rows)  # the build is foreseen at 6 s: more than half of the 10 s left
    assert skipped.polish is None and highs_limits == [] and "polish: skipped" in skipped.deadline.notes[0]
    ran = polish_run(4.0 / rows)  # 4 s fits
    assert ran.polish is not None and highs_limits == [pytest.approx(10.0)]


def test_the_polish_leaves_its_share_when_a_later_step_can_use_the_rest(highs_limits):
    """With `exact` on scenarios the rounds and searches follow: HiGHS gets a quarter of 10 s."""
    problem = scenario_problem()
    run = solve_module._Run(problem, Deadline(10.0, FakeClock()), 0.0, exact=True)
    run.best = solve_module._Incumbent.of(solve_module._heuristic(problem, "greedy"))
    run.bound, run.seconds_per_row = -math.inf, 0.0
    solve_module._polish(run)
    assert run.polish is not None and highs_limits == [pytest.approx(2.5)]


def test_the_full_model_rows_are_foreseen_exactly():
    import pyomo.environ as pyo

    from comoe_opt.residency.models.milp import build_full_model

    for problem in (spread_problem(), scenario_problem()):
        model = build_full_model(problem)
        built = sum(1 for _ in model.component_data_objects(pyo.Constraint, active=True))
        assert solve_module._full_model_rows(problem) == built


# ------------------------------------------------------- loops stop on time


def test_the_search_stops_between_moves_when_the_deadline_passes():
    problem = scenario_problem(moves=10**6)
    start = Placement(np.array([[[True, False], [False, True], [True, True], [True, True]]]))
    clock = FakeClock(step=1.0)  # every reading is one second later
    deadline = Deadline(5.0, clock)
    found = refine.refine(problem, start, deadline=deadline)
    assert clock.readings <= 8  # a million moves were offered; a handful of readings were made
    assert not check_feasible(problem, found)
    assert score(problem, found).total <= score(problem, start).total + 1e-9
    assert any(n.startswith("search:") for n in deadline.notes)


def test_the_search_without_a_deadline_is_unchanged():
    problem = scenario_problem(moves=400)
    start = Placement(np.array([[[True, False], [False, True], [True, True], [True, True]]]))
    unlimited = refine.refine(problem, start, deadline=Deadline(math.inf, FakeClock(step=1.0)))
    assert np.array_equal(unlimited.resident, refine.refine(problem, start).resident)
    assert unlimited.replicas()[0, :2].tolist() == [2, 2]  # it found the even split


def test_cut_rounds_stop_when_their_share_passes(monkeypatch):
    clock = FakeClock()
    real = cuts.DirectModel.solve
    limits = []

    def slow_round(self, *, time_limit_s=None, mip_gap=None, options=None):
        limits.append(time_limit_s)
        clock.advance(2.0)
        return real(self, time_limit_s=time_limit_s, mip_gap=mip_gap, options=options)

    monkeypatch.setattr(cuts.DirectModel, "solve", slow_round)
    problem = scenario_problem(moves=0)
    deadline = Deadline(3.0, clock)
    outcome = cuts.solve_with_cuts(problem, None, deadline=deadline, mip_gap=0.0)
    assert limits[0] == pytest.approx(3.0)
    assert [pytest.approx(3.0 - 2.0 * k) for k in range(len(limits))] == limits
    assert outcome.rounds.rounds == len(limits) == 2  # the second round had 1 s, then none was left
    assert outcome.status is Status.TIME_LIMIT
    assert any(n.startswith("cut rounds: stopped") for n in deadline.notes)


def test_the_cut_model_build_stops_between_layers(monkeypatch):
    solves = []
    monkeypatch.setattr(cuts.DirectModel, "solve", lambda self, **kw: solves.append(kw))
    deadline = Deadline(2.0, FakeClock(step=1.0))  # passes at the second layer of the build
    outcome = cuts.solve_with_cuts(open_gap_problem(), None, deadline=deadline, mip_gap=0.0)
    assert solves == [] and outcome.rounds.rounds == 0
    assert outcome.status is Status.TIME_LIMIT and outcome.bound == -math.inf and outcome.placement is None
    assert deadline.notes == ["cut rounds: the time limit passed while the cut model was built"]


def test_exact_ends_on_its_deadline_with_a_valid_bound(monkeypatch, highs_limits):
    """A clock that advances a fixed step per reading: `exact` with an unreachable gap must stop
    within a few readings of its limit, every phase inside it."""
    clock = FakeClock(step=0.01)
    problem = dataclasses.replace(open_gap_problem(), search_moves=20)
    result = solve(problem, "exact", mip_gap=0.0, deadline=Deadline(2.0, clock))
    assert clock.now <= 2.0 + 0.1  # the few readings after the last check
    assert result.status is Status.TIME_LIMIT
    assert result.solution is not None and not check_feasible(problem, result.solution)
    assert result.bound <= result.objective + 1e-9
    phases = result.report.timing.phases
    assert set(phases) >= {"warm_start", "model_build", "milp", "search", "cut_rounds", "longer_search"}
    assert sum(phases.values()) <= result.report.timing.total_s <= 2.1
    assert all(limit <= 2.0 for limit in highs_limits)


def test_a_generous_deadline_changes_nothing(highs_limits):
    """A clock that stands still and one that crawls (a millisecond per reading) both leave a 60 s
    deadline far off: the same result, optimal, nothing stopped; no real clock is read."""
    problem = spread_problem()
    still = solve(problem, "milp", mip_gap=0.0, deadline=Deadline(60.0, FakeClock()))
    crawling = solve(problem, "milp", mip_gap=0.0, deadline=Deadline(60.0, FakeClock(step=1e-3)))
    assert still.objective == crawling.objective and still.status == crawling.status
    assert (still.solution.resident == crawling.solution.resident).all()
    assert crawling.report.timing.stopped_by_time_limit == () and crawling.status is Status.OPTIMAL
    assert crawling.objective == pytest.approx(solve(problem, "full", time_limit_s=math.inf).objective)


# ------------------------------------------------- planning passes limits on


def test_plan_window_starts_the_deadline_before_building_the_problem(monkeypatch, highs_limits):
    from comoe_opt.instance import instance_from_table
    from comoe_opt.planning import window
    from comoe_opt.trace import instance_batches

    clock = FakeClock()
    monkeypatch.setattr(window, "Deadline", lambda limit: Deadline(limit, clock))
    real = window.residency_problem

    def slow_problem(*args, **kwargs):
        clock.advance(2.5)
        return real(*args, **kwargs)

    monkeypatch.setattr(window, "residency_problem", slow_problem)
    instance = instance_from_table(small_table(), "small")
    batches = instance_batches(instance)
    plan = window.plan_window(instance, batches.window(0, 4), method="milp", time_limit_s=3.0)
    assert highs_limits and highs_limits[0] == pytest.approx(0.5)
    assert plan.result.report.timing.phases["problem"] == pytest.approx(2.5)
    assert plan.result.report.timing.time_limit_s == 3.0


def test_rolling_and_gap_hand_each_window_its_time_limit(monkeypatch):
    from comoe_opt.instance import instance_from_table
    from comoe_opt.planning import gap, rolling, window
    from comoe_opt.trace import instance_batches

    limits: list[float] = []
    real = solve

    def recording(problem, method, **kwargs):
        deadline = kwargs.get("deadline")
        limits.append(deadline.limit_s if deadline is not None else kwargs["time_limit_s"])
        return real(problem, "static" if method in ("milp", "exact") else method, **kwargs)

    monkeypatch.setattr(window, "solve", recording)
    monkeypatch.setattr(gap, "solve", recording)
    instance = instance_from_table(small_table(), "small")
    batches = instance_batches(instance)
    plans = list(rolling.rolling_horizon(instance, batches, "milp", time_limit_s=7.0))
    assert len(plans) == len(limits) == 3 and set(limits) == {7.0}
    limits.clear()
    gap.slow_loop_gap(instance, batches, count=1)
    assert limits and set(limits) == {math.inf}  # an evaluation: work limits, no clock


def test_solve_json_reports_the_phases_and_the_limit(cli, write_toml, table, monkeypatch):
    from comoe_opt.planning import window

    clock = FakeClock(step=1e-3)  # a millisecond per reading: 30 s are never reached
    monkeypatch.setattr(window, "Deadline", lambda limit: Deadline(limit, clock))
    out = cli("solve", write_toml(table), "--time-limit", "30", "--json").json()
    report = out["report"]
    assert report["time_limit_s"] == 30.0 and report["stopped_by_time_limit"] == []
    assert list(report["phases"])[:4] == ["problem", "warm_start", "model_build", "milp"]
    assert sum(report["phases"].values()) <= report["total_s"] + 1e-9
    assert out["runtime_s"] == report["total_s"]


def test_work_limits_are_sized_to_the_instance(monkeypatch):
    """Without a time limit: the cut rounds run to 50 on tiny instances, fewer elsewhere and fewer
    still behind the class bound; the longer annealing runs share one proposal budget over layers."""
    from comoe_opt.residency import schedule

    tiny = schedule.WorkLimits.of(spread_problem())
    assert (tiny.cut_rounds, tiny.cut_rounds_behind_classes) == (50, 50)
    monkeypatch.setattr(schedule, "TINY_SHARES", 0)
    large = schedule.WorkLimits.of(spread_problem())
    assert (large.cut_rounds, large.cut_rounds_behind_classes) == (10, 2)
    layers = spread_problem().layers  # 2 layers: runs of 40,000 per layer (the cap), five of them
    assert (large.longer_proposals, large.longer_runs) == (40_000, 400_000 // (layers * 40_000))
    assert schedule.work_limited(Deadline(math.inf))
    assert not schedule.work_limited(Deadline(10.0, FakeClock()))
