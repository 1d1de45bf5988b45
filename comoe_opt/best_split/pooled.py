"""The pooled cut search: a local search on a pool of chiplet sets, checked exactly by min cut.

Above `MAX_ENUMERATED_CHIPLETS` the cut condition cannot enumerate every chiplet set, so a
search scores its moves on a pool of sets (each chiplet alone, all of them, and every
scenario's bottleneck found so far): makespans no higher than the exact ones. After each of
`POOL_ROUNDS` rounds of moves the round's result is scored exactly by min cut (min_cut.py),
each scenario's bottleneck joins the pool, and the result replaces the best plan only where it
is exactly better, so the plan returned is never worse, exactly, than the start; a round that
did not help is undone, and the grown pool makes the next one differ.

Two searches run this loop, with what differs passed in as `Rounds`: the slow loop's descent
(residency/search/refine.py: one layer on the full objective, tenants' room carried with the
plan, a relative tolerance, a round cut short by the deadline still checked) and the drop-in's
`lp` search (balancers/dropin/rebalance.py: every layer at once in float32, kept per layer, an
absolute tolerance, a round cut short not checked).
"""

from __future__ import annotations

from typing import Protocol, TypeVar

import numpy as np

from comoe_opt.best_split import sets as device_sets

POOL_ROUNDS = 4  # rounds of moves per search, each checked exactly (and growing the pool)

Plan = TypeVar("Plan")
Value = TypeVar("Value")
Pool = TypeVar("Pool")


class Rounds(Protocol[Plan, Value, Pool]):
    """What a pooled search needs of its caller."""

    check_cut_short: bool  # whether a round cut short is still scored exactly (and kept if better)

    def exact(self, plan: Plan, pool: Pool | None) -> tuple[Value, Pool] | None:
        """(`plan`'s exact value, `pool` (None: the base pool) grown by its bottlenecks); None
        when the caller's limit passed first."""
        ...

    def search(self, plan: Plan, pool: Pool) -> tuple[Plan, bool]:
        """(one round of moves from `plan` scored on `pool`, whether a limit cut it short)."""
        ...

    def keep(self, best: Plan, value: Value, found: Plan, found_value: Value) -> tuple[Plan, Value]:
        """The better of the two, by the caller's tolerance (where `found` is, per layer)."""
        ...

    def stop(self) -> bool:
        """Whether to stop before the next round."""
        ...


def pooled_search(rounds: Rounds[Plan, Value, Pool], start: Plan) -> tuple[Plan, bool]:
    """(the best plan checked exactly, whether a limit cut the search short)."""
    scored = rounds.exact(start, None)
    if scored is None:
        return start, True
    best, (value, pool) = start, scored
    for _ in range(POOL_ROUNDS):
        if rounds.stop():
            return best, True
        found, cut_short = rounds.search(best, pool)
        if cut_short and not rounds.check_cut_short:
            return best, True  # the last checked plan stands
        scored = rounds.exact(found, pool)
        if scored is None:
            return best, True
        (best, value), pool = rounds.keep(best, value, found, scored[0]), scored[1]
    return best, False


def base_pool(chiplets: int) -> np.ndarray:
    """[C + 1, W] the sets a pool starts from (best_split/sets.py rows): each chiplet alone, and
    all of them."""
    return np.concatenate([device_sets.singletons(chiplets), device_sets.everything(chiplets)[None]])
