"""User-facing errors.

Anything a user can cause (a malformed file, an out-of-range value, an
infeasible capacity) raises a `ComoeError`. The CLI prints its message on one
line and exits with status 2; a traceback means a bug in comoe-opt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def first_line(exc: BaseException) -> str:
    """A library's exception message as part of a one-line error: its first non-empty line
    (pyarrow's and numpy's span several, with schema dumps), at most 300 characters."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return (lines[0] if lines else type(exc).__name__)[:300]


class ComoeError(Exception):
    """An error caused by the user's input, reported without a traceback.

    It pickles (a worker process hands it to the parent) without calling `__init__` again:
    a subclass's constructor arguments need not be its `args`.
    """

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))


def _rebuild(cls: type[ComoeError], args: tuple[Any, ...], state: dict[str, Any]) -> ComoeError:
    """A pickled `ComoeError` again: the same class, message (`args`) and attributes."""
    exc = cls.__new__(cls, *args)
    exc.args = args
    exc.__dict__.update(state)
    return exc


class InputError(ComoeError):
    """A file or value is malformed: names the file, the field and the problem."""

    def __init__(self, source: str | Path | None, field: str | None, problem: str):
        self.source = None if source is None else str(source)
        self.field = field
        self.problem = problem
        parts = [p for p in (self.source, field) if p]
        super().__init__(": ".join([*parts, problem]))
