"""Spare pages hold extra replicas, when that costs the objective nothing.

The slow-loop objective plans on *expected* load, which is indifferent to
replicas that only add flexibility; yet a micro-batch's load is bursty, and
a spare replica lets the fast loop move work off a busy chiplet. So ties are
broken toward flexibility: pages the optimum leaves unused (capacity, budget
and quotas permitting) take extra replicas of the experts with the largest
peak load per replica in the window (EPLB's rule on peaks), each on the
least-loaded chiplet of its layer. Only replicas that need no copy (already
resident from the previous placement) are added when copies cost anything,
so the objective never increases; the caller checks it.
"""

from __future__ import annotations

import heapq

import numpy as np

from comoe_opt.residency.placement import Placement
from comoe_opt.residency.problem import ResidencyProblem


def fill_spare(problem: ResidencyProblem, placement: Placement) -> Placement:
    resident = placement.resident.copy()
    spare = problem.page_limit - int(resident.sum())
    free = problem.capacity_pages.astype(np.int64) - resident.sum(axis=(0, 1))
    if spare <= 0 or free.sum() <= 0:
        return placement
    previous = problem.previous.resident if problem.previous is not None else None
    copy_free_only = problem.copy_ms > 0
    tenant_room = [t.max_pages - int(resident[t.owns].sum()) for t in problem.tenants]
    heap = [
        (-_ratio(problem, resident, l, e), l, e)
        for l, e in zip(*np.nonzero(resident.any(axis=2)), strict=True)
    ]
    heapq.heapify(heap)
    while heap and spare > 0:
        _, l, e = heapq.heappop(heap)
        if resident[l, e].sum() >= problem.max_replicas or not _quota_allows(problem, tenant_room, l, e):
            continue
        c = _chiplet(problem, resident, free, previous, l, e, copy_free_only)
        if c is None:
            continue
        resident[l, e, c] = True
        free[c] -= 1
        spare -= 1
        for i, t in enumerate(problem.tenants):
            tenant_room[i] -= int(t.owns[l, e])
        heapq.heappush(heap, (-_ratio(problem, resident, l, e), l, e))
    return Placement(resident)


def _ratio(problem: ResidencyProblem, resident: np.ndarray, l: int, e: int) -> float:
    return float(problem.peak_tokens[l, e]) / max(int(resident[l, e].sum()), 1)


def _quota_allows(problem: ResidencyProblem, room: list[int], l: int, e: int) -> bool:
    return all(r > 0 for t, r in zip(problem.tenants, room, strict=True) if t.owns[l, e])


def _chiplet(
    problem: ResidencyProblem,
    resident: np.ndarray,
    free: np.ndarray,
    previous: np.ndarray | None,
    l: int,
    e: int,
    copy_free_only: bool,
) -> int | None:
    """The chiplet for one more replica of (l, e): no copy if possible, else the least loaded."""
    open_ = ~resident[l, e] & (free > 0)
    if previous is not None and (open_ & previous[l, e]).any():
        open_ &= previous[l, e]
    elif copy_free_only:
        return None
    candidates = np.flatnonzero(open_)
    if candidates.size == 0:
        return None
    share = problem.peak_tokens[l] / np.maximum(resident[l].sum(axis=1), 1)
    load = (share[:, None] * resident[l]).sum(axis=0)
    return int(candidates[np.argmin(load[candidates])])
