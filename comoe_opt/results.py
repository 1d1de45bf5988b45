"""One result type for every method: exact solvers and heuristics alike.

`Status` is the single status vocabulary; each solver module maps its solver's
own statuses onto it explicitly (no string matching at the call sites).
A time-limited solve comes back as `TIME_LIMIT` with its incumbent and bound,
never as `OPTIMAL`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Generic, TypeVar

S = TypeVar("S")


class Status(StrEnum):
    OPTIMAL = "optimal"  # proven within the requested gap
    TIME_LIMIT = "time_limit"  # stopped by the time limit; incumbent and bound returned
    FEASIBLE = "feasible"  # a solution without a proof (heuristics, node/iteration limits)
    INFEASIBLE = "infeasible"
    UNBOUNDED = "unbounded"
    ERROR = "error"

    @property
    def has_solution(self) -> bool:
        return self in (Status.OPTIMAL, Status.TIME_LIMIT, Status.FEASIBLE)


def relative_gap(objective: float, bound: float) -> float:
    """|objective − bound| / max(|objective|, tiny): HiGHS's definition for minimisation."""
    if not (math.isfinite(objective) and math.isfinite(bound)):
        return math.inf
    return abs(objective - bound) / max(abs(objective), 1e-9)


@dataclass(frozen=True)
class SolveResult(Generic[S]):
    """Status, objective, bound, gap and wall time of one method on one instance.

    `bound` is a proven lower bound on the optimum (minimisation); methods that
    prove nothing report `-inf`, and `gap` is then `inf`. `solution` is the
    method's output (a placement, a token mapping); `report` holds
    solver-specific details (node count, LP bound, term breakdown).
    """

    method: str
    status: Status
    objective: float
    bound: float
    runtime_s: float
    solution: S | None = None
    report: dict[str, Any] = field(default_factory=dict)

    @property
    def gap(self) -> float:
        return relative_gap(self.objective, self.bound)

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
            "runtime_s": self.runtime_s,
            "report": self.report,
        }
