"""The slow loop's two moves and the rules a move must keep, written once for the descent
(refine.py) and the annealing (anneal.py). Both moves keep every chiplet's page count, so
capacity and budget hold by construction:

* swap — a replica of a on chiplet c and a replica of b on chiplet d trade places;
* replace — a replica of a on c becomes a replica of b on c.

A replica set is a Python-int bit mask (bit c: a replica on chiplet c), of any width.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from comoe_opt.best_split.cut_condition import int_masks
from comoe_opt.residency.problem import ResidencyProblem


@dataclass(frozen=True)
class MoveRules:
    """One layer's limits on a move: leased replicas stay, no expert above the replica limit,
    none without a replica under `all_resident`, no tenant above its quota."""

    lease: list[int]  # each expert's leased replicas, as a mask
    owner: np.ndarray  # [tenants, E] 1 where the tenant owns the expert
    max_replicas: int
    all_resident: bool

    @classmethod
    def of(cls, problem: ResidencyProblem, layer: int) -> MoveRules:
        experts = problem.experts
        leased = problem.leased
        lease = int_masks(leased[layer]) if leased is not None else [0] * experts
        owns = [t.owns[layer] for t in problem.tenants]
        owner = np.array(owns, dtype=np.int64) if owns else np.zeros((0, experts), dtype=np.int64)
        return cls(lease, owner, problem.max_replicas, problem.all_resident)

    def swap_allowed(self, a: int, ma: int, c: int, b: int, mb: int, d: int) -> bool:
        """Whether a's replica on c and b's on d may trade places, a's replica set being `ma`
        and b's `mb`."""
        if a == b or c == d or (ma >> d) & 1 or (mb >> c) & 1:
            return False
        return not ((self.lease[a] >> c) & 1 or (self.lease[b] >> d) & 1)

    def drop_allowed(self, a: int, ma: int, c: int) -> bool:
        """Whether a's replica on c may be dropped (replica set `ma`): it frees a page, so only
        a lease and all_resident can stop it."""
        if not (ma >> c) & 1 or (self.lease[a] >> c) & 1:
            return False
        return not (self.all_resident and ma.bit_count() < 2)

    def add_allowed(self, b: int, mb: int, c: int, room: np.ndarray) -> bool:
        """Whether b (replica set `mb`) may gain a replica on c, the tenants having `room` pages
        left (the chiplet's free page is the caller's to check)."""
        if (mb >> c) & 1 or mb.bit_count() + 1 > self.max_replicas:
            return False
        return not (self.owner.shape[0] and np.any(self.owner[:, b] > room))

    def replace_allowed(self, a: int, ma: int, c: int, b: int, mb: int, room: np.ndarray) -> bool:
        """Whether a's replica on c may become one of b (replica sets `ma`, `mb`), the tenants
        having `room` pages left."""
        if a == b or (mb >> c) & 1 or (self.lease[a] >> c) & 1:
            return False
        if mb.bit_count() + 1 > self.max_replicas or (self.all_resident and ma.bit_count() < 2):
            return False
        return not (self.owner.shape[0] and np.any(self.owner[:, b] - self.owner[:, a] > room))
