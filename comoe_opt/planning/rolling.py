"""Rolling horizon: the slow loop window after window (PyPSA-style).

Window w is planned from the statistics of the `history_windows` before it
(what the runtime has seen), starting from the placement that served window
w−1, and then serves window w. The first window is planned on itself (a
profiling window). A page copied in window w is leased until window
w + 1 + `lease_windows`: it cannot be evicted before, which keeps the plan
from thrashing (hysteresis), together with the copy cost in the objective.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from comoe_opt.errors import ComoeError
from comoe_opt.instance import Instance
from comoe_opt.planning.window import Plan, plan_window
from comoe_opt.residency.heuristics import HEURISTICS
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.problem import TERMS
from comoe_opt.residency.report import ResidencyResult
from comoe_opt.trace.batching import MicroBatches, history_span, windows


@dataclass(frozen=True, eq=False)
class WindowPlan:
    window: int
    start: int  # first micro-batch served by this plan
    stop: int
    planned_on: tuple[int, int]  # micro-batches whose statistics the plan used
    plan: Plan
    pages_moved: int

    @property
    def result(self) -> ResidencyResult:
        return self.plan.result

    @property
    def placement(self) -> Placement:
        placement = self.plan.result.solution
        assert placement is not None, "rolling_horizon yields only windows with a placement"
        return placement


class Leases:
    """Until which window each resident page is leased (it may not be evicted before)."""

    def __init__(self, lease_windows: int):
        self.lease_windows = lease_windows
        self.until: np.ndarray | None = None

    def active(self, window: int) -> np.ndarray | None:
        """Bool [L, E, C] of the replicas window `window` must keep (None before any plan)."""
        return None if self.until is None else self.until > window

    def renew(self, window: int, placement: Placement, previous: Placement | None) -> None:
        """Lease the pages `placement` copied in; drop the leases of pages it evicted."""
        new = placement.resident if previous is None else placement.resident & ~previous.resident
        until = np.zeros(placement.resident.shape, np.int64) if self.until is None else self.until
        kept = np.where(placement.resident, until, 0)
        self.until = np.where(new, window + 1 + self.lease_windows, kept)


def rolling_horizon(
    instance: Instance,
    batches: MicroBatches,
    method: str = "milp",
    *,
    terms: frozenset[str] = TERMS,
    time_limit_s: float | None = None,
    foresight: bool = False,
) -> Iterator[WindowPlan]:
    """Plan every window in turn, lazily: one `WindowPlan` per window of `policy.window_batches`.

    With `foresight` each window is planned on itself (an oracle's limit, not a policy)."""
    policy = instance.policy
    spans = windows(batches.batches, policy.window_batches)
    leases = Leases(policy.lease_windows)
    previous: Placement | None = None
    for w, (start, stop) in enumerate(spans):
        history = (start, stop) if foresight else history_span(spans, w, policy.history_windows)
        leased = leases.active(w) if keeps_leases(method) else None
        plan = plan_window(
            instance,
            batches.window(*history),
            previous,
            leased,
            method=method,
            terms=terms,
            batches=stop - start,
            time_limit_s=time_limit_s,
        )
        placement = plan.result.solution
        if placement is None:
            status = plan.result.status.value
            raise ComoeError(f"window {w}: {method} found no placement ({status}); try another method")
        yield WindowPlan(w, start, stop, history, plan, placement.pages_moved_from(previous))
        leases.renew(w, placement, previous)
        previous = placement


def keeps_leases(method: str) -> bool:
    """Whether `method` plans around leased replicas (heuristics declare it; models always do)."""
    return method not in HEURISTICS or HEURISTICS[method].leases


def reproducible_limit(method: str) -> float:
    """The time limit an evaluation plans with: none (`math.inf`), so that the same instance gives
    the same numbers on any machine and under any load. Every phase of `milp` and `exact` then ends
    on a fixed amount of work sized to the instance (residency/exact/schedule.py: the searches' moves,
    the annealing's proposals, HiGHS's nodes, the cut rounds), and so do the heuristics; with a
    wall-clock limit, a loaded machine cut the warm start short on some windows and skipped the
    replica model (formulations/residency.md, "Time limit")."""
    del method  # every method: the models end on work limits, the heuristics on their moves
    return math.inf
