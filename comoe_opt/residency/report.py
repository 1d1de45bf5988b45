"""What each slow-loop method reports beside its objective and bound (`SolveResult.report`).

One dataclass per method family, all derived from `ResidencyReport`:

* `HeuristicReport`: the heuristics (`static`, `greedy`, `eplb`, ...; residency/heuristics/solve.py);
* `ModelReport`: `milp` and `exact` (exact/pipeline.py): where the placement came from, the replica-count
  model's outcome, each bound by its source, the class bound with its certificate, the cut rounds;
* `LayersReport`: `milp` and `exact` where the per-layer slots separate the layers (exact/by_layer.py);
* `FullModelReport`: `full`, the plain x[l,e,c] model;
* `LPReport`: `lp`, the LP relaxation of the replica-count model (no placement).

Every one carries the placement's objective terms (`ObjectiveTerms`, None without a placement)
and the solve's `Timing`. `to_dict()` is the flat JSON of `solve --json`'s "report": the terms'
keys (`total_ms`, `balance_ms`, ..., `expected_balance`), the family's fields by name, then the
timing's keys (`time_limit_s`, `total_s`, `phases`, `stopped_by_time_limit`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, TypeAlias

from comoe_opt.residency.bounds.check_bound import BoundCertificate
from comoe_opt.residency.bounds.check_group_bound import GroupCertificate
from comoe_opt.residency.objective import ObjectiveTerms
from comoe_opt.residency.placement import Placement
from comoe_opt.results import SolveResult, Timing

_COMMON = ("terms", "timing")


@dataclass(frozen=True, kw_only=True)
class ResidencyReport:
    """What every slow-loop method reports: its placement's objective terms and its timing."""

    terms: ObjectiveTerms | None  # None: no placement (or a method that places nothing)
    timing: Timing
    # replicas moved or dropped to lay the plan out within policy.layer_slots (residency/layer_slots.py)
    layout_moves: int = 0

    def to_dict(self) -> dict[str, Any]:
        terms = {} if self.terms is None else self.terms.to_dict()
        own = {
            f.name: _json(getattr(self, f.name)) for f in dataclasses.fields(self) if f.name not in _COMMON
        }
        return {**terms, **own, **self.timing.to_dict()}


@dataclass(frozen=True, kw_only=True)
class HeuristicReport(ResidencyReport):
    """A heuristic's placement scored exactly, or the constraints it breaks (then no terms)."""

    violations: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ModelReport(ResidencyReport):
    """`milp` and `exact`: the pipeline's steps (formulations/residency.md)."""

    spare_replicas: int = 0  # replicas added on spare pages at no cost (fill.py) to the final placement
    placement_from: str  # the step whose placement won ("warm start (greedy) + scenario search", ...)
    warm_start: str | None  # the best feasible heuristic (None: none was)
    warm_start_objective: float | None
    replica_model_objective: float  # the replica-count MILP's incumbent, constant included
    replica_model_status: str  # HiGHS's own status (or why it did not start)
    replica_model_bound_from: str  # where the replica model's bound came from, or why there is none
    build_s: float  # building the replica-count model
    solver_s: float  # HiGHS on it, hand-over included
    full_model_bound: float | None  # the full model's polish (small instances), None if it did not run
    cut_rounds: int | None  # `exact`'s scenario cut model: rounds, None if it did not run
    cuts: int | None
    cut_model_bound: float | None
    cut_model: str | None  # `exact`: whether the cut model was built, and why not; None for `milp`
    class_bound: float | None  # the hop-class model's LP bound (decompose.py), None if not computed
    certificate: BoundCertificate | None  # ... and its dual certificate (check_bound.check_certificate)
    lagrangian_bound: float | None = None  # `exact`: the class model's layers as MILPs at its LP's prices
    # `exact`: the scenario-group bound (group_bound.py) and what check_group_bound.py recomputes it from
    group_bound: float | None = None
    group_certificate: GroupCertificate | None = None
    # each step after the replica model: objective lowered and bound raised (ms), milp.STEPS' order
    gains: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    budget: str = "time limit"  # or "work limits (no time limit)": how the steps were ended (schedule.py)


@dataclass(frozen=True)
class LayerOutcome:
    """One layer's `milp` or `exact` solve in a window the slots separate (exact/by_layer.py)."""

    layer: int
    status: str
    objective: float  # the layer's part of the window objective, its constant included
    bound: float  # ... and its proven bound
    placement_from: str  # the step whose placement won in that layer


@dataclass(frozen=True, kw_only=True)
class LayersReport(ResidencyReport):
    """`milp` or `exact` layer by layer, where `policy.layer_slots` separates the layers (exact/by_layer.py):
    each layer's outcome; the window's bound is the sum of their bounds."""

    layers: tuple[LayerOutcome, ...]
    bound_from: str = "the layers' own bounds summed (policy.layer_slots separates the layers)"


@dataclass(frozen=True, kw_only=True)
class FullModelReport(ResidencyReport):
    """`full`: the plain x[l,e,c] model solved by HiGHS."""

    solver_objective: float  # HiGHS's incumbent, constant included (inf without one)
    solver_status: str
    build_s: float
    solver_s: float


@dataclass(frozen=True, kw_only=True)
class LPReport(ResidencyReport):
    """`lp`: the LP relaxation's value is the result's bound (when solved); it places nothing."""

    relaxation: str
    solver_status: str


ResidencyResult: TypeAlias = SolveResult[Placement, ResidencyReport]


def _json(value: Any) -> Any:
    if isinstance(value, BoundCertificate | GroupCertificate):
        return json.loads(value.to_json())
    if isinstance(value, tuple):
        return [dataclasses.asdict(v) if isinstance(v, LayerOutcome) else v for v in value]
    return value
