"""The drop-in's guard against losing to EPLB: a layer keeps the search's map only where that map
balances the newest steps of the history at least as well as EPLB's plan of the same history;
elsewhere EPLB's plan serves.

Why the newest steps: the plan serves the steps after its history, which resemble the newest ones
most. A search that starts from the map in service moves little per call (rebalance.py's
`PASSES_GIVEN_PREVIOUS`); when the load turns (a drift, a new mix of requests) the map in service
fits the older steps, and EPLB's plan, made afresh on the whole history, can fit the newest steps
better. Both plans have seen those steps, EPLB's through their sum and ours through their
recency-weighted moments: the check compares two fits to the same recent evidence, it is not
held-out. It costs one scoring of each plan on a quarter of the steps, O(layers x steps x slots)
for `even`: decided by that work alone, the same on any machine.

The guard's promise is balance: it weighs the two plans' moves only when the caller fixed a
`move_cost` (then a layer takes EPLB's plan only where its balance gain pays for its extra moves
at that price). The search's default price shapes which moves the search makes; EPLB's plan moves
nearly every expert, and at a default price chosen on one model's windows the guard would never
take it where a drift asks for it.
"""

from __future__ import annotations

import numpy as np

from comoe_opt.balancers.dropin.backtest import HELD_BACK
from comoe_opt.balancers.dropin.objective import Shape, moved, scores
from comoe_opt.best_split.even import slot_replicas


def newest_steps(w: np.ndarray) -> np.ndarray:
    """The newest `1 / backtest.HELD_BACK` (a quarter) of normalised steps `w` [layers, S, E], at
    least one: the steps the backtest holds back."""
    steps = w.shape[1]
    return w[:, steps - max(1, steps // HELD_BACK) :]


def guarded(
    plan: np.ndarray,
    eplb_map: np.ndarray,
    w: np.ndarray,
    shape: Shape,
    prev_n: np.ndarray | None = None,
    price: float | None = None,
    z: float = 0.0,
    judged: np.ndarray | None = None,
    scored: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(the plan served, the layers where EPLB's serves): `plan` [layers, slots] with each layer
    that balances the newest steps of `w` (mean per-step max/mean GPU load under the dispatch)
    worse than `eplb_map` replaced by EPLB's (ties keep ours: it moves fewer experts). With a
    `price` and the map in service's replica counts `prev_n` [layers, E, G], each plan's experts
    moved off that map cost `price` each on top of its balance. With `z`, EPLB's lead must exceed
    `z` standard errors of the per-step difference (a lead within them is as likely noise).
    `judged` [layers, S', E]: the steps judged on instead of the newest; `scored`: both plans'
    scores on them [layers, S'] (ours, EPLB's), when the caller has them."""
    newest = newest_steps(w) if judged is None else judged
    ours, theirs = scored or (scores(plan, newest, shape), scores(eplb_map, newest, shape))
    diff = ours - theirs  # [layers, steps]: ours - EPLB's
    gain = diff.mean(axis=1)  # EPLB's lead on the newest steps
    if price is not None and prev_n is not None:
        experts = w.shape[-1]
        gain += price * moved(slot_replicas(plan, experts, shape.gpus), prev_n)
        gain -= price * moved(slot_replicas(eplb_map, experts, shape.gpus), prev_n)
    noise = np.zeros_like(gain)
    if z and diff.shape[1] > 1:  # z standard errors of the per-step difference
        noise = z * diff.std(axis=1, ddof=1) / np.sqrt(diff.shape[1])
    loses = np.flatnonzero(gain > noise + 1e-12)
    if loses.size == 0:
        return plan, loses
    served = plan.copy()
    served[loses] = eplb_map[loses]
    return served, loses
