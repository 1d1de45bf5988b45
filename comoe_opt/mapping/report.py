"""What each fast-loop method reports beside its objective and bound (`SolveResult.report`).

Every method's report is a `MappingReport`: the makespan in integer ticks (the objective is
ticks × `tick_s` seconds) and the tick; the exact methods add what they did:

* `FlowReport`: the min-cost flows (flow.py): total cost, the makespan lower bound the arcs
  were priced from, rounds (the window grew when the flow used an overflow arc), arcs;
* `BisectionReport`: `exact` (exact.py): the max-flow solves of the bisection;
* `MilpReport`: the MILP (milp.py): its LP relaxation bound and HiGHS's termination.

A fast-loop solve has no deadline, so no `Timing`: `SolveResult.runtime_s` is its time.
`to_dict()` gives the fields by name.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np

from comoe_opt.results import SolveResult


@dataclass(frozen=True, kw_only=True)
class MappingReport:
    """The makespan in ticks (None: no mapping, e.g. an expert no chiplet can serve) and the tick."""

    makespan_ticks: int | None
    tick_s: float

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass(frozen=True, kw_only=True)
class FlowReport(MappingReport):
    """`min-cost-flow` and `min-cost-flow-per-token`."""

    flow_cost: int  # total unit cost of the optimal flow
    lower_bound_ticks: int  # the makespan lower bound; slots finishing by it cost nothing
    rounds: int  # flows solved (the priced window grew after each that used an overflow arc)
    arcs: int  # arcs of the last network


@dataclass(frozen=True, kw_only=True)
class BisectionReport(MappingReport):
    """`exact`: bisection on the makespan with a max-flow feasibility check."""

    max_flow_solves: int


@dataclass(frozen=True, kw_only=True)
class MilpReport(MappingReport):
    """The makespan MILP (Pyomo, HiGHS)."""

    lp_bound_ticks: float  # its LP relaxation's optimum (-inf when the LP was not solved)
    termination: str  # HiGHS's own status


MappingResult: TypeAlias = SolveResult[np.ndarray, MappingReport]
