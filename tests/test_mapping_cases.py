"""Fast loop on tiny hand-checked cases: known optimal makespans, costs from an instance."""

from __future__ import annotations

import numpy as np
import pytest

from comoe_opt.errors import InputError
from comoe_opt.instance import instance_from_table
from comoe_opt.mapping import (
    HEURISTICS,
    NEVER,
    LayerCosts,
    MappingProblem,
    layer_costs,
    least_loaded,
    makespan_ticks,
    power_of_two,
    solve_exact,
    solve_min_cost_flow,
    solve_min_cost_flow_per_token,
)
from comoe_opt.mapping.milp import solve_exact_milp
from comoe_opt.results import Status


def costs(ready, start, tau=10, finish=0) -> LayerCosts:
    ready = np.array(ready, dtype=np.int64)
    chiplets = ready.shape[1]
    vec = lambda v: np.broadcast_to(np.asarray(v, dtype=np.int64), (chiplets,)).copy()  # noqa: E731
    return LayerCosts(ready, vec(start), vec(tau), vec(finish), ready == 0)


def problem(ready, start, experts, tau=10, finish=0) -> MappingProblem:
    return MappingProblem(np.array(experts, dtype=np.int64), costs(ready, start, tau, finish))


def optimum(p: MappingProblem) -> int:
    return solve_exact(p).report.makespan_ticks


EXACT = [solve_min_cost_flow, solve_min_cost_flow_per_token, solve_exact, solve_exact_milp]


@pytest.mark.parametrize("method", EXACT)
def test_one_expert_two_replicas_splits_evenly(method):
    p = problem([[0, 0]], 0, [[0]] * 4)  # 4 tokens, 10 ticks each, two replicas
    result = method(p)
    assert result.status is Status.OPTIMAL
    assert result.report.makespan_ticks == 20
    assert result.objective == pytest.approx(20e-9)
    assert np.bincount(result.solution.ravel(), minlength=2).tolist() == [2, 2]


@pytest.mark.parametrize("method", EXACT)
def test_backlog_shifts_tokens_to_the_idle_chiplet(method):
    # chiplet 0 is busy until 30: 1 token there (40), 4 on chiplet 1 (40)
    p = problem([[0, 0]], [30, 0], [[0]] * 5)
    assert method(p).report.makespan_ticks == 40


@pytest.mark.parametrize("method", EXACT)
def test_page_in_flight_waits_in_whole_slots(method):
    # expert 1's page lands on chiplet 1 at 25: its tokens take slots 3 and 4 -> done at 50
    p = problem([[0, NEVER], [NEVER, 25]], 0, [[0], [0], [0], [1], [1]])
    assert method(p).report.makespan_ticks == 50


@pytest.mark.parametrize("method", EXACT)
def test_start_and_return_latency_count(method):
    # dispatch 5 before the first slot, result back 3 after the last: 5 + 2 * 10 + 3
    p = problem([[0, 0]], 5, [[0]] * 4, finish=3)
    assert method(p).report.makespan_ticks == 28


@pytest.mark.parametrize("method", EXACT)
def test_ready_tokens_run_while_a_page_arrives(method):
    # chiplet 0 only: two ready tokens (slots 0, 1), one whose page lands at 50 (slot 5 -> 60)
    p = problem([[0], [50]], 0, [[0], [0], [1]])
    assert method(p).report.makespan_ticks == 60


@pytest.mark.parametrize("method", EXACT)
def test_late_page_beats_a_long_queue(method):
    # chiplet 1 serves all 6 tokens by 60; chiplet 0 (start 4) gets expert 1 or 3 only
    # once the page lands at 35 (slot 4): one token there finishes at 54, five on chiplet 1 at 50
    p = problem([[0, NEVER], [35, 0], [NEVER, 0], [35, 0]], [4, 0], [[2], [1], [2], [3], [2], [3]])
    assert method(p).report.makespan_ticks == 54


def test_flow_widens_its_window_when_the_bound_is_loose():
    p = problem([[0, NEVER], [35, 0], [NEVER, 0], [35, 0]], [4, 0], [[2], [1], [2], [3], [2], [3]])
    result = solve_min_cost_flow(p)
    assert result.report.lower_bound_ticks == 30  # far below 54: the first window misses
    assert result.report.rounds == 2
    assert result.report.makespan_ticks == 54


def test_greedy_is_fooled_where_the_flow_is_not():
    # expert 0 on chiplets {0, 1}, expert 1 only on chiplet 0; tokens 0, 0, 1, 1
    p = problem([[0, 0], [0, NEVER]], 0, [[0], [0], [1], [1]])
    assert optimum(p) == 20
    assert solve_min_cost_flow(p).report.makespan_ticks == 20
    assert least_loaded(p).report.makespan_ticks == 30


def test_top_k_choices_are_kept_and_served_by_their_replicas():
    ready = [[0, NEVER, NEVER], [NEVER, 0, 0], [0, 0, 0]]
    experts = [[0, 1], [1, 2], [2, 0], [1, 0]]
    p = problem(ready, 0, experts)
    for method in [solve_min_cost_flow, solve_exact, *HEURISTICS.values()]:
        assignment = method(p).solution
        assert assignment.shape == (4, 2)
        expert_of = np.array(experts)
        assert (np.array(ready)[expert_of, assignment] != NEVER).all(), method
        assert makespan_ticks(p.costs, p.experts, assignment) >= optimum(p)


def test_expert_nobody_can_serve_is_infeasible():
    p = problem([[0, 0], [NEVER, NEVER]], 0, [[0], [1]])
    for method in [solve_min_cost_flow, solve_exact, *HEURISTICS.values()]:
        assert method(p).status is Status.INFEASIBLE


def test_layer_costs_from_an_instance(table):
    instance = instance_from_table(table, "small.toml")
    resident = np.zeros((8, 4), dtype=bool)
    resident[0, [0, 1]] = True
    arrival = np.full((8, 4), np.inf)
    arrival[1, 2] = 1e-6  # a prefetch of expert 1 lands on chiplet 2 after 1 us
    c = layer_costs(instance, resident, backlog_s=np.array([0, 0, 0, 2e-6]), arrival_s=arrival)
    load = 20_000_000  # 1 GB over 50 GB/s = 20 ms
    assert c.token_time.tolist() == [100_000] * 4  # 2 FLOP x 0.5 G weights at 10 TFLOP/s = 100 us
    assert c.finish.tolist() == [20, 20, 40, 40]  # hops x 20 ns
    assert c.start.tolist() == [20, 20, 40, 2040]
    assert c.ready[0].tolist() == [0, 0, NEVER, NEVER]  # resident: replicas only
    assert c.ready[1].tolist() == [load, load, 1000, load]  # no replica: any chiplet, or the arriving page
    assert c.ready[2].tolist() == [load] * 4
    assert c.slots[1].tolist() == [200, 200, 1, 200]  # waits round up to whole 100 us slots


def test_problem_validation():
    c = costs([[0, 0]], 0)
    with pytest.raises(InputError, match=r"ids must be in 0\.\.0"):
        MappingProblem(np.array([[1]]), c)
    with pytest.raises(InputError, match="integer"):
        MappingProblem(np.array([[0.0]]), c)
    with pytest.raises(InputError, match="token_time"):
        LayerCosts(
            np.zeros((1, 2), np.int64),
            np.zeros(2, np.int64),
            np.zeros(2, np.int64),
            np.zeros(2, np.int64),
            np.ones((1, 2), bool),
        )


def test_power_of_two_is_seeded():
    p = problem([[0, 0, 0, 0]], 0, [[0]] * 40)
    first = power_of_two(p, seed=3).solution
    assert np.array_equal(first, power_of_two(p, seed=3).solution)
    assert not np.array_equal(first, power_of_two(p, seed=4).solution)
