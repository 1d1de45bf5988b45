"""When to re-plan: a trigger an engine calls every step, O(layers x slots) per call.

Engines re-plan on a fixed interval (vLLM every 3,000 steps by default, SGLang every 1,000
iterations), so a drift waits up to an interval for a new plan, and a steady load is re-planned,
and experts moved, for nothing. The trigger re-plans when the load has left what the plan
assumed and what that has cost since exceeds what a re-plan costs:

1. `start(phy2log, moved)`, then the plan's first `CALIBRATION` steps — the plan's assumption:
   the per-step sum over layers of each layer's max/mean GPU load (even split; layers run one
   after another, so the sum is the step's MoE time in units of a layer's mean GPU load), its
   mean over the steps the plan first serves and its step-to-step spread. (Not the steps it was
   made on: a plan fits those better than any it serves, and that gap is no reason to re-plan.)
2. `observe(counts)` — each step, that sum under the plan in service; its excess over the
   assumption, less half a spread (the CUSUM's allowance: steps that are noisy but not worse do
   not add up), is added to a CUSUM that never drops below zero (Page's test).
3. A re-plan is due, once `min_history` steps have passed since the CUSUM last stood at zero
   (the change point: `since` steps, the history the next plan should be made on), when the
   CUSUM, the layer-steps of extra time spent since the load left the assumption, reaches the
   price of a re-plan: `move_cost` per expert moved times the experts the last re-plan moved.
   This is the rent-or-buy rule (pay rent until it sums to the purchase price, then buy): its
   cost is within twice that of the best re-plan time chosen in hindsight, whatever the load
   does next.

The move cost is in the drop-in's unit (per-step max/mean per expert moved, `backtest.MOVE_PRICE`
by default); an engine that knows its stall per moved expert and its layer time passes their
ratio. Everything is a function of the counts given: the same calls give the same answers.
"""

from __future__ import annotations

import numpy as np

from comoe_opt.balancers.dropin.backtest import MOVE_PRICE
from comoe_opt.balancers.dropin.objective import even_loads

ALLOWANCE = 0.5  # spreads of excess a step may have before it counts (Page's CUSUM for a 1-spread shift)
MIN_HISTORY = 8  # steps since the change a plan is made on, at least (the drop-in backtest's MIN_STEPS)
CALIBRATION = 16  # steps a new plan serves before its level is set (two of the suites' 8-step windows)


def layer_peaks(phy2log: np.ndarray, counts: np.ndarray, gpus: int) -> np.ndarray:
    """[S, L] each layer's max/mean GPU load (even split over its slots) of per-step counts
    [S, L, E] under the slot map `phy2log` [L, slots] (a step with no load: 1)."""
    loads = even_loads(phy2log, counts.transpose(1, 0, 2), gpus)  # [L, S, G]
    mean = loads.mean(axis=-1)
    peaks = np.divide(loads.max(axis=-1), mean, out=np.ones_like(mean), where=mean > 0)
    return peaks.T


class ReplanTrigger:
    """The rent-or-buy re-plan trigger for one EP group: `start` after each re-plan, `observe`
    after each step; `observe` returns True when a re-plan is due."""

    def __init__(
        self,
        gpus: int,
        move_cost: float = MOVE_PRICE,
        allowance: float = ALLOWANCE,
        min_history: int = MIN_HISTORY,
    ):
        if gpus < 1 or move_cost < 0 or allowance < 0 or min_history < 1:
            raise ValueError("gpus and min_history must be >= 1, move_cost and allowance >= 0")
        self.gpus, self.move_cost, self.allowance = gpus, move_cost, allowance
        self.min_history = min_history
        self.phy2log: np.ndarray | None = None
        self._reset(0.0)

    def start(self, phy2log: np.ndarray, moved: int | None = None) -> None:
        """A new plan `phy2log` [L, slots] in service; `moved`: the experts (replicas on GPUs that
        did not hold them) it moved, the price of the next re-plan (None: every slot, as a plan
        made afresh moves nearly every expert)."""
        self.phy2log = np.asarray(phy2log, dtype=np.int64)
        self._reset(self.move_cost * (self.phy2log.size if moved is None else moved))

    def _reset(self, price: float) -> None:
        """A new plan's state: its price, no calibration steps yet, the CUSUM at zero."""
        self.price = price  # what the next re-plan costs, in layer-steps of max/mean
        self.served: list[float] = []  # the calibration steps' sums
        self.level, self.slack = float("inf"), 0.0  # set once CALIBRATION steps are served
        self.cusum, self.since = 0.0, 0  # since: steps since the CUSUM last stood at zero

    def observe(self, counts: np.ndarray) -> bool:
        """Take one step's counts [L, E]; True when the extra time since the load left the plan's
        assumption has reached a re-plan's price."""
        if self.phy2log is None:
            raise ValueError("ReplanTrigger.observe before start: no plan in service")
        peaks = layer_peaks(self.phy2log, np.asarray(counts, dtype=np.float64)[None], self.gpus)
        total = float(peaks.sum())
        if len(self.served) < CALIBRATION:
            self.served.append(total)
            if len(self.served) == CALIBRATION:
                self.level = float(np.mean(self.served))
                self.slack = self.allowance * float(np.std(self.served, ddof=1))
            return False
        self.cusum = max(0.0, self.cusum + total - self.level - self.slack)
        self.since = self.since + 1 if self.cusum > 0 else 0
        return self.since >= self.min_history and self.cusum >= self.price
