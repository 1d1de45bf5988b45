"""What the slow loop balances, chosen per call by a backtest on modelled time
(`policy.balance = "auto"`; formulations/serving-time.md, "What CoMoE plans for").

Token counts (`"tokens"`, the engines' choice) and the experts' roofline work (`"work"`) each win
on some loads and lose on others (measured: a decode regime's layer time 9.7% lower with work, a
prefill regime's 0.7% higher), so the rolling horizon chooses from the trace it plans, only from
windows it has already served. At window w (`FIRST_WINDOW`, then every `EVERY` windows):

* origin o = w − 1: the plan that served o (made with the current mode) and o planned again with
  the other mode (the history before o, the placement that served o − 1, the leases then, o's
  migration weight);
* each scored on o's own steps by the MoE layer's modelled time under the engines' even split
  (costs.py `LayerTime`: per step, the layers' summed time). The copies are not in the score: the
  mode is a choice for the windows after, and each of their plans prices its own copies (the
  migration weight); a switch's one-off copies, spread over a window of a dump cut in eight,
  would outweigh any steady gain;
* the lower wins from window w on; a tie keeps the current mode. The first windows plan with
  `"tokens"`.

Every solve runs on the work limits of an evaluation, so the choice is the same on any machine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from comoe_opt.best_split.even import even_split
from comoe_opt.instance import Instance, with_overrides
from comoe_opt.residency.placement import Placement

AUTO = "auto"
MODES = ("tokens", "work")
PRIOR = "tokens"  # before any origin has been scored: the engines' choice
# the first window with an informative origin: window 2 (window 1 must keep every page window 0
# copied in, leased for policy.lease_windows = 1 window: planned again in any mode it is the same)
FIRST_WINDOW = 3
EVERY = 8  # windows between backtests: one extra solve in eight windows


@dataclass(frozen=True)
class BalanceChoice:
    """The mode a window was planned with and, where a backtest chose it, each mode's score."""

    window: int
    mode: str
    chosen_at: int | None = None  # the window whose backtest chose it (None: the prior, or fixed)
    ms_per_step: dict[str, float] = field(default_factory=dict)  # each mode's score on the origin

    def to_dict(self) -> dict[str, Any]:
        return {"window": self.window, "mode": self.mode, "ms_per_step": self.ms_per_step}


def mode_instances(instance: Instance) -> dict[str, Instance]:
    """The instance as each mode plans it: both modes for `"auto"`, else its own mode alone."""
    if instance.policy.balance != AUTO:
        return {instance.policy.balance: instance}
    return {mode: with_overrides(instance, {"policy.balance": mode}) for mode in MODES}


class BalanceBacktest:
    """The backtest of one rolling horizon; `counts(start, stop)` gives [n, L, E] steps."""

    def __init__(self, instance: Instance, counts: Callable[[int, int], np.ndarray]):
        self.timing = instance.layer_time
        self.devices = instance.hardware.chiplets
        self.counts = counts
        self.current = PRIOR

    def mode_for(
        self,
        w: int,
        spans: list[tuple[int, int]],
        served: list[Placement],
        replan: Callable[[int, str], Placement],
    ) -> BalanceChoice:
        """The mode window `w` plans with; `replan(o, mode)` re-plans origin o with `mode`."""
        if w < FIRST_WINDOW or (w - FIRST_WINDOW) % EVERY:
            return BalanceChoice(w, self.current)
        o = w - 1
        other = next(m for m in MODES if m != self.current)
        plans = {self.current: served[o], other: replan(o, other)}
        steps = self.counts(*spans[o])
        scores = {m: self.ms_per_step(p, steps) for m, p in plans.items()}
        if scores[other] < scores[self.current]:
            self.current = other
        return BalanceChoice(w, self.current, w, scores)

    def ms_per_step(self, plan: Placement, steps: np.ndarray) -> float:
        """The MoE layers' modelled time per step of `steps` under the even split."""
        loads, busy = even_split(np.rint(steps), plan.slots())
        assert busy is not None
        return float(self.timing.layer_ms(loads, busy).sum(axis=1).mean())
