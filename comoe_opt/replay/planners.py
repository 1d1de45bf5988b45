"""The balancers as the replay drives them (`Planner`): one adapter per kind.

* `Rolling` — any slow-loop method (CoMoE's `milp`, `exact`), EPLB and every engine balancer (the
  residency heuristics of `residency/heuristics/engines.py`), planned through the rolling horizon
  on an engine's view, so that leases and the migration-weight backtest stay; on the window's own
  steps (hindsight, cross-fitted) each plan stands alone, with no copy price.
* `DropIn` — the drop-in `rebalance_experts`, given the history and the map in service.
* `EplbOnSteps` — DeepSeek's EPLB on the steps it is given (the oracle's plan of one step).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from comoe_opt.balancers.eplb import deepseek_eplb
from comoe_opt.best_split.even import slot_replicas
from comoe_opt.errors import ComoeError
from comoe_opt.instance import Instance
from comoe_opt.planning.backtest import WeightChoice
from comoe_opt.planning.balance_backtest import BalanceChoice
from comoe_opt.planning.rolling import WindowPlan, reproducible_limit, rolling_horizon
from comoe_opt.planning.window import plan_window, steps_demand
from comoe_opt.replay.replay import Window
from comoe_opt.residency import MODEL_METHODS
from comoe_opt.residency.heuristics import eplb_slots
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.problem import TERMS, residency_problem

ENGINE_TERMS = TERMS - {"prefetch"}  # only CoMoE plans with what prefetch hides, as in evaluate
METHOD = {"comoe": "milp"}  # a peer's slow-loop method, where its name is not one


@dataclass
class Rolling:
    """A slow-loop method or engine balancer (`peer`: a `compare` peer or any `--method`), planned
    through the rolling horizon on the steps' counts, on the work limits of an evaluation
    (`time_limit_s` only for a study that asks for the clock)."""

    instance: Instance
    peer: str
    time_limit_s: float | None = None
    weights: list[WeightChoice] = field(default_factory=list)  # the migration weight per window
    balances: list[BalanceChoice] = field(default_factory=list)  # what each window balanced
    _plans: Any = None  # the rolling horizon's generator, made on the first window
    _steps: np.ndarray | None = None

    @property
    def name(self) -> str:
        return self.peer

    @property
    def method(self) -> str:
        return METHOD.get(self.peer, self.peer)

    @property
    def terms(self) -> frozenset[str]:
        """The objective's terms: the slow loop's models plan with what prefetch hides, EPLB and
        the engines' balancers without it (as in `evaluate`)."""
        return TERMS if self.method in MODEL_METHODS else ENGINE_TERMS

    def limit(self) -> float:
        return reproducible_limit(self.method) if self.time_limit_s is None else self.time_limit_s

    def plan(self, steps: np.ndarray, window: Window, in_service: Placement | None) -> Placement:
        if window.foresight == "history":
            return self._rolling(steps, window).placement
        demand = steps_demand(self.instance, steps[window.planned_on])
        plan = plan_window(
            self.instance, demand, method=self.method, terms=self.terms, time_limit_s=self.limit()
        )
        if plan.result.solution is None:
            what = f"steps {int(window.planned_on[0])}..{int(window.planned_on[-1])}"
            raise ComoeError(f"{self.peer}: {self.method} found no placement for {what}")
        return plan.result.solution

    def _rolling(self, steps: np.ndarray, window: Window) -> WindowPlan:
        """The rolling horizon's plan of `window`: its own history is the replay's (the same spans
        and `policy.history_windows`), its leases and backtest its own."""
        if self._plans is None:
            self._steps = steps
            self._plans = rolling_horizon(
                self.instance, steps, self.method, terms=self.terms, time_limit_s=self.limit()
            )
        if steps is not self._steps:
            raise ValueError("a rolling planner replays one trace")
        plan: WindowPlan = next(self._plans)
        if plan.window != window.index or plan.start != int(window.served[0]):
            raise ValueError(f"the replay's window {window.index} is not the rolling horizon's {plan.window}")
        self.weights.append(plan.weight)
        self.balances.append(plan.balance)
        return plan

    def weight_report(self) -> dict[str, Any]:
        """The weight each window was planned with and the backtests that chose them (JSON)."""
        return {
            "per_window": [c.weight for c in self.weights],
            "backtests": [c.to_dict() for c in self.weights if c.chosen_at == c.window],
            "balance_per_window": [c.mode for c in self.balances],
            "balance_backtests": [c.to_dict() for c in self.balances if c.chosen_at == c.window],
        }


@dataclass(frozen=True)
class EplbLayout:
    """EPLB's call for an instance: slots per layer (the same on every device), expert groups and
    nodes (EPLB's global policy where groups do not divide), and the devices."""

    slots: int
    groups: int
    nodes: int
    devices: int

    @classmethod
    def of(cls, instance: Instance, steps: np.ndarray, who: str) -> EplbLayout:
        window = steps[: instance.policy.window_batches]
        slots = eplb_slots(residency_problem(instance, steps_demand(instance, window)))
        if slots is None:
            raise ComoeError(f"{who} needs the same slots per device and layer (EPLB's requirement)")
        groups, nodes = instance.model.expert_groups, instance.hardware.nodes
        if steps.shape[2] % groups or groups % nodes:
            groups = nodes = 1  # EPLB's global policy, as the `eplb` heuristic
        return cls(slots, groups, nodes, instance.hardware.chiplets)

    @property
    def eplb_args(self) -> tuple[int, int, int, int]:
        return self.slots, self.groups, self.nodes, self.devices

    def placement(self, phy2log: np.ndarray, experts: int) -> Placement:
        """The placement of a slot map `phy2log` [L, slots], its slot map kept."""
        resident = slot_replicas(phy2log, experts, self.devices) > 0
        return Placement(resident, slot_map=phy2log.reshape(phy2log.shape[0], self.devices, -1))


@dataclass(frozen=True)
class EplbOnSteps:
    """DeepSeek's EPLB planned on the summed counts of the steps it is given."""

    layout: EplbLayout
    name: str = "eplb"

    def plan(self, steps: np.ndarray, window: Window, in_service: Placement | None) -> Placement:
        weight = steps[window.planned_on].sum(axis=0)
        phy2log, _, _ = deepseek_eplb(weight, *self.layout.eplb_args)
        return self.layout.placement(phy2log, steps.shape[2])


@dataclass(frozen=True)
class DropIn:
    """The drop-in `rebalance_experts` (balancers/dropin/rebalance.py) with the history and the
    map in service, as an engine calls it; `options` are its keyword arguments (move_cost, moves,
    calibrate, ...)."""

    layout: EplbLayout
    dispatch: Literal["even", "lp"] = "even"
    options: tuple[tuple[str, Any], ...] = ()
    label: str = ""
    use_previous: bool = True  # False: the map in service is not given (an ablation)

    @property
    def name(self) -> str:
        return self.label or f"drop-in {self.dispatch}"

    def plan(self, steps: np.ndarray, window: Window, in_service: Placement | None) -> Placement:
        from comoe_opt.balancers.dropin.rebalance import rebalance_experts  # the drop-in API

        history = steps[window.planned_on].astype(np.float64)
        previous = None
        if self.use_previous and in_service is not None and in_service.slot_map is not None:
            previous = in_service.slot_map.reshape(in_service.layers, -1)
        phy2log = rebalance_experts(
            history.sum(axis=0),
            *self.layout.eplb_args,
            history=history,
            previous=previous,
            dispatch=self.dispatch,
            **dict(self.options),
        )[0]
        return self.layout.placement(np.asarray(phy2log), steps.shape[2])
