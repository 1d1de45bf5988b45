"""Rolling horizon: the slow loop window after window (PyPSA-style).

Window w is planned from the statistics of window w−1 (what the runtime has
seen), starting from the placement that served window w−1, and then serves
window w. The first window is planned on itself (a profiling window). A page
copied in window w is leased until window w + `lease_windows`: it cannot be
evicted before, which keeps the plan from thrashing (hysteresis), together
with the copy cost in the objective.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from comoe_opt.instance import Instance
from comoe_opt.residency.demand import window_demand
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.problem import TERMS, residency_problem
from comoe_opt.residency.solve import solve
from comoe_opt.results import SolveResult
from comoe_opt.trace.batching import MicroBatches, history_span, windows

NO_LEASE = frozenset({"eplb"})


@dataclass(frozen=True)
class WindowPlan:
    window: int
    start: int  # first micro-batch served by this plan
    stop: int
    planned_on: tuple[int, int]  # micro-batches whose statistics the plan used
    result: SolveResult[Placement]
    pages_moved: int


def rolling_horizon(
    instance: Instance,
    batches: MicroBatches,
    method: str = "milp",
    *,
    terms: frozenset[str] = TERMS,
    time_limit_s: float | None = None,
) -> Iterator[WindowPlan]:
    """Plan every window in turn; yields one `WindowPlan` per window."""
    policy = instance.policy
    spans = windows(batches.batches, policy.window_batches)
    previous: Placement | None = None
    lease_until: np.ndarray | None = None
    for w, (start, stop) in enumerate(spans):
        history = history_span(spans, w, policy.history_windows)
        demand = window_demand(batches.window(*history), policy)
        # EPLB re-plans from scratch each time, as published: no leases
        leased = None if lease_until is None or method in NO_LEASE else lease_until > w
        problem = residency_problem(
            instance, demand, previous, leased=leased, terms=terms, batches=stop - start
        )
        result = solve(
            problem,
            method,
            time_limit_s=time_limit_s or policy.time_limit_s,
            mip_gap=policy.mip_gap,
        )
        placement = result.solution
        moved = placement.pages_moved_from(previous)
        new = placement.resident if previous is None else placement.resident & ~previous.resident
        if lease_until is None:
            lease_until = np.zeros(placement.resident.shape, dtype=np.int64)
        lease_until = np.where(
            new, w + 1 + policy.lease_windows, np.where(placement.resident, lease_until, 0)
        )
        yield WindowPlan(w, start, stop, history, result, moved)
        previous = placement
