"""Rolling horizon: the slow loop window after window (PyPSA-style).

Window w is planned from the statistics of the `history_windows` before it
(what the runtime has seen), starting from the placement that served window
w−1, and then serves window w. The first window is planned on itself (a
profiling window). A page copied in window w is leased until window
w + 1 + `lease_windows`: it cannot be evicted before, which keeps the plan
from thrashing (hysteresis), together with the copy cost in the objective.
With `policy.migration_weight = -1` that copy price is chosen window by window
by a backtest on windows already served (planning/backtest.py).

The history is a trace's micro-batches (`evaluate`, `solve`) or per-step
selection counts [steps, layers, experts] (`compare`): the same loop plans both.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from comoe_opt.errors import ComoeError
from comoe_opt.instance import Instance
from comoe_opt.planning.backtest import PRIOR, WeightBacktest, WeightChoice
from comoe_opt.planning.balance_backtest import AUTO, BalanceBacktest, BalanceChoice, mode_instances
from comoe_opt.planning.window import Plan, plan_window, steps_demand
from comoe_opt.residency.heuristics import HEURISTICS
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.problem import TERMS
from comoe_opt.residency.report import ResidencyResult
from comoe_opt.stats.demand import WindowDemand
from comoe_opt.trace.batching import MicroBatches, history_span, step_counts, windows


@dataclass(frozen=True, eq=False)
class WindowPlan:
    window: int
    start: int  # first micro-batch served by this plan
    stop: int
    planned_on: tuple[int, int]  # micro-batches whose statistics the plan used
    plan: Plan
    pages_moved: int
    weight: WeightChoice  # the migration weight it was planned with, and what chose it
    balance: BalanceChoice  # what it balanced (policy.balance), and what chose it

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


class History:
    """What a window is planned on and scored on: micro-batches or per-step counts [T, L, E]."""

    def __init__(self, instance: Instance, source: MicroBatches | np.ndarray):
        self.instance = instance
        self.source = source

    @property
    def steps(self) -> int:
        return self.source.batches if isinstance(self.source, MicroBatches) else int(self.source.shape[0])

    def planning(self, start: int, stop: int) -> MicroBatches | WindowDemand:
        if isinstance(self.source, MicroBatches):
            return self.source.window(start, stop)
        return steps_demand(self.instance, self.source[start:stop])

    def counts(self, start: int, stop: int) -> np.ndarray:
        """[n, L, E] selections of each step."""
        if isinstance(self.source, MicroBatches):
            return step_counts(self.source.window(start, stop))
        return np.asarray(self.source[start:stop])


def rolling_horizon(
    instance: Instance,
    batches: MicroBatches | np.ndarray,
    method: str = "milp",
    *,
    terms: frozenset[str] = TERMS,
    time_limit_s: float | None = None,
    foresight: bool = False,
) -> Iterator[WindowPlan]:
    """Plan every window in turn, lazily: one `WindowPlan` per window of `policy.window_batches`.
    `batches`: micro-batches, or per-step selection counts [steps, layers, experts].

    With `foresight` each window is planned on itself (an oracle's limit, not a policy)."""
    policy = instance.policy
    history = History(instance, batches)
    spans = windows(history.steps, policy.window_batches)
    leases = Leases(policy.lease_windows)
    leased_at: list[np.ndarray | None] = []
    served: list[Placement] = []
    planned_with: list[float] = []
    # a method that re-plans from scratch (EPLB, the engines' balancers) prices no copy: no backtest
    auto = policy.migration_weight < 0
    modes = mode_instances(instance)  # policy.balance = "auto": both modes, chosen by a backtest
    chooser = BalanceBacktest(instance, history.counts) if policy.balance == AUTO else None
    mode = chooser.current if chooser is not None else policy.balance
    scorer = modes[mode]  # the weight backtest scores in the first mode's units throughout
    backtest = WeightBacktest(scorer, terms, history.counts) if auto and keeps_leases(method) else None
    fixed = PRIOR if auto else policy.migration_weight

    def span_of(w: int) -> tuple[int, int]:
        return spans[w] if foresight else history_span(spans, w, policy.history_windows)

    def plan(w: int, weight: float, limit_s: float | None = time_limit_s, balance: str | None = None) -> Plan:
        return plan_window(
            modes[balance or mode],
            history.planning(*span_of(w)),
            served[w - 1] if w else None,
            leased_at[w],
            method=method,
            terms=terms,
            batches=spans[w][1] - spans[w][0],
            time_limit_s=limit_s,
            migration_weight=weight,
        )

    def replan(w: int, weight: float) -> Placement:
        """Window `w` planned again at `weight` (the backtest's, on work limits as evaluations)."""
        return _placement(plan(w, weight, reproducible_limit(method)), w, method)

    def replan_balancing(w: int, balance: str) -> Placement:
        """Window `w` planned again balancing `balance`, at its own weight, on work limits."""
        return _placement(plan(w, planned_with[w], reproducible_limit(method), balance), w, method)

    for w, (start, stop) in enumerate(spans):
        leased_at.append(leases.active(w) if keeps_leases(method) else None)
        if chooser is None:
            balanced = BalanceChoice(w, mode)
        else:
            balanced = chooser.mode_for(w, spans, served, replan_balancing)
            mode = balanced.mode
        if backtest is None:
            choice = WeightChoice(w, fixed, None)
        else:
            choice = backtest.weight_for(w, spans, served, planned_with, replan)
        window_plan = plan(w, choice.weight)
        placement = _placement(window_plan, w, method)
        previous = served[w - 1] if w else None
        moved = placement.pages_moved_from(previous)
        yield WindowPlan(w, start, stop, span_of(w), window_plan, moved, choice, balanced)
        leases.renew(w, placement, previous)
        served.append(placement)
        planned_with.append(choice.weight)


def _placement(plan: Plan, w: int, method: str) -> Placement:
    placement = plan.result.solution
    if placement is None:
        status = plan.result.status.value
        raise ComoeError(f"window {w}: {method} found no placement ({status}); try another method")
    return placement


def keeps_leases(method: str) -> bool:
    """Whether `method` plans around leased replicas (heuristics declare it; models always do)."""
    return method not in HEURISTICS or HEURISTICS[method].leases


def reproducible_limit(method: str) -> float:
    """The time limit an evaluation plans with: none (`math.inf`), so that the same instance gives
    the same numbers on any machine and under any load. Every phase of `milp` and `exact` then ends
    on a fixed amount of work sized to the instance (residency/schedule.py: the searches' moves,
    the annealing's proposals, HiGHS's nodes, the cut rounds), and so do the heuristics; with a
    wall-clock limit, a loaded machine cut the warm start short on some windows and skipped the
    replica model (formulations/residency.md, "Time limit")."""
    del method  # every method: the models end on work limits, the heuristics on their moves
    return math.inf
