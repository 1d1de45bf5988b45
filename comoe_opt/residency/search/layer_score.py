"""The parts of a layer's objective that both layer searches (refine.py, anneal.py) score a
move with, written once: each expert's own terms and each replica set's row of a `CutTable`.

A layer's share of the window objective (objective.py) is
`W · (mean scenario makespan + nearest-replica NoP + misses) + κ · copies`: the makespans come
from the work confined to each chiplet set (best_split/cut_condition.py), the rest is a sum of
per-expert terms that depend on the expert's replica set (a Python-int bit mask) only.
"""

from __future__ import annotations

import numpy as np

from comoe_opt.best_split import sets as device_sets
from comoe_opt.best_split.cut_condition import CutTable, int_masks
from comoe_opt.residency.problem import ResidencyProblem


def previous_masks(problem: ResidencyProblem, layer: int) -> list[int]:
    """Each expert's replica set in the previous placement (none without one): copies are
    the replicas outside it."""
    if problem.previous is None:
        return [0] * problem.experts
    return int_masks(problem.previous.resident[layer])


class ExpertTerms:
    """`W · (NoP + miss) + κ · copies` of one expert of a layer with a given replica set, kept
    per (expert, mask) as seen: NoP is the nearest replica's per token, a miss only without a
    replica, a copy each replica not in the previous placement."""

    def __init__(self, problem: ResidencyProblem, layer: int) -> None:
        self.p = problem
        self.tokens, self.miss = problem.tokens[layer].tolist(), problem.miss_ms[layer].tolist()
        self.prev = previous_masks(problem, layer)
        self.chiplets = problem.chiplets
        self.nop_c = problem.nop_ms_per_token
        self.least_nop = float(self.nop_c.min())
        self.nops: dict[int, float] = {}
        self.seen: dict[tuple[int, int], float] = {}

    def __call__(self, e: int, mask: int) -> float:
        value = self.seen.get((e, mask))
        if value is None:
            value = self.seen[(e, mask)] = self._terms(e, mask)
        return value

    def _terms(self, e: int, mask: int) -> float:
        if mask:
            nop = self.nops.get(mask)
            if nop is None:
                on = [c for c in range(self.chiplets) if mask >> c & 1]
                nop = self.nops[mask] = float(self.nop_c[on].min())
            own = self.tokens[e] * nop
        else:
            own = self.tokens[e] * self.least_nop + self.miss[e]
        copies = (mask & ~self.prev[e]).bit_count()
        return self.p.batches * own + self.p.copy_ms * copies


class SetRows:
    """Each replica set's row of a `CutTable`: 1 for every chiplet set that holds it, 0
    elsewhere, or with `per_capacity` 1 / the set's capacity; kept per mask as seen."""

    def __init__(self, table: CutTable, per_capacity: bool = False) -> None:
        self.table = table
        self.scale = 1.0 / table.capacity if per_capacity else None
        self.seen: dict[int, np.ndarray] = {}

    def __call__(self, mask: int) -> np.ndarray:
        row = self.seen.get(mask)
        if row is None:
            row = self.table.inside(device_sets.from_ints([mask], self.table.sets.shape[1]))[0]
            row = self.seen[mask] = row if self.scale is None else row * self.scale
        return row
