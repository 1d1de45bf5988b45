"""Co-location rows on the class model: they see which experts share a chiplet and never lie.

Optima from test_decompose's brute force over every placement of 2-layer instances."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from studies.colocation import add_colocation
from test_decompose import optimum, scenario_problem, small_problems

from comoe_opt.highs import mip_work
from comoe_opt.residency.bounds.decompose import ClassModel, Prices, device_classes
from comoe_opt.residency.problem import ResidencyProblem

TOL = 1e-6


def priced_layers(p: ResidencyProblem, experts: int) -> float:
    """The Lagrangian at zero prices, each layer's class model with co-location rows, closed."""
    classes = device_classes(p)
    free = Prices(np.zeros(classes.count), 0.0, np.zeros(len(p.tenants)))
    total = p.constant_ms
    for layer in range(p.layers):
        model = ClassModel(p, classes, [layer], free)
        if experts:
            add_colocation(model, layer, experts)
        total += model.lp.solve(mip_gap=0.0, options=mip_work(100_000)).bound
    return total


def test_pairs_of_single_replica_experts_must_share():
    # three experts, one replica each, two chiplets: some pair shares one. Each scenario makes
    # another pair busy; the class model sees each alone (4), the pairs see the sharing: 16 / 3
    work = [[[4, 4, 0]], [[4, 0, 4]], [[0, 4, 4]]]
    p = scenario_problem(work, [2, 2], tokens=[[1, 1, 1]], nop=[0, 0], all_resident=True, max_replicas=1)
    assert optimum(p) == pytest.approx(16 / 3)
    assert priced_layers(p, 0) == pytest.approx(4.0)
    assert priced_layers(p, 3) == pytest.approx(16 / 3)


def test_a_second_replica_lets_the_pair_apart():
    # the same with two replicas allowed and room for them: nothing must share, the optimum is 4
    work = [[[4, 4, 0]], [[4, 0, 4]], [[0, 4, 4]]]
    p = scenario_problem(work, [3, 3], tokens=[[1, 1, 1]], nop=[0, 0], all_resident=True)
    assert priced_layers(p, 3) == pytest.approx(optimum(p))


@settings(max_examples=25, deadline=None)
@given(small_problems())
def test_colocation_rows_never_cut_off_a_placement(p):
    best = optimum(p)
    assume(np.isfinite(best))
    plain, paired = priced_layers(p, 0), priced_layers(p, p.experts)
    assert plain - TOL * max(1.0, abs(best)) <= paired <= best + TOL * max(1.0, abs(best))
