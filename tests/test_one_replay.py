"""One replay: `compare`, the drop-in benchmark's and the regime suite's replay (benchmarks/_common.py)
and a direct call of `replay.replay` give the same rows for the same input."""

from __future__ import annotations

import _common
import numpy as np
import pytest
from test_compare import _instance

from comoe_opt.evaluator.compare import CompareSettings, compare, row_of
from comoe_opt.evaluator.frontier import DROPIN_MOVES, dropin_point
from comoe_opt.replay import DropIn, EplbLayout, Rolling, replay
from comoe_opt.trace import instance_batches
from comoe_opt.trace.batching import step_counts, windows

# not the replay's: wall-clock planning seconds, and compare's gap to its bound and net time against
# its baseline row (computed across rows; no suite has them)
APART = ("plan_s", "gap_to_bound", "net_ms_per_replan")


def _untimed(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in APART}


@pytest.fixture(scope="module")
def case():
    instance = _instance()
    steps = step_counts(instance_batches(instance))
    spans = windows(steps.shape[0], instance.policy.window_batches)
    return instance, steps, spans


def test_a_peer_scores_the_same_in_compare_in_the_suites_and_directly(case):
    instance, steps, spans = case
    result = compare(instance, steps, CompareSettings(peers=("eplb",), bound_windows=1))
    rows = {(r["peer"], r["routing"]): r for r in result["rows"]}
    direct = replay(Rolling(instance, "eplb"), steps, spans, instance.policy.history_windows)
    suite_runs = _common.dropin_runs(instance, steps, _common.dropin_planners(instance, steps))
    suite = suite_runs["EPLB"]
    port = suite_runs[_common.PORT]  # the port called directly: the same plans, its own time
    assert [p.resident.tolist() for p in port.placements] == [p.resident.tolist() for p in suite.placements]
    assert [p.resident.tolist() for p in direct.placements] == [p.resident.tolist() for p in suite.placements]
    for routing in ("even", "lp", "flow"):
        from_compare = _untimed(rows["eplb", routing])
        timing = instance.layer_time
        for run in (direct, suite):
            assert from_compare == _untimed(
                row_of("eplb", routing, run.served(steps, routing, timing), run, timing)
            )
        assert from_compare["p95"] == _common.p95(suite, steps, routing)


@pytest.mark.parametrize("dispatch", ["even", "lp"])
def test_the_drop_in_scores_the_same_in_the_frontier_and_the_suites(case, dispatch):
    instance, steps, spans = case
    history = instance.policy.history_windows
    layout = EplbLayout.of(instance, steps, "the test")
    point = dropin_point(layout, steps, spans, history, 0.002, dispatch)
    options = (("move_cost", 0.002), ("moves", DROPIN_MOVES))
    suite = _common.dropin_runs(instance, steps, {"ours": DropIn(layout, dispatch, options)})["ours"]
    direct = replay(DropIn(layout, dispatch, options), steps, spans, history)
    for run in (suite, direct):
        assert point.p95 == _common.p95(run, steps, dispatch)
        assert point.copies == run.copies_per_replan()
    assert np.array_equal(suite.served(steps, dispatch).peak, direct.served(steps, dispatch).peak)
