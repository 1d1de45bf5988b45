"""Each scenario's bottleneck chiplet set by parametric min cut, for any number of chiplets.

The best-routing makespan of one micro-batch (best_split/cut_condition.py) is the largest
cut ratio  max_D Σ_{e : R_e ⊆ D} w_e / Σ_{c ∈ D} v_c.  Enumerating the sets
is exact up to `MAX_ENUMERATED_CHIPLETS`; beyond, Dinkelbach's method finds
the maximising set: for a ratio λ,

    max_D  Σ_{e : R_e ⊆ D} w_e − λ Σ_{c ∈ D} v_c

is a maximum-weight closure (choosing expert e forces every chiplet of R_e
into D), solved by one minimum cut: source → e with capacity w_e, e → c of
R_e unbounded, c → sink with capacity λ v_c. The source side of the cut is the
best (experts, D). A positive value means D's ratio beats λ; λ becomes that
ratio and the cut is solved again. The ratio rises strictly each time and
there are finitely many sets, so it stops — in practice after 2–4 cuts — at
the maximum. Capacities are integers for the max-flow solver (OR-Tools), so
work and speeds are scaled to 2^50 of the total; the set found is scored in
floating point, and a set missed by the rounding is worse by at most
`2^-50` relative.
"""

from __future__ import annotations

import numpy as np
from ortools.graph.python.max_flow import SimpleMaxFlow

from comoe_opt.best_split import sets as device_sets

SCALE = float(1 << 50)  # integer capacities: the total work maps to 2^50
MAX_CUTS = 64  # Dinkelbach steps per scenario; the ratio rises strictly, so this is a guard


class Bottlenecks:
    """The closure network of one layer's replica map, reused for every scenario."""

    def __init__(self, resident: np.ndarray, speeds: np.ndarray):
        chiplets = resident.shape[1]
        self.speeds, self.chiplets = speeds, chiplets
        self.placed = np.flatnonzero(resident.any(axis=1))  # experts without a replica count for D = all
        self.all_mask = device_sets.everything(chiplets)
        n = self.placed.size
        self.source, self.sink = n + chiplets, n + chiplets + 1
        e_idx, c_idx = np.nonzero(resident[self.placed])
        tails = np.concatenate((np.full(n, self.source), e_idx, n + np.arange(chiplets)))
        heads = np.concatenate((np.arange(n), n + c_idx, np.full(chiplets, self.sink)))
        caps = np.zeros(tails.size, dtype=np.int64)
        caps[n : n + e_idx.size] = np.iinfo(np.int64).max // 4
        self.flow = SimpleMaxFlow()
        arcs = self.flow.add_arcs_with_capacity(tails.astype(np.int32), heads.astype(np.int32), caps).astype(
            np.int32
        )
        self.source_arcs, self.sink_arcs = arcs[:n], arcs[n + e_idx.size :]
        self.hosts = resident[self.placed]  # [n, C]
        # experts with every replica on one chiplet: that chiplet's own work, whatever the split
        single = self.hosts.sum(axis=1) == 1
        self.single_experts = np.flatnonzero(single)
        self.single_host = self.hosts[single].argmax(axis=1)

    def worst(self, work: np.ndarray) -> tuple[float, np.ndarray]:
        """(makespan, bottleneck set [W], best_split/sets.py) for one scenario's unit-speed work [E]."""
        total = float(work.sum())
        best_ratio, best_mask = total / float(self.speeds.sum()), self.all_mask
        placed_work = work[self.placed]
        if total <= 0 or not (placed_work > 0).any():
            return best_ratio, best_mask
        # start from the best single chiplet (its own experts' work over its speed): a set's ratio,
        # as Dinkelbach's method needs, and most often the answer or near it, which saves cuts
        own = np.bincount(self.single_host, placed_work[self.single_experts], minlength=self.chiplets)
        ratios = own / self.speeds
        top = int(ratios.argmax())
        if ratios[top] > best_ratio:
            in_top = np.zeros(self.chiplets, dtype=bool)
            in_top[top] = True
            best_ratio, best_mask = float(own[top]) / float(self.speeds[top]), device_sets.pack(in_top)
        unit = SCALE / total
        self.flow.set_arcs_capacity(self.source_arcs, np.rint(placed_work * unit).astype(np.int64))
        for _ in range(MAX_CUTS):
            sink_caps = np.rint(best_ratio * self.speeds * unit).astype(np.int64)
            self.flow.set_arcs_capacity(self.sink_arcs, sink_caps)
            if self.flow.solve(self.source, self.sink) != SimpleMaxFlow.OPTIMAL:
                raise RuntimeError("OR-Tools max-flow failed on a bottleneck cut")
            side = np.asarray(self.flow.get_source_side_min_cut())
            chosen = side[side < self.placed.size + self.chiplets]
            members = chosen[chosen >= self.placed.size] - self.placed.size
            if members.size == 0:
                break
            in_d = np.zeros(self.chiplets, dtype=bool)
            in_d[members] = True
            confined = ~(self.hosts & ~in_d).any(axis=1)
            ratio = float(placed_work[confined].sum()) / float(self.speeds[in_d].sum())
            if ratio <= best_ratio * (1 + 1e-12):
                break
            best_ratio = ratio
            best_mask = device_sets.pack(in_d)
        return best_ratio, best_mask


def bottlenecks(work: np.ndarray, resident: np.ndarray, speeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(makespans [S], bottleneck sets [S, W]) of scenario unit-speed work [S, E] on `resident` [E, C]."""
    network = Bottlenecks(resident, speeds)
    found = [network.worst(w) for w in work]
    width = device_sets.words(resident.shape[1])
    masks = np.array([m for _, m in found], dtype=np.uint64).reshape(len(found), width)
    return np.array([r for r, _ in found]), masks
