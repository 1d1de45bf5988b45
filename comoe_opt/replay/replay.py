"""One replay: plan each window on what the planner may see, serve the window with the plan.

`replay(planner, steps, spans, history_windows, foresight)`: window by window, the planner gets
the steps it may plan on and the plan in service (its own previous one), and its plan serves the
window's steps. What it may see (`foresight`):

* `history` — the `history_windows` windows before (an engine's view: the plan serves steps it
  has not seen);
* `hindsight` — the window's own steps (the limit: it fits the very noise it is scored on);
* `crossfit` — the window's even steps for its odd ones and back (the window's load known, not the
  steps scored: the room a prediction could have).

Window 0 is the warm-up: every planner plans it on itself (there is nothing before it), its plan
is in service when window 1 starts, and no row scores it or counts its copies. Copies are
(expert, device) pairs a plan holds that the plan in service did not (weights to transfer).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

from comoe_opt.costs import LayerTime
from comoe_opt.replay.serve import Served, serve
from comoe_opt.residency.placement import Placement
from comoe_opt.trace.batching import history_span

Foresight = Literal["history", "hindsight", "crossfit"]
FORESIGHTS: tuple[Foresight, ...] = ("history", "hindsight", "crossfit")


@dataclass(frozen=True)
class Window:
    """What one plan is made for: window `index`, planned on steps `planned_on`, scored on
    `served` (both step indices), and whether it is the plan kept in service (`kept`)."""

    index: int
    planned_on: np.ndarray
    served: np.ndarray
    foresight: Foresight
    kept: bool = True


class Planner(Protocol):
    """A balancer as the replay drives it: one plan per window."""

    @property
    def name(self) -> str:
        """The planner's row name."""
        ...

    def plan(self, steps: np.ndarray, window: Window, in_service: Placement | None) -> Placement:
        """The placement serving `window`, from `steps[window.planned_on]` ([n, L, E] counts) and
        the plan in service (its own previous plan; None before the first)."""
        ...


@dataclass
class Run:
    """A planner's plans over the steps: what served each window, its copies and planning time."""

    name: str
    foresight: Foresight
    placements: list[Placement] = field(default_factory=list)  # per window, the plan kept in service
    copies: list[int] = field(default_factory=list)  # per window from 1 on
    copies_into: list[int] = field(default_factory=list)  # per window from 1 on: most into one device
    plan_s: list[float] = field(default_factory=list)  # per window, the kept plan's
    parts: list[tuple[np.ndarray, Placement]] = field(default_factory=list)  # (scored steps, plan)

    def served(self, steps: np.ndarray, dispatch: str, timing: LayerTime | None = None) -> Served:
        """Every scored step served by its plan under `dispatch` (timed by `timing` when given),
        in step order."""
        if not self.parts:
            return Served.joined([])
        order = np.argsort(np.concatenate([s for s, _ in self.parts]), kind="stable")
        parts = [serve(p.slots(), steps[s], dispatch, timing) for s, p in self.parts]
        return Served.joined(parts).reordered(order)

    def copies_per_replan(self) -> float:
        return float(np.mean(self.copies)) if self.copies else 0.0

    def migration_ms(self, copy_ms: float) -> float:
        """A re-plan's stall, mean over re-plans: every device receives its copies at once over
        its own link, `copy_ms` each, so the device receiving the most sets it."""
        return float(np.mean(self.copies_into)) * copy_ms if self.copies_into else 0.0


def replay(
    planner: Planner,
    steps: np.ndarray,
    spans: list[tuple[int, int]],
    history_windows: int = 1,
    foresight: Foresight = "history",
    *,
    warmup: bool = True,
) -> Run:
    """`planner` window by window over `steps` [n, L, E] split into `spans`. With `warmup` (the
    default) window 0 is planned on itself and not scored; without, every window is scored (the
    oracle's one-step windows)."""
    run = Run(planner.name, foresight)
    in_service: Placement | None = None
    for w in range(len(spans)):
        kept: Placement | None = None
        for window in windows_of(spans, w, history_windows, foresight):
            began = time.perf_counter()
            if window.planned_on.size == 0 and in_service is not None:
                placement = in_service  # nothing to plan on: the plan in service serves
            else:
                placement = planner.plan(steps, window, in_service)
            if window.kept:
                kept = placement
                run.plan_s.append(time.perf_counter() - began)
            if w > 0 or not warmup:
                run.parts.append((window.served, placement))
        assert kept is not None
        if w > 0 and in_service is not None:
            run.copies.append(copies(kept, in_service))
            run.copies_into.append(kept.most_copied_into_one(in_service))
        run.placements.append(kept)
        in_service = kept
    return run


def windows_of(
    spans: list[tuple[int, int]], w: int, history_windows: int, foresight: Foresight
) -> list[Window]:
    """The plans of window `w`: (steps planned on, steps scored on), the first kept in service."""
    start, stop = spans[w]
    served = np.arange(start, stop)
    if w == 0 or foresight == "hindsight":
        return [Window(w, served, served, foresight)]
    if foresight == "crossfit":
        even, odd = served[::2], served[1::2]
        if not odd.size:  # a one-step window (a trace's tail): served by the plan in service
            return [Window(w, np.arange(0), even, foresight)]
        return [Window(w, even, odd, foresight), Window(w, odd, even, foresight, kept=False)]
    begin, end = history_span(spans, w, history_windows)
    return [Window(w, np.arange(begin, end), served, foresight)]


def copies(new: Placement, old: Placement) -> int:
    """(expert, device) pairs `new` holds that `old` did not: the weights a re-plan transfers."""
    return int((new.resident & ~old.resident).sum())


@dataclass(frozen=True)
class Static:
    """A planner that plans once (window 0, the warm-up) and keeps that plan: serving without
    re-balancing, what every re-plan is measured against."""

    inner: Planner

    @property
    def name(self) -> str:
        return "static"

    def plan(self, steps: np.ndarray, window: Window, in_service: Placement | None) -> Placement:
        return in_service if in_service is not None else self.inner.plan(steps, window, None)
