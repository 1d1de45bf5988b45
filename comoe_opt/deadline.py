"""One deadline for a whole solve: every phase gets the time that remains.

A time limit is a promise about the whole solve, not about one solver call:
the warm start, model builds, HiGHS, the local search and the cut rounds all
draw on the same `Deadline`, which is passed down explicitly. It also keeps
the time each phase took and what it skipped or cut short, for the report (`timing`).

The clock is injectable (default `time.perf_counter`), so that tests can
drive a solve through its phases with a fake clock instead of waiting.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from comoe_opt.results import Timing

Clock = Callable[[], float]


class Deadline:
    """`limit_s` seconds from construction on `clock`; phases' times and the deadline's notes."""

    def __init__(self, limit_s: float, clock: Clock = time.perf_counter, *, _log: _Log | None = None):
        self.limit_s = float(limit_s)
        self.clock = clock
        self.start = clock()
        self._log = _log if _log is not None else _Log()

    def elapsed(self) -> float:
        return self.clock() - self.start

    def remaining(self) -> float:
        """Seconds left, never negative."""
        return max(0.0, self.limit_s - self.elapsed())

    def expired(self) -> bool:
        return self.elapsed() >= self.limit_s

    def share(self, fraction: float) -> Deadline:
        """A deadline for one phase: `fraction` of what remains now, same clock and log."""
        return Deadline(self.remaining() * fraction, self.clock, _log=self._log)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Add the time the block takes to phase `name` (phases may run more than once)."""
        began = self.clock()
        try:
            yield
        finally:
            self._log.phases[name] = self._log.phases.get(name, 0.0) + self.clock() - began

    def note(self, text: str) -> None:
        """Record that the deadline skipped a phase or cut a loop short."""
        self._log.notes.append(text)

    def skip(self, phase: str) -> None:
        self.note(f"{phase}: skipped, the time limit had passed")

    @property
    def phases(self) -> dict[str, float]:
        return dict(self._log.phases)

    @property
    def notes(self) -> list[str]:
        return list(self._log.notes)

    @property
    def touched(self) -> bool:
        """Whether the deadline skipped or cut short anything."""
        return bool(self._log.notes)

    def timing(self) -> Timing:
        """What every solve reports: the limit, the time so far, phase times, what the limit stopped."""
        return Timing(
            time_limit_s=self.limit_s if math.isfinite(self.limit_s) else None,  # JSON has no inf
            total_s=self.elapsed(),
            phases=self.phases,
            stopped_by_time_limit=tuple(self._log.notes),
        )


class _Log:
    """Phase times and notes, shared by a deadline and the shares taken from it."""

    def __init__(self) -> None:
        self.phases: dict[str, float] = {}
        self.notes: list[str] = []
