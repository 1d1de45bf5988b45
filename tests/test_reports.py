"""Typed reports: each method family's dataclass, and the flat JSON keys `--json` has always had."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from conftest import make_problem

from comoe_opt.deadline import Deadline
from comoe_opt.mapping import MappingProblem, solve_exact, solve_min_cost_flow
from comoe_opt.mapping.heuristics import least_loaded
from comoe_opt.mapping.problem import LayerCosts
from comoe_opt.mapping.report import BisectionReport, FlowReport, MappingReport
from comoe_opt.residency.heuristics import HEURISTICS, Heuristic
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.report import FullModelReport, HeuristicReport, LPReport, ModelReport
from comoe_opt.residency.solve import solve
from comoe_opt.results import Status

TERMS = {"total_ms", "balance_ms", "miss_ms", "nop_ms", "migration_ms", "pages_moved", "expected_balance"}
TIMING = {"time_limit_s", "total_s", "phases", "stopped_by_time_limit"}
LAYOUT = {"layout_moves"}  # every family: replicas moved to fit policy.layer_slots (0 when unset)
MODEL = {
    "spare_replicas", "placement_from", "warm_start", "warm_start_objective", "replica_model_objective",
    "replica_model_status", "replica_model_bound_from", "build_s", "solver_s", "full_model_bound",
    "cut_rounds", "cuts", "cut_model_bound", "cut_model", "class_bound", "certificate", "lagrangian_bound",
    "group_bound", "group_certificate", "gains", "budget",
}  # fmt: skip
FAMILIES = {
    "greedy": (HeuristicReport, TERMS | TIMING | LAYOUT | {"violations"}),
    "milp": (ModelReport, TERMS | TIMING | LAYOUT | MODEL),
    "full": (
        FullModelReport,
        TERMS | TIMING | LAYOUT | {"solver_objective", "solver_status", "build_s", "solver_s"},
    ),
    "lp": (LPReport, TIMING | LAYOUT | {"relaxation", "solver_status"}),
}


@pytest.mark.parametrize("method", sorted(FAMILIES))
def test_each_slow_loop_family_has_its_report_and_its_json_keys(method):
    p = make_problem(miss=[[5, 5, 5]], work=[[1, 1, 1]], capacity=[3, 3], tokens=[[9, 1, 1]])
    result = solve(p, method, time_limit_s=math.inf)
    family, keys = FAMILIES[method]
    assert isinstance(result.report, family)
    out = result.to_dict()["report"]
    assert set(out) == keys
    json.dumps(out, allow_nan=True)  # plain JSON types (the CLI turns infinities into null)
    assert result.report.timing.to_dict() == {k: out[k] for k in TIMING}
    if result.solution is not None:
        assert result.report.terms is not None and out["total_ms"] == pytest.approx(result.objective)


def test_a_heuristic_that_breaks_a_constraint_reports_its_violations_and_no_terms(monkeypatch):
    p = make_problem(miss=[[5, 5, 5]], work=[[1, 1, 1]], capacity=[1, 1])
    crowded = Placement(np.array([[[True, False]] * 3]))  # 3 pages on a chiplet that holds 1
    monkeypatch.setitem(HEURISTICS, "crowded", Heuristic("crowded", lambda _: crowded, "test"))
    result = solve(p, "crowded")
    assert result.status is Status.NO_SOLUTION and result.report.terms is None
    out = result.to_dict()["report"]
    assert result.report.violations and out["violations"] == list(result.report.violations)
    assert "total_ms" not in out and set(out) == TIMING | LAYOUT | {"violations"}


def test_a_skipped_full_model_still_reports_its_timing():
    p = make_problem(miss=[[5, 5, 5]], work=[[1, 1, 1]], capacity=[3, 3])
    result = solve(p, "full", deadline=Deadline(0.0, clock=lambda: 0.0))  # passed at once, no clock read
    assert result.status is Status.TIME_LIMIT and result.solution is None
    assert isinstance(result.report, FullModelReport) and result.report.terms is None
    assert "full_model: skipped" in result.report.timing.stopped_by_time_limit[0]
    assert math.isinf(result.report.solver_objective)


def _mapping(ready, experts) -> MappingProblem:
    ready = np.array(ready, dtype=np.int64)
    zero, tau = np.zeros(ready.shape[1], dtype=np.int64), np.full(ready.shape[1], 10, dtype=np.int64)
    return MappingProblem(np.array(experts, dtype=np.int64), LayerCosts(ready, zero, tau, zero, ready == 0))


def test_fast_loop_reports_by_method():
    p = _mapping([[0, 0]], [[0]] * 4)
    flow, exact, greedy = solve_min_cost_flow(p), solve_exact(p), least_loaded(p)
    assert isinstance(flow.report, FlowReport) and flow.report.rounds >= 1
    assert isinstance(exact.report, BisectionReport)
    # 4 tokens of 10 ticks on 2 chiplets: the optimum 20 lies in (19, 40] (all on one chiplet);
    # the bisection needs at least one max-flow solve to prove it, at most ceil(log2(40 - 19))
    assert 1 <= exact.report.max_flow_solves <= math.ceil(math.log2(40 - 19))
    assert type(greedy.report) is MappingReport
    for result in (flow, exact, greedy):
        assert result.report.makespan_ticks == 20
        assert result.objective == pytest.approx(result.report.makespan_ticks * result.report.tick_s)
    assert list(flow.to_dict()["report"]) == [
        "makespan_ticks", "tick_s", "flow_cost", "lower_bound_ticks", "rounds", "arcs"
    ]  # fmt: skip
