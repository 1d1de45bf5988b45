"""One result type for every method: exact solvers and heuristics alike.

`Status` is the single status vocabulary; each solver module maps its solver's
own statuses onto it explicitly (no string matching at the call sites).
A time-limited solve comes back as `TIME_LIMIT` with its incumbent and bound,
never as `OPTIMAL`.

A result's `report` is typed per method family (residency/report.py for the
slow loop, mapping/report.py for the fast loop); every report has `to_dict()`,
its JSON. `Timing`, what a deadline measured, is the piece they share.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Generic, Protocol, TypeVar


class SolveReport(Protocol):
    """What a method reports beside its objective and bound; `to_dict()` is its JSON."""

    def to_dict(self) -> dict[str, Any]: ...


S = TypeVar("S")  # the solution: a placement, a token mapping
R = TypeVar("R", bound=SolveReport)  # the method family's report


class Status(StrEnum):
    OPTIMAL = "optimal"  # proven within the requested gap
    TIME_LIMIT = "time_limit"  # stopped by the time limit; incumbent and bound returned
    FEASIBLE = "feasible"  # a solution without a proof (heuristics, node/iteration limits)
    NO_SOLUTION = "no_solution"  # the method found no feasible solution (the problem may have one)
    INFEASIBLE = "infeasible"
    UNBOUNDED = "unbounded"
    ERROR = "error"

    @property
    def has_solution(self) -> bool:
        return self in (Status.OPTIMAL, Status.TIME_LIMIT, Status.FEASIBLE)


BOUND_TOLERANCE = 1e-6  # relative: solver round-off a bound may show above the objective


class BoundError(RuntimeError):
    """A proven bound above a feasible objective: a bug in a model or a cut, never a result."""


def relative_gap(objective: float, bound: float, constant: float = 0.0) -> float:
    """(objective − bound) / |objective − constant|, signed, for minimisation.

    `constant` is the part of the objective no solution can change; the gap
    is measured on the rest (with 0, HiGHS's definition). A negative gap
    means the bound exceeds the objective.
    """
    if not (math.isfinite(objective) and math.isfinite(bound)):
        return math.inf
    return (objective - bound) / max(abs(objective - constant), 1e-9)


def status_from_gap(
    solver: Status, objective: float, bound: float, mip_gap: float, constant: float
) -> Status:
    """A solve's status from its objective and bound: `optimal` within `mip_gap` (solver round-off
    allowed), else the solver's time limit or `feasible`; a solver's failure as it is."""
    if solver in (Status.INFEASIBLE, Status.UNBOUNDED, Status.ERROR):
        return solver
    if relative_gap(objective, bound, constant) <= mip_gap + BOUND_TOLERANCE:
        return Status.OPTIMAL
    return Status.TIME_LIMIT if solver == Status.TIME_LIMIT else Status.FEASIBLE


@dataclass(frozen=True)
class Timing:
    """What a solve's deadline measured (deadline.py): the limit (None: none), the whole solve's
    seconds, the seconds of each phase, and what the limit skipped or cut short."""

    time_limit_s: float | None
    total_s: float
    phases: Mapping[str, float]
    stopped_by_time_limit: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "time_limit_s": self.time_limit_s,
            "total_s": self.total_s,
            "phases": dict(self.phases),
            "stopped_by_time_limit": list(self.stopped_by_time_limit),
        }


@dataclass(frozen=True)
class NoReport:
    """The report of a result that has nothing to add (e.g. one built by hand)."""

    def to_dict(self) -> dict[str, Any]:
        return {}


@dataclass(frozen=True)
class SolveResult(Generic[S, R]):
    """Status, objective, bound, gap and wall time of one method on one instance.

    `bound` is a proven lower bound on the optimum (minimisation); methods that
    prove nothing report `-inf`, and `gap` is then `inf`. `constant` is the
    part of the objective that no solution can change (e.g. the least
    possible NoP); `gap` is measured on the rest. `solution` is the method's
    output (a placement, a token mapping); `report` holds the details of the
    method's family (residency/report.py, mapping/report.py: objective terms,
    bounds by source, timing), keyword-only: every method says what it reports.

    A bound above the objective (beyond round-off) raises `BoundError`: it
    would be a wrong proof.
    """

    method: str
    status: Status
    objective: float
    bound: float
    runtime_s: float
    solution: S | None = None
    constant: float = 0.0
    report: R = field(kw_only=True)

    def __post_init__(self) -> None:
        if not (self.status.has_solution and math.isfinite(self.objective) and math.isfinite(self.bound)):
            return
        if self.bound > self.objective + BOUND_TOLERANCE * max(1.0, abs(self.objective)):
            raise BoundError(
                f"{self.method}: bound {self.bound!r} above the objective {self.objective!r} "
                f"of a {self.status.value} solution"
            )

    @property
    def gap(self) -> float:
        """Signed relative gap on the part of the objective a solution can change."""
        return relative_gap(self.objective, self.bound, self.constant)

    def summary(self) -> str:
        gap = "-" if math.isinf(self.gap) else f"{100 * self.gap:.3f}%"
        bound = "-" if math.isinf(self.bound) else f"{self.bound:.6g}"
        return (
            f"{self.method:<12} {self.status.value:<10} objective {self.objective:.6g}  "
            f"bound {bound}  gap {gap}  time {self.runtime_s:.3f}s"
        )

    def to_dict(self) -> dict[str, Any]:
        def finite(x: float) -> float | None:
            return x if math.isfinite(x) else None

        return {
            "method": self.method,
            "status": self.status.value,
            "objective": finite(self.objective),
            "bound": finite(self.bound),
            "gap": finite(self.gap),
            "constant": self.constant,
            "runtime_s": self.runtime_s,
            "report": self.report.to_dict(),
        }
