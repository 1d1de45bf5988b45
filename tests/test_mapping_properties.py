"""Property tests of the fast loop on random small problems.

Every method is checked against a brute-force optimum computed by simulating
each chiplet's queue for every possible mapping, which shares no code with
the library; the min-cost flow's cost is checked against the LP optimum of
the same network (scipy's HiGHS).
"""

from __future__ import annotations

import itertools

import numpy as np
import scipy.optimize
import scipy.sparse
from hypothesis import given
from hypothesis import strategies as st

from comoe_opt.mapping import (
    HEURISTICS,
    NEVER,
    LayerCosts,
    MappingProblem,
    makespan_ticks,
    pair_counts,
    solve_exact,
    solve_min_cost_flow,
    solve_min_cost_flow_per_token,
)
from comoe_opt.mapping.flow import build_network, solve_network
from comoe_opt.mapping.milp import lp_bound, solve_exact_milp
from comoe_opt.mapping.network import costs_graph, lower_bound
from comoe_opt.results import Status


@st.composite
def problems(draw: st.DrawFn, max_selections: int = 12) -> MappingProblem:
    experts = draw(st.integers(2, 5))
    chiplets = draw(st.integers(1, 4))
    tau = draw(st.lists(st.integers(1, 6), min_size=chiplets, max_size=chiplets))
    start = draw(st.lists(st.integers(0, 12), min_size=chiplets, max_size=chiplets))
    finish = draw(st.lists(st.integers(0, 4), min_size=chiplets, max_size=chiplets))
    cell = st.one_of(st.just(NEVER), st.just(0), st.integers(0, 25))
    ready = np.array(
        draw(
            st.lists(st.lists(cell, min_size=chiplets, max_size=chiplets), min_size=experts, max_size=experts)
        )
    )
    for e in range(experts):  # every expert has somewhere to go
        if (ready[e] == NEVER).all():
            ready[e, draw(st.integers(0, chiplets - 1))] = draw(st.integers(0, 25))
    k = draw(st.integers(1, min(3, experts)))
    tokens = draw(st.integers(1, max(1, max_selections // k)))
    rows = [draw(st.permutations(range(experts)))[:k] for _ in range(tokens)]
    costs = LayerCosts(
        ready.astype(np.int64), *(np.array(v, np.int64) for v in (start, tau, finish)), ready == 0
    )
    return MappingProblem(np.array(rows, dtype=np.int64), costs)


def simulate(p: MappingProblem, assignment: np.ndarray) -> int:
    """Makespan by running each chiplet's queue, earliest-ready token first."""
    c = p.costs
    end = 0
    for chiplet in range(c.chiplets):
        ready = sorted(int(c.ready[e, chiplet]) for e in p.experts[assignment == chiplet])
        if not ready:
            continue
        t, tau = int(c.start[chiplet]), int(c.token_time[chiplet])
        for r in ready:
            wait = max(0, r - int(c.start[chiplet]))
            first_slot = -(-wait // tau)
            t = max(t, int(c.start[chiplet]) + first_slot * tau) + tau
        end = max(end, t + int(c.finish[chiplet]))
    return end


def brute_force(p: MappingProblem) -> int:
    flat = p.experts.ravel()
    options = [np.flatnonzero(p.costs.ready[e] != NEVER).tolist() for e in flat]
    best = None
    for choice in itertools.product(*options):
        span = simulate(p, np.array(choice).reshape(p.experts.shape))
        best = span if best is None else min(best, span)
    return best


def assert_valid(p: MappingProblem, assignment: np.ndarray) -> None:
    assert assignment.shape == p.experts.shape
    assert (p.costs.ready[p.experts, assignment] != NEVER).all()  # a chiplet that serves that expert
    counts = pair_counts(p.costs, p.experts, assignment)
    assert counts.sum(axis=1).tolist() == np.bincount(p.experts.ravel(), minlength=p.costs.experts).tolist()


@given(problems(max_selections=7))
def test_flow_and_exact_match_brute_force(p):
    optimum = brute_force(p)
    for method in (solve_min_cost_flow, solve_min_cost_flow_per_token, solve_exact):
        result = method(p)
        assert result.status is Status.OPTIMAL
        assert_valid(p, result.solution)
        assert result.report.makespan_ticks == optimum
        assert simulate(p, result.solution) == optimum  # the library's makespan is the simulated one
        assert makespan_ticks(p.costs, p.experts, result.solution) == optimum


@given(problems())
def test_heuristics_valid_and_never_below_the_optimum(p):
    optimum = solve_exact(p).report.makespan_ticks
    graph = costs_graph(p.costs)
    assert (
        lower_bound(graph, np.bincount(graph.group_of[p.experts.ravel()], minlength=graph.groups)) <= optimum
    )
    for name, method in HEURISTICS.items():
        result = method(p)
        assert result.status is Status.FEASIBLE, name
        assert_valid(p, result.solution)
        assert result.report.makespan_ticks == simulate(p, result.solution) >= optimum


@given(problems())
def test_flow_makespan_equals_the_exact_optimum(p):
    assert solve_min_cost_flow(p).report.makespan_ticks == solve_exact(p).report.makespan_ticks


@given(problems(max_selections=8))
def test_milp_agrees_and_its_lp_bound_is_a_bound(p):
    optimum = solve_exact(p).report.makespan_ticks
    milp = solve_exact_milp(p)
    assert milp.status is Status.OPTIMAL
    assert_valid(p, milp.solution)
    assert milp.report.makespan_ticks == optimum
    assert lp_bound(p) <= optimum + 1e-6


@given(problems(), st.integers(0, 3))
def test_flow_respects_capacities_and_matches_its_lp(p, extra_window):
    graph = costs_graph(p.costs)
    demand = np.bincount(graph.group_of[p.experts.ravel()], minlength=graph.groups)
    lower = lower_bound(graph, demand)
    net = build_network(graph, demand, lower, graph.window * (1 + extra_window))
    status, flows, cost = solve_network(net)
    assert status is Status.OPTIMAL
    arcs = net.arcs
    assert ((flows >= 0) & (flows <= arcs.capacities)).all()
    nodes = net.supplies.size
    balance = np.bincount(arcs.tails, flows, nodes) - np.bincount(arcs.heads, flows, nodes)
    assert balance.tolist() == net.supplies.tolist()
    assert cost == int((flows * arcs.unit_costs).sum())
    n_arcs = arcs.tails.size
    index = np.arange(n_arcs)
    incidence = scipy.sparse.coo_matrix(
        (np.r_[np.ones(n_arcs), -np.ones(n_arcs)], (np.r_[arcs.tails, arcs.heads], np.r_[index, index])),
        shape=(nodes, n_arcs),
    )
    bounds = np.column_stack((np.zeros(n_arcs), arcs.capacities))
    lp = scipy.optimize.linprog(
        arcs.unit_costs, A_eq=incidence, b_eq=net.supplies, bounds=bounds, method="highs"
    )
    assert lp.status == 0
    assert abs(lp.fun - cost) < 1e-6


@given(
    st.integers(0, 2**32 - 1),
    st.integers(1, 30),
    st.integers(1, 8),
    st.sampled_from([np.int8, np.int64]),
    st.integers(1, 3000),
)
def test_unique_rows_and_member_starts_match_numpy(seed, rows, columns, dtype, chunk):
    """The skeleton's lexsort `unique_rows` is `np.unique(axis=0, return_inverse=True)` (with the
    NEVER = -1 of first slots); the chunked member minimum is the per-row minimum, any chunk size."""
    import comoe_opt.mapping.network as network

    rng = np.random.default_rng(seed)
    matrix = rng.integers(NEVER, 3, size=(rows, columns)).astype(dtype)
    expected, inverse = np.unique(matrix, axis=0, return_inverse=True)
    got, got_inverse = network.unique_rows(matrix)
    assert got.dtype == expected.dtype
    assert np.array_equal(got, expected) and np.array_equal(got_inverse, inverse.ravel())
    earliest = np.where(rng.random((rows, columns)) < 0.3, np.inf, rng.integers(0, 50, (rows, columns)))
    members = (rng.random((rng.integers(1, 2 * rows + 1), rows)) < 0.4).astype(np.int8)
    members[:, rng.integers(rows)] = 1  # every row has a member
    direct = np.array([earliest[row > 0].min(axis=0) for row in members])
    original = network.MEMBER_CHUNK
    try:
        network.MEMBER_CHUNK = chunk
        assert np.array_equal(network._member_min(members, earliest), direct)
    finally:
        network.MEMBER_CHUNK = original
