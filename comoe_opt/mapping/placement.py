"""A simple built-in placement for the fast loop's gap report, when no placement is given.

Per layer, each chiplet gets `floor(capacity / page) // layers` page slots,
trimmed (largest first) to the replica budget's share of the layer,
`policy.replica_budget_pages // layers`. The experts of a profiling window are taken hottest first and spread
round-robin over the chiplets, one copy each, while slots last; slots that
are left over then hold extra replicas of the hottest experts, again
round-robin, on chiplets that do not hold them yet. Deterministic: ties go to
the lower expert id and the lower chiplet.
"""

from __future__ import annotations

import numpy as np

from comoe_opt.instance import Instance
from comoe_opt.trace.batching import MicroBatches
from comoe_opt.trace.model import selection_counts


def slots_per_layer(instance: Instance, layers: int) -> np.ndarray:
    """[C] page slots each chiplet gives one layer: its capacity split evenly over layers, and
    no more slots per layer than the replica budget allows (taken from the largest first)."""
    slots = instance.capacity_pages // layers
    budget = instance.policy.replica_budget_pages
    if budget:
        for _ in range(max(0, int(slots.sum()) - budget // layers)):
            slots[int(np.argmax(slots))] -= 1
    return slots


def default_placement(instance: Instance, batches: MicroBatches, profile_batches: int = 0) -> np.ndarray:
    """[L, E, C] bool residency from the first `profile_batches` micro-batches (0 = policy window)."""
    profile = profile_batches or instance.policy.window_batches
    sample = batches.experts[: max(1, min(profile, batches.batches))]
    counts = selection_counts(sample.reshape(-1, batches.layers, batches.top_k), batches.num_experts)
    slots = slots_per_layer(instance, batches.layers)
    return np.stack([layer_placement(row, slots) for row in counts])


def layer_placement(counts: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """[E, C] residency of one layer: hottest experts first, round-robin, then replicas."""
    experts, chiplets = counts.size, slots.size
    hot = np.argsort(-counts, kind="stable")
    resident = np.zeros((experts, chiplets), dtype=bool)
    free = slots.copy()
    cursor = 0
    for copy in range(chiplets):  # copy 0 = first replica of every expert, then extra ones
        placed = False
        for e in hot if copy == 0 else hot[counts[hot] > 0]:
            c = _next_chiplet(free, resident[e], cursor)
            if c < 0:
                continue
            resident[e, c] = True
            free[c] -= 1
            cursor, placed = (c + 1) % chiplets, True
        if not placed or not free.any():
            break
    return resident


def _next_chiplet(free: np.ndarray, holds: np.ndarray, cursor: int) -> int:
    """First chiplet from `cursor` on (cyclically) with a free slot that does not hold the page."""
    order = np.roll(np.arange(free.size), -cursor)
    ok = order[(free[order] > 0) & ~holds[order]]
    return int(ok[0]) if ok.size else -1
