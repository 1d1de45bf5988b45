"""Balance on scenarios: each sampled micro-batch's makespan under the best routing.

The fast loop routes every micro-batch anew, so what a placement is worth
for balance is the makespan the best routing reaches on each micro-batch,
not on the window's mean load: a spare replica of a bursty expert is worth
nothing on the mean and a great deal on the micro-batches where it bursts.

For one micro-batch with expert work `w_e` (work is splittable over an
expert's replicas R_e; an expert with no replica may run anywhere) and
chiplets of relative speed `v_c` (work on c is `w_e / v_c`), the best
makespan is a cut condition of the transportation problem (Hall's theorem
with capacities):

    z*(w) = max over nonempty chiplet sets D of  Σ_{e : R_e ⊆ D} w_e / Σ_{c ∈ D} v_c

— work that can only go to D must fit in D's capacity, and max-flow/min-cut
says this is also sufficient. Enumerating the 2^C − 1 sets is exact and fast
for C ≤ `MAX_ENUMERATED_CHIPLETS`; beyond, each scenario's maximising set is found by
parametric min cut (best_split/min_cut.py), at any C; when chiplets are not related by one
speed factor each scenario's makespan is a small LP. Sets are rows of bits packed in 64-bit
words (best_split/sets.py), so no chiplet count overflows a machine word.

`z*` is a maximum of linear functions of `w`, hence convex: the mean over
scenarios is at least the makespan of the mean load (Jensen), so every
lower bound of the mean-load objective still bounds the scenario objective.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from comoe_opt.best_split import sets as device_sets
from comoe_opt.best_split.min_cut import bottlenecks
from comoe_opt.best_split.shares import share_lp

MAX_ENUMERATED_CHIPLETS = 12


@dataclass(frozen=True, eq=False)
class CutTable:
    """The chiplet sets D of the cut condition (best_split/sets.py rows) and their capacities
    Σ_{c ∈ D} v_c."""

    sets: np.ndarray  # [P, W] uint64, bit c set when chiplet c is in D; the last is all chiplets
    capacity: np.ndarray  # [P] float64

    @classmethod
    def for_speeds(cls, speeds: np.ndarray) -> CutTable:
        """Every nonempty set, in the order of the integers they stand for (the last is all)."""
        return cls.of_sets(np.arange(1, 1 << speeds.size, dtype=np.uint64)[:, None], speeds)

    @classmethod
    def of_sets(cls, sets: np.ndarray, speeds: np.ndarray) -> CutTable:
        """Some of the sets, whose last must be all chiplets: a pool of the cuts that mattered."""
        sets = np.asarray(sets, dtype=np.uint64)
        return cls(sets, device_sets.unpack(sets, speeds.size) @ speeds)

    @classmethod
    def pool(cls, sets: np.ndarray, speeds: np.ndarray) -> CutTable:
        """The distinct sets of `sets` [P, W], all chiplets appended last."""
        everything = device_sets.everything(speeds.size)
        rows = device_sets.union(np.zeros((0, everything.size), dtype=np.uint64), sets)
        rows = rows[~(rows == everything).all(axis=1)]
        return cls.of_sets(np.concatenate([rows, everything[None]]), speeds)

    @property
    def all_chiplets(self) -> np.ndarray:
        return self.sets[-1]

    def inside(self, masks: np.ndarray) -> np.ndarray:
        """[E, sets] 1.0 where expert e's replica set [E, W] lies inside D (no replica: only D = all)."""
        empty = (masks == 0).all(axis=-1, keepdims=True)
        return device_sets.inside(np.where(empty, self.all_chiplets, masks), self.sets)

    def makespans(self, work_in_sets: np.ndarray) -> np.ndarray:
        """Makespan per scenario from the work confined to each set, [S, sets] → [S]."""
        return (work_in_sets / self.capacity).max(axis=1)


def related_speeds(work: np.ndarray) -> np.ndarray | None:
    """Speeds v [C] with work[..., c] = work[..., 0] / v_c, or None when chiplets are not related."""
    base = work[..., 0]
    positive = base > 0
    if not positive.any():
        return np.ones(work.shape[-1])
    ratio = work[positive] / base[positive][:, None]  # [n, C]: work on c relative to chiplet 0
    if not np.allclose(ratio, ratio[0], rtol=1e-9, atol=0.0) or np.any(ratio[0] <= 0):
        return None
    if not np.allclose(work[~positive], 0.0):
        return None
    return 1.0 / ratio[0]


def speeds_of(work: np.ndarray) -> np.ndarray:
    """`related_speeds` where the caller has checked that the chiplets are related."""
    speeds = related_speeds(work)
    if speeds is None:
        raise ValueError("the chiplets are not related by one speed factor")
    return speeds


def enumerable(work: np.ndarray) -> bool:
    """Whether the cut enumeration applies to scenario work [S, L, E, C]."""
    return work.shape[-1] <= MAX_ENUMERATED_CHIPLETS and related_speeds(work) is not None


def cut_condition_applies(work: np.ndarray) -> bool:
    """Whether makespans are cut ratios over chiplet sets (enumerated or min cut), work [S, L, E, C]."""
    return related_speeds(work) is not None


def layer_makespans(work: np.ndarray, resident: np.ndarray) -> np.ndarray:
    """Best-routing makespan [S] of each scenario of one layer.

    `work` [S, E, C] ms per scenario if all of (e)'s work ran on c;
    `resident` [E, C] the layer's replica map.
    """
    return makespans_at(work, resident, related_speeds(work))


def makespans_at(work: np.ndarray, resident: np.ndarray, speeds: np.ndarray | None) -> np.ndarray:
    """`layer_makespans` with the chiplets' `related_speeds(work)` known (None: not related), for
    a search that scores many replica maps of one layer."""
    if speeds is None:
        return np.array([makespan_lp(w, resident) for w in work])
    if work.shape[-1] > MAX_ENUMERATED_CHIPLETS:
        return bottlenecks(work[..., 0], resident, speeds)[0]
    table = CutTable.for_speeds(speeds)
    return table.makespans(work[..., 0] @ table.inside(masks_of(resident)))


def masks_of(resident: np.ndarray) -> np.ndarray:
    """Replica sets [..., E, W] (best_split/sets.py rows) from a replica map [..., E, C]."""
    return device_sets.pack(resident)


def int_masks(resident: np.ndarray) -> list[int]:
    """Each replica set of a replica map [E, C] as a Python int (bit c: a replica on c), for
    the slow loop's moves: unbounded, so any C."""
    return device_sets.as_ints(device_sets.pack(resident))


def resident_of(masks: np.ndarray, chiplets: int) -> np.ndarray:
    """The replica map [..., E, C] of replica sets [..., E, W], `masks_of`'s inverse."""
    return device_sets.unpack(masks, chiplets)


def inside(masks: np.ndarray, sets: np.ndarray, dtype: type = np.float64) -> np.ndarray:
    """[..., P] 1.0 where the replica set [..., W] lies inside the chiplet set [P, W], in `dtype`
    (the loads' own: a mixed-precision product would copy the loads). An empty set lies inside
    every set: `CutTable.inside` maps it to all chiplets first."""
    return device_sets.inside(masks, sets, dtype)


def makespan_lp(work: np.ndarray, resident: np.ndarray) -> float:
    """The share LP without NoP: every expert's work split over its replicas, each chiplet ≤ z."""
    return share_lp(work, resident)[0]


# ------------------------------------------------ unit speeds (GPUs), the balancers' form


def unit_speed_makespans(resident: np.ndarray, w: np.ndarray) -> np.ndarray:
    """[S] best-split makespans of one layer (`resident` [E, G], `w` [S, E], unit speeds), in
    `w`'s dtype: the balancers' form of `layer_makespans`, which they call on float32 loads for
    every candidate move; `layer_makespans` keeps float64 and related speeds, which the slow
    loop's objective and bounds need."""
    gpus = resident.shape[1]
    if gpus <= MAX_ENUMERATED_CHIPLETS:
        return enumerated_makespans(masks_of(resident), w, gpus)[0]
    return bottlenecks(w, resident, np.ones(gpus))[0]


def unit_speed_bottlenecks(resident: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """([S] best-split makespans, [S, W] bottleneck GPU sets) by min cut (min_cut.py)."""
    return bottlenecks(w, resident, np.ones(resident.shape[1]))


def enumerated_makespans(masks: np.ndarray, w: np.ndarray, gpus: int) -> tuple[np.ndarray, np.ndarray]:
    """([S] exact best-split makespans, [k, 1] the distinct bottleneck sets) over every GPU set,
    for replica sets `masks` [E, 1] (at most `MAX_ENUMERATED_CHIPLETS` GPUs: one word).

    The work confined to each set is a sum over its subsets of the work whose replica set is
    exactly that subset: G passes over [2^G, S] (no matrix product, whose BLAS threads contend
    on a shared host)."""
    work = np.zeros((1 << gpus, w.shape[0]), dtype=w.dtype)
    np.add.at(work, masks[:, 0].astype(np.int64), w.T)
    for bit in range(gpus):
        upper = with_bit(gpus, bit)
        work[upper] += work[upper ^ (1 << bit)]
    every = np.arange(1, 1 << gpus, dtype=np.uint64)[:, None]
    ratio = work[1:] / set_sizes(every).astype(w.dtype)[:, None]
    worst = ratio.argmax(axis=0)
    found = np.unique(worst + 1).astype(np.uint64)[:, None]
    return ratio[worst, np.arange(w.shape[0])].astype(np.float64), found


def with_bit(gpus: int, bit: int) -> np.ndarray:
    """The GPU sets (of `gpus`) that hold GPU `bit`."""
    sets = np.arange(1 << gpus, dtype=np.int64)
    return sets[(sets >> bit) & 1 == 1]


def set_sizes(sets: np.ndarray) -> np.ndarray:
    """[...] how many GPUs each set [..., W] holds (its capacity at unit speeds), float32."""
    return device_sets.sizes(sets).astype(np.float32)
