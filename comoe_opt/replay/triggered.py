"""Re-plan times for the replay: fixed intervals, as engines ship, or the re-plan trigger
(balancers/dropin/trigger.py) deciding step by step.

Both give `spans` for `replay` and a `Recent` planner that plans each span on the steps just
before it (the last `history` steps, or those since the trigger's change point), so the plans
that are scored are the one replay's, made the same way whatever chose when to make them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from comoe_opt.balancers.dropin.trigger import ReplanTrigger
from comoe_opt.replay.replay import Planner, Window, copies, windows_of
from comoe_opt.residency.placement import Placement


@dataclass
class Recent:
    """`planner` on the last `history` steps before each span (fewer where `lengths` says, by span)."""

    planner: Planner
    history: int
    lengths: dict[int, int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.planner.name

    def plan(self, steps: np.ndarray, window: Window, in_service: Placement | None) -> Placement:
        keep = self.lengths.get(window.index, self.history)
        if window.index > 0:
            window = replace(window, planned_on=window.planned_on[-keep:])
        return self.planner.plan(steps, window, in_service)


def interval_spans(steps: int, first: int, interval: int) -> list[tuple[int, int]]:
    """The warm-up span [0, first), then a re-plan every `interval` steps."""
    return [(0, first)] + [(s, min(s + interval, steps)) for s in range(first, steps, interval)]


def trigger_spans(
    planner: Recent, steps: np.ndarray, first: int, trigger: ReplanTrigger
) -> list[tuple[int, int]]:
    """The spans the trigger asks for over `steps` [n, L, E] after the warm-up span [0, first):
    as `replay` plans them (window 0 on itself, each later span at its start on the steps before
    it), a new span after each step where `trigger.observe` says so, planned on the steps since
    its change point (at least `min_history`, at most `planner.history`); `planner.lengths`
    records those lengths, by span, for the replay to plan alike."""
    n = steps.shape[0]
    spans = [(0, first), (first, n)]
    in_service = planner.plan(steps, windows_of(spans, 0, 1, "history")[0], None)
    in_service = _replan(planner, steps, spans, 1, in_service, trigger)
    for t in range(first, n - 1):
        if not trigger.observe(steps[t]):
            continue
        planner.lengths[len(spans) - 1] = min(planner.history, max(trigger.since, trigger.min_history))
        spans[-1:] = [(spans[-1][0], t + 1), (t + 1, n)]
        in_service = _replan(planner, steps, spans, len(spans) - 1, in_service, trigger)
    return spans


def _replan(
    planner: Recent,
    steps: np.ndarray,
    spans: list[tuple[int, int]],
    w: int,
    in_service: Placement,
    trigger: ReplanTrigger,
) -> Placement:
    """Span `w`'s plan, as `replay` makes it, and the trigger started on it."""
    window = windows_of(spans, w, 1, "history")[0]
    new = planner.plan(steps, window, in_service)
    trigger.start(_slot_map(new), copies(new, in_service))
    return new


def _slot_map(placement: Placement) -> np.ndarray:
    assert placement.slot_map is not None, "the trigger scores an engine's slot map"
    return placement.slot_map.reshape(placement.layers, -1)
