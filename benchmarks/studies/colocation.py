"""Co-location rows for the class model: which bursty experts share a chiplet, without chiplet labels.

The class model (decompose.py) knows each expert's replicas per class m[e,k] but not which experts
share a chiplet, so every scenario's cut sees each expert's replicas as disjoint from the others'.
For a set B of bursty experts this module adds, per pair (i, j) of B and class k, an integer

    o[i,j,k] = chiplets of class k holding both i and j,
    o ≤ m[i,k],  o ≤ m[j,k],  o ≥ m[i,k] + m[j,k] − |k|             (two subsets of one class)

and what the chiplets' contents force: with q_c the experts of B on chiplet c, the pairs of B share
Σ_{c ∈ k} C(q_c, 2) chiplet slots, and C(q, 2) ≥ a q − a (a + 1) / 2 for every integer a ≥ 0, so

    Σ_{i<j ∈ B} o[i,j,k] ≥ a · Σ_{i ∈ B} m[i,k] − |k| · a (a + 1) / 2      a = 1, 2, ...

The pair's cut of each scenario (cut_condition.py: the work confined to a chiplet set over its speed),
for the set R_i ∪ R_j of U = Σ_k (m[i,k] + m[j,k] − o[i,k]) chiplets (speeds equal, so the
capacity is U; an expert without a replica counts as C, it runs anywhere):

    z_s ≥ chord_n(U) of (w_is + w_js) / U,    n = 1 .. C − 1

(1/U is convex, so the chord through n and n + 1 lies below it at every integer U). The rows hold
for every placement's image, so the class model with them is still a relaxation; there are no
chiplet labels, hence no chiplet symmetry, yet the overlap is integral. Only for chiplets of one
speed (`applies`). Related: the edge formulation of graph partitioning (pairs in one part).
"""

from __future__ import annotations

import itertools

import numpy as np

from comoe_opt.highs import INF
from comoe_opt.residency.bounds.decompose import ClassModel, DeviceClasses


def applies(classes: DeviceClasses) -> bool:
    return bool(np.allclose(classes.speed, classes.speed[0]))


def bursty_experts(unit: np.ndarray, floor: np.ndarray, count: int) -> np.ndarray:
    """The `count` experts with the largest work relative to the scenario's floor, [S, E] → [B]."""
    peak = (unit / np.maximum(floor[:, None], 1e-300)).max(axis=0)
    return np.sort(np.argsort(-peak, kind="stable")[:count])


def add_colocation(model: ClassModel, layer: int, experts: int) -> int:
    """Add the co-location rows for the `experts` burstiest experts of `layer` to a class model
    holding that layer (before it is solved); returns the pair cuts added."""
    p, cl, lp = model.p, model.classes, model.lp
    if not applies(cl):
        return 0
    C, K = p.chiplets, cl.count
    speed = float(cl.speed[0])
    unit = p.scenario_work[:, layer, :, 0] / speed  # [S, E] on one of these chiplets
    floor = unit.sum(axis=1) / C
    cols = model.cols[layer]
    busy = bursty_experts(unit, floor, experts)
    pairs = list(itertools.combinations(busy.tolist(), 2))
    overlap: dict[tuple[int, int, int], int] = {}
    for i, j in pairs:
        for k in range(K):
            if cols.m[i, k] < 0 or cols.m[j, k] < 0:
                continue
            o = lp.add_columns([0.0], [0.0], [float(min(cl.size[k], p.max_replicas))], integer=True)
            overlap[i, j, k] = o
            lp.add_row(-INF, 0.0, [o, cols.m[i, k]], [1.0, -1.0])
            lp.add_row(-INF, 0.0, [o, cols.m[j, k]], [1.0, -1.0])
            lp.add_row(-float(cl.size[k]), INF, [o, cols.m[i, k], cols.m[j, k]], [1.0, -1.0, -1.0])
    for k in range(K):
        os_ = [o for (_, _, kk), o in overlap.items() if kk == k]
        ms = [int(cols.m[e, k]) for e in busy if cols.m[e, k] >= 0]
        for a in range(1, len(busy)):  # Σ o − a Σ m ≥ −|k| a (a + 1) / 2 (at most |B| of B per chiplet)
            value = [1.0] * len(os_) + [-float(a)] * len(ms)
            lp.add_row(-float(cl.size[k]) * a * (a + 1) / 2, INF, [*os_, *ms], value)
    resident = {e: cols.t[e] for e in busy}  # r_e = Σ_T t[e, T]
    added = 0
    for i, j in pairs:
        work = unit[:, i] + unit[:, j]  # [S]
        ms = [int(cols.m[e, k]) for e in (i, j) for k in range(K) if cols.m[e, k] >= 0]
        os_ = [o for (a, b, _), o in overlap.items() if (a, b) == (i, j)]
        ts = [*resident[i], *resident[j]]
        for s in np.flatnonzero(work > floor):
            for n in range(1, C):
                lo, hi = work[s] / n, work[s] / (n + 1)
                if lo <= floor[s] * (1 + 1e-9):
                    break
                slope = hi - lo  # z ≥ lo + slope (U − n), U = Σ m − Σ o + C (2 − Σ t)
                # z − slope Σ m + slope Σ o + slope C Σ t ≥ lo − slope n + 2 slope C
                index = [int(cols.z[s]), *ms, *os_, *ts]
                value = [1.0] + [-slope] * len(ms) + [slope] * len(os_) + [slope * C] * len(ts)
                lp.add_row(lo - slope * n + 2 * slope * C, INF, index, value)
                added += 1
    lp.flush()
    return added
