"""User-facing errors.

Anything a user can cause (a malformed file, an out-of-range value, an
infeasible capacity) raises a `ComoeError`. The CLI prints its message on one
line and exits with status 2; a traceback means a bug in comoe-opt.
"""

from __future__ import annotations

from pathlib import Path


class ComoeError(Exception):
    """An error caused by the user's input, reported without a traceback."""


class InputError(ComoeError):
    """A file or value is malformed: names the file, the field and the problem."""

    def __init__(self, source: str | Path | None, field: str | None, problem: str):
        self.source = None if source is None else str(source)
        self.field = field
        self.problem = problem
        parts = [p for p in (self.source, field) if p]
        super().__init__(": ".join([*parts, problem]))
