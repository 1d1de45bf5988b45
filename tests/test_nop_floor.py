"""The least NoP any placement has (residency/bounds/nop_floor.py), the term the replica-count bound
adds: by hand, against a brute force over every placement, and the bound it raises kept below
every feasible objective."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from test_scenarios import brute_force, scenario_problem, scenario_problems

from comoe_opt.residency.bounds.nop_floor import nop_excess_bound
from comoe_opt.residency.objective import check_feasible, score
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.solve import solve


def test_the_near_chiplet_holds_the_busier_expert() -> None:
    # Two experts (3 and 1 tokens a batch, 2 batches), one page on the near chiplet (NoP 0) and one
    # on the far (NoP 0.5): the busier expert takes the near page, the other pays 2 x 1 x 0.5.
    p = scenario_problem(
        [[[1.0, 1.0]]], [1, 1], tokens=[[3, 1]], nop=[0.0, 0.5], all_resident=True, batches=2
    )
    assert nop_excess_bound(p) == pytest.approx(1.0)
    # with no expert bound to a page, none has to go far
    free = scenario_problem([[[1.0, 1.0]]], [1, 1], tokens=[[3, 1]], nop=[0.0, 0.5], batches=2)
    assert nop_excess_bound(free) == 0.0


def _least_nop(p) -> float:
    """Every feasible placement's least nearest-replica NoP above the constant (brute force)."""
    shape = (p.layers, p.experts, p.chiplets)
    least = np.inf
    for bits in itertools.product([False, True], repeat=int(np.prod(shape))):
        placement = Placement(np.array(bits).reshape(shape))
        if check_feasible(p, placement) or (p.all_resident and not placement.resident.any(axis=2).all()):
            continue
        least = min(least, score(p, placement).nop_ms - p.constant_ms)
    return least


@given(scenario_problems())
def test_no_placement_has_less_nop_and_the_raised_bound_stays_below_the_optimum(p) -> None:
    assert nop_excess_bound(p) <= _least_nop(p) + 1e-9
    optimum = brute_force(p)
    for method in ("milp", "exact"):
        assert solve(p, method).bound <= optimum + 1e-6 * max(1.0, abs(optimum))
