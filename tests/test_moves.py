"""The layer searches' move rules (residency/search/moves.py) against the problem's own
feasibility check: a well-formed move is allowed exactly when its result is feasible."""

from __future__ import annotations

import numpy as np
from hypothesis import assume, given
from test_scenarios import scenario_problems

from comoe_opt.best_split.cut_condition import int_masks
from comoe_opt.residency.objective import check_feasible
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.search.moves import MoveRules


def _moved(start: np.ndarray, changes: list[tuple[int, int, bool]]) -> Placement:
    resident = start.copy()
    for e, c, held in changes:
        resident[0, e, c] = held
    return Placement(resident)


@given(scenario_problems())
def test_a_move_is_allowed_exactly_when_its_result_is_feasible(p):
    start = p.previous.resident
    assume(not check_feasible(p, p.previous))
    rules = MoveRules.of(p, 0)
    masks = int_masks(start[0])
    room = np.array([t.max_pages - int(start[t.owns].sum()) for t in p.tenants], dtype=np.int64)
    replicas = list(zip(*np.nonzero(start[0]), strict=True))
    for a, c in replicas:
        for b, d in replicas:  # swap a's replica on c with b's on d
            if a == b or c == d or start[0, a, d] or start[0, b, c]:
                continue
            result = _moved(start, [(a, c, False), (a, d, True), (b, d, False), (b, c, True)])
            allowed = rules.swap_allowed(int(a), masks[a], int(c), int(b), masks[b], int(d))
            assert allowed == (not check_feasible(p, result))
        for b in range(p.experts):  # a's replica on c becomes one of b
            if b == a or start[0, b, c]:
                continue
            result = _moved(start, [(a, c, False), (b, c, True)])
            allowed = rules.replace_allowed(int(a), masks[a], int(c), b, masks[b], room)
            assert allowed == (not check_feasible(p, result))
