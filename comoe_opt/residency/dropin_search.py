"""The drop-in's local search (ep_balance.py), vectorised over layers and candidate moves.

Every layer is a row of slots (`phy2log`); GPU g owns slots g·R/G … (g+1)·R/G − 1. A plan is
scored on scenarios, per-step loads normalised so that each step's mean GPU load is 1: the
score is the mean over the steps of the step's largest GPU load, i.e. its max/mean imbalance,
under the engine's dispatch:

* `even` — each expert's tokens split evenly over its replicas (vLLM, SGLang `static`):
  GPU g carries Σ_e n_ge / c_e · w_e (n_ge of e's c_e replicas on g);
* `lp` — the best split of each step (SGLang `--ep-dispatch-algorithm lp`, our fast loop):
  the cut condition of scenarios.py, max over GPU sets D of the work confined to D over |D|.
  Sets are enumerated up to `MAX_ENUMERATED_CHIPLETS` GPUs; beyond, each step's bottleneck is
  found by min cut (closure.py) and the search runs on a pool of the sets met so far, checked
  exactly before its result is kept.

Moves, drawn on the same node (hierarchical plans keep EPLB's node packing): swap the experts of
two slots on different GPUs, or give a slot of an expert with a spare replica to the expert of
another slot. Each iteration draws `CANDIDATES` moves per layer aimed at the GPUs that carry
the steps' peaks, scores them all at once from the two experts they touch (incremental: the
loads or cut sums of the rest stay), and applies each layer's best if it lowers the layer's
objective: score + `move_cost` × experts moved relative to `previous` (an expert moved is a
replica on a GPU that did not hold it). A layer stops after `PATIENCE` iterations without an
improving move; the search stops when every layer has, or at the deadline.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from comoe_opt.residency.scenarios import MAX_ENUMERATED_CHIPLETS

CANDIDATES = 48  # moves scored per layer and iteration
SIGNIFICANCE = 1.0  # standard errors of its per-step change a move's gain must exceed
POWER = 1.0
PATIENCE = 4  # iterations without an improving move before a layer stops
MAX_ITERATIONS = 10_000  # a guard: each applied move lowers the objective, so the search ends anyway
POOL_ROUNDS = 4  # lp above MAX_ENUMERATED_CHIPLETS GPUs: exact checks (and pool growth)


@dataclass(frozen=True)
class Shape:
    gpus: int
    nodes: int  # moves stay within a node (1: anywhere)
    dispatch: str  # "even" or "lp"


def normalised(steps: np.ndarray, gpus: int) -> np.ndarray:
    """[layers, S, E] loads with each (layer, step)'s mean GPU load 1 (all-zero steps stay 0)."""
    total = steps.sum(axis=-1, keepdims=True) / gpus
    return np.divide(steps, total, out=np.zeros_like(steps), where=total > 0)


def replica_counts(slots: np.ndarray, experts: int, gpus: int) -> np.ndarray:
    """[layers, E, G] replicas of each expert on each GPU."""
    layers, slots_n = slots.shape
    gpu = np.arange(slots_n) // (slots_n // gpus)
    n = np.zeros((layers, experts, gpus), dtype=np.int64)
    np.add.at(n, (np.arange(layers)[:, None], slots, gpu[None, :]), 1)
    return n


def step_mean(spans: np.ndarray) -> np.ndarray:
    """What the search minimises over a layer's steps: the mean of each step's max/mean GPU load,
    raised to `POWER` (above 1, the steps with the worst peaks weigh more)."""
    return (spans.astype(np.float64) ** POWER).mean(axis=-1)


def moved(n: np.ndarray, prev: np.ndarray | None) -> np.ndarray:
    """Experts moved per layer: replicas on GPUs that did not hold them (`n`, `prev` [.., E, G])."""
    if prev is None:
        return np.zeros(n.shape[:-2], dtype=np.int64)
    return np.maximum(n - prev, 0).sum(axis=(-2, -1))


# ----------------------------------------------------------------- exact scores


def scores(slots: np.ndarray, w: np.ndarray, shape: Shape) -> np.ndarray:
    """[layers, S] each step's max/mean GPU load under the dispatch (`w` normalised)."""
    if shape.dispatch == "even":
        return even_loads(slots, w, shape.gpus).max(axis=-1)
    n = replica_counts(slots, w.shape[-1], shape.gpus)
    return np.stack([lp_makespans(n[layer] > 0, w[layer]) for layer in range(w.shape[0])])


def even_loads(slots: np.ndarray, w: np.ndarray, gpus: int) -> np.ndarray:
    """[layers, S, G] GPU loads when each expert's load is split evenly over its replicas (a
    gather and a sum: no BLAS call, whose threads contend on a loaded host)."""
    layers, replicas = slots.shape
    count = np.zeros((layers, w.shape[-1]), dtype=w.dtype)
    np.add.at(count, (np.arange(layers)[:, None], slots), 1)
    share = w / np.maximum(count, 1)[:, None, :]
    per_slot = np.take_along_axis(share, slots[:, None, :], axis=2)  # [layers, S, slots]
    return per_slot.reshape(layers, w.shape[1], gpus, replicas // gpus).sum(axis=-1)


def lp_makespans(resident: np.ndarray, w: np.ndarray) -> np.ndarray:
    """[S] best-split makespans of one layer (`resident` [E, G], `w` [S, E], unit speeds)."""
    gpus = resident.shape[1]
    if gpus <= MAX_ENUMERATED_CHIPLETS:
        return _enumerated(_masks(resident), w, gpus)[0]
    from comoe_opt.residency.closure import bottlenecks  # min cut: OR-Tools, loaded only here

    return bottlenecks(w, resident, np.ones(gpus))[0]


def lp_bottlenecks(resident: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """([S] best-split makespans, [S] bottleneck GPU sets as bit masks) by min cut (closure.py)."""
    from comoe_opt.residency.closure import bottlenecks

    spans, masks = bottlenecks(w, resident, np.ones(resident.shape[1]))
    return spans, np.asarray(masks.astype(np.int64))


def base_pool(gpus: int) -> np.ndarray:
    """GPU sets the search scores candidates on from the start: each GPU alone, and all."""
    return np.append(np.int64(1) << np.arange(gpus, dtype=np.int64), np.int64((1 << gpus) - 1))


def _enumerated(masks: np.ndarray, w: np.ndarray, gpus: int) -> tuple[np.ndarray, np.ndarray]:
    """([S] exact best-split makespans, the distinct bottleneck sets) over every GPU set.

    The work confined to each set is a sum over its subsets of the work whose replica set is
    exactly that subset: G passes over [2^G, S] (no matrix product, whose BLAS threads contend
    on a shared host)."""
    work = np.zeros((1 << gpus, w.shape[0]), dtype=w.dtype)
    np.add.at(work, masks, w.T)
    for bit in range(gpus):
        upper = _with_bit(gpus, bit)
        work[upper] += work[upper ^ (1 << bit)]
    ratio = work[1:] / _sizes(np.arange(1, 1 << gpus, dtype=np.int64), gpus).astype(w.dtype)[:, None]
    worst = ratio.argmax(axis=0)
    return ratio[worst, np.arange(w.shape[0])].astype(np.float64), np.unique(worst + 1).astype(np.int64)


def _with_bit(gpus: int, bit: int) -> np.ndarray:
    """The GPU sets (of `gpus`) that hold GPU `bit`."""
    sets = np.arange(1 << gpus, dtype=np.int64)
    return sets[(sets >> bit) & 1 == 1]


def _masks(resident: np.ndarray) -> np.ndarray:
    return resident.astype(np.int64) @ (np.int64(1) << np.arange(resident.shape[-1], dtype=np.int64))


def _inside(masks: np.ndarray, sets: np.ndarray, dtype: type = np.float32) -> np.ndarray:
    """[..., sets] 1.0 where the replica set lies inside the GPU set (in the loads' dtype: a
    mixed-precision product would copy the loads)."""
    return ((masks[..., None] & ~sets) == 0).astype(dtype)


def _sizes(sets: np.ndarray, gpus: int) -> np.ndarray:
    return ((sets[:, None] >> np.arange(gpus, dtype=np.int64)) & 1).sum(axis=1).astype(np.float32)


# ----------------------------------------------------------------- the search


@dataclass
class _Candidates:
    """K moves per active layer: slot i's expert e leaves GPU gi; f is slot j's expert."""

    layer: np.ndarray  # [B]
    e: np.ndarray  # [B, K]
    f: np.ndarray
    gi: np.ndarray
    gj: np.ndarray
    swap: np.ndarray  # bool: swap (else e's slot i becomes f)
    i: np.ndarray
    j: np.ndarray
    na: np.ndarray  # [B, K, G] e's replicas per GPU after the move
    nb: np.ndarray  # f's
    valid: np.ndarray


class Search:
    """All layers' slots, searched together; `run` applies improving moves until done."""

    def __init__(
        self,
        slots: np.ndarray,
        w: np.ndarray,
        shape: Shape,
        prev: np.ndarray | None,
        move_cost: float,
        rng: np.random.Generator,
        pools: list[np.ndarray] | None = None,
        significance: float | None = None,
    ):
        self.slots = slots.copy()
        w = w.astype(np.float32)  # half the memory traffic; the result is checked in float64
        self.w, self.wt, self.shape, self.rng = w, np.ascontiguousarray(w.transpose(0, 2, 1)), shape, rng
        self.layers, self.steps, self.experts = w.shape
        self.per_gpu = slots.shape[1] // shape.gpus
        self.per_node = slots.shape[1] // shape.nodes
        self.n = replica_counts(self.slots, self.experts, shape.gpus)
        self.prev = prev  # [layers, E, G] or None
        self.move_cost = move_cost
        self.significance = SIGNIFICANCE if significance is None else significance
        self.sets: list[np.ndarray] = [] if pools is None else pools
        self.per_step = np.zeros((self.layers, self.steps))  # each step's current makespan
        self.gpu_rows = np.zeros((self.layers, shape.gpus, self.steps), dtype=np.float32)  # even: loads
        self.in_sets: list[np.ndarray] = []  # lp: [S, sets] work confined to each set
        self._reset_scores()
        self.applied = 0

    # -------------------------------------------------------------- state

    def _reset_scores(self) -> None:
        if self.shape.dispatch == "even":
            self.gpu_rows = np.ascontiguousarray(
                even_loads(self.slots, self.w, self.shape.gpus).transpose(0, 2, 1)
            )
            self.per_step = self.gpu_rows.max(axis=1).astype(np.float64)
        else:
            if not self.sets:
                self.sets = [base_pool(self.shape.gpus) for _ in range(self.layers)]
            self.in_sets = [np.empty(0)] * self.layers
            for layer in range(self.layers):
                self.per_step[layer] = self._lp_layer(layer)
        self.objective = step_mean(self.per_step) + self.move_cost * moved(self.n, self.prev)

    def masks(self, layer: int) -> np.ndarray:
        return _masks(self.n[layer] > 0)

    def _pool_score(self, layer: int, in_sets: np.ndarray) -> np.ndarray:
        return (in_sets / _sizes(self.sets[layer], self.shape.gpus)).max(axis=-1)

    @property
    def enumerated(self) -> bool:
        return self.shape.gpus <= MAX_ENUMERATED_CHIPLETS

    def _lp_layer(self, layer: int) -> np.ndarray:
        """Refresh the layer's pool sums; its per-step makespans: exact when the sets can be
        enumerated (each step's bottleneck joins the pool), else on the pool."""
        if self.enumerated:
            spans, worst = _enumerated(self.masks(layer), self.w[layer], self.shape.gpus)
            self.sets[layer] = np.union1d(self.sets[layer], worst)
        self.in_sets[layer] = self.w[layer] @ _inside(self.masks(layer), self.sets[layer])
        return spans if self.enumerated else self._pool_score(layer, self.in_sets[layer])

    def _exact_gain(self, c: _Candidates, row: int, k: int) -> bool:
        """lp on enumerable GPUs: whether the move lowers the exact objective; if not, the steps'
        bottlenecks under it join the pool, so that the pool stops proposing it."""
        layer = int(c.layer[row])
        masks = self.masks(layer)
        bits = np.int64(1) << np.arange(self.shape.gpus, dtype=np.int64)
        masks[c.e[row, k]], masks[c.f[row, k]] = (c.na[row, k] > 0) @ bits, (c.nb[row, k] > 0) @ bits
        spans, worst = _enumerated(masks, self.w[layer], self.shape.gpus)
        prev = None if self.prev is None else self.prev[layer]
        n = self.n[layer].copy()
        n[c.e[row, k]], n[c.f[row, k]] = c.na[row, k], c.nb[row, k]
        value = step_mean(spans) + self.move_cost * moved(n, prev)
        if value < self.objective[layer] - 1e-9 * max(1.0, abs(self.objective[layer])):
            return True
        self.sets[layer] = np.union1d(self.sets[layer], worst)
        self.in_sets[layer] = self.w[layer] @ _inside(self.masks(layer), self.sets[layer])
        return False

    # -------------------------------------------------------------- moves

    def _draw(self, active: np.ndarray) -> _Candidates:
        """K candidate moves for each active layer, slot i on a GPU drawn by its share of peaks."""
        b, k, gpus = active.size, CANDIDATES, self.shape.gpus
        rng = self.rng
        hot = self._peak_shares(active)  # [B, G]
        gi = (rng.random((b, k, 1)) > np.cumsum(hot, axis=1)[:, None, :]).sum(axis=2)
        gi = np.minimum(gi, gpus - 1)
        i = gi * self.per_gpu + rng.integers(self.per_gpu, size=(b, k))
        j = (i // self.per_node) * self.per_node + rng.integers(self.per_node, size=(b, k))
        gj = j // self.per_gpu
        rows = active[:, None]
        e, f = self.slots[rows, i], self.slots[rows, j]
        swap = rng.random((b, k)) < 0.5
        count_e = self.n[rows, e].sum(axis=-1)
        valid = (e != f) & np.where(swap, gi != gj, count_e >= 2)
        na, nb = self.n[rows, e].copy(), self.n[rows, f].copy()
        bi, ki = np.meshgrid(np.arange(b), np.arange(k), indexing="ij")
        na[bi, ki, gi] -= 1
        nb[bi, ki, gi] += 1
        na[bi, ki, gj] += swap
        nb[bi, ki, gj] -= swap
        return _Candidates(active, e, f, gi, gj, swap, i, j, na, nb, valid)

    def _peak_shares(self, active: np.ndarray) -> np.ndarray:
        """[B, G] how often each GPU carries a step's peak (even) or is in its bottleneck (lp)."""
        gpus = self.shape.gpus
        if self.shape.dispatch == "even":
            peaks = self.gpu_rows[active].argmax(axis=1)  # [B, S]
            share = (peaks[..., None] == np.arange(gpus)).sum(axis=1).astype(np.float64)
        else:
            share = np.zeros((active.size, gpus))
            for row, layer in enumerate(active):
                ratio = self.in_sets[layer] / _sizes(self.sets[layer], gpus)
                worst = self.sets[layer][ratio.argmax(axis=1)]
                share[row] = ((worst[:, None] >> np.arange(gpus, dtype=np.int64)) & 1).sum(axis=0)
        share += 0.05 * share.sum(axis=1, keepdims=True) / gpus + 1e-12  # every GPU stays drawable
        return share / share.sum(axis=1, keepdims=True)

    def _candidate_objectives(self, c: _Candidates) -> np.ndarray:
        """[B, K] objective of each candidate (inf when invalid)."""
        rows = c.layer[:, None]
        if self.shape.dispatch == "even":
            old_a = self.n[rows, c.e] / self.n[rows, c.e].sum(-1, keepdims=True)
            old_b = self.n[rows, c.f] / self.n[rows, c.f].sum(-1, keepdims=True)
            da = (c.na / np.maximum(c.na.sum(-1, keepdims=True), 1) - old_a).astype(np.float32)
            db = (c.nb / np.maximum(c.nb.sum(-1, keepdims=True), 1) - old_b).astype(np.float32)
            # [B, K, G, S]: steps innermost, so the max over GPUs runs along contiguous rows
            loads = self.wt[rows, c.e][:, :, None, :] * da[..., None]
            loads += self.wt[rows, c.f][:, :, None, :] * db[..., None]
            loads += self.gpu_rows[c.layer][:, None]
            spans = loads.max(axis=2)  # [B, K, S]
        else:
            spans = self._lp_candidates(c)
        score = self._pessimistic(spans, c.layer)
        if self.prev is not None:
            pa, pb = self.prev[rows, c.e], self.prev[rows, c.f]
            before = np.maximum(self.n[rows, c.e] - pa, 0).sum(-1) + np.maximum(
                self.n[rows, c.f] - pb, 0
            ).sum(-1)
            after = np.maximum(c.na - pa, 0).sum(-1) + np.maximum(c.nb - pb, 0).sum(-1)
            score = score + self.move_cost * (
                moved(self.n[c.layer], self.prev[c.layer])[:, None] + after - before
            )
        return np.where(c.valid, score, np.inf)

    def _pessimistic(self, spans: np.ndarray, layers: np.ndarray) -> np.ndarray:
        """[B, K] each candidate's mean per-step score plus `self.significance` standard errors of
        its per-step change: a move must gain more than the steps' noise can explain, which is
        what keeps the plan from fitting the history's accidents."""
        current = self.per_step[layers] ** POWER
        change = spans.astype(np.float64) ** POWER - current[:, None, :]
        score = current.mean(axis=-1)[:, None] + change.mean(axis=-1)
        if self.significance > 0 and spans.shape[-1] > 1:
            score += self.significance * change.std(axis=-1, ddof=1) / np.sqrt(spans.shape[-1])
        return score

    def _lp_candidates(self, c: _Candidates) -> np.ndarray:
        """[B, K, S] each candidate's per-step makespans on the layers' pools of GPU sets (padded
        with the set of all GPUs, the last of every pool, which changes no maximum)."""
        b, gpus = c.layer.size, self.shape.gpus
        width = max(self.sets[layer].size for layer in c.layer)
        sets = np.full((b, width), (1 << gpus) - 1, dtype=np.int64)
        work = np.empty((b, width, self.steps), dtype=np.float32)  # [B, P, S]
        for row, layer in enumerate(c.layer):
            size = self.sets[layer].size
            sets[row, :size] = self.sets[layer]
            work[row, :size] = self.in_sets[layer].T
            work[row, size:] = self.in_sets[layer][:, -1]
        masks = np.stack([self.masks(layer) for layer in c.layer])
        bits = np.int64(1) << np.arange(gpus, dtype=np.int64)
        rows, pool = np.arange(b)[:, None], sets[:, None, :]
        changes = []
        for expert, after in ((c.e, c.na), (c.f, c.nb)):
            new = ((after > 0).astype(np.int64) @ bits)[..., None]
            old = masks[rows, expert][..., None]
            changes.append((((new & ~pool) == 0).astype(np.float32) - ((old & ~pool) == 0))[..., None])
        loads = work[:, None] + self.wt[rows, c.e][:, :, None, :] * changes[0]  # [B, K, P, S]
        loads += self.wt[rows, c.f][:, :, None, :] * changes[1]
        loads /= _sizes(sets.ravel(), gpus).reshape(b, 1, width, 1)
        return loads.max(axis=2)

    def _apply(self, c: _Candidates, row: int, k: int) -> None:
        layer = int(c.layer[row])
        e, f, i, j = int(c.e[row, k]), int(c.f[row, k]), int(c.i[row, k]), int(c.j[row, k])
        self.slots[layer, i] = f
        if c.swap[row, k]:
            self.slots[layer, j] = e
        if self.shape.dispatch == "even":  # only e's and f's shares change
            old_a = self.n[layer, e] / self.n[layer, e].sum()
            old_b = self.n[layer, f] / self.n[layer, f].sum()
            da = (c.na[row, k] / c.na[row, k].sum() - old_a).astype(np.float32)
            db = (c.nb[row, k] / c.nb[row, k].sum() - old_b).astype(np.float32)
            self.gpu_rows[layer] += da[:, None] * self.wt[layer, e] + db[:, None] * self.wt[layer, f]
            self.per_step[layer] = self.gpu_rows[layer].max(axis=0)
        self.n[layer, e], self.n[layer, f] = c.na[row, k], c.nb[row, k]
        self.applied += 1
        if self.shape.dispatch == "lp":
            self.per_step[layer] = self._lp_layer(layer)
        self.objective[layer] = step_mean(self.per_step[layer]) + self.move_cost * moved(
            self.n[layer], None if self.prev is None else self.prev[layer]
        )

    # -------------------------------------------------------------- driver

    def run(self, expired: Callable[[], bool], iterations: int | None = None) -> bool:
        """Improve until every layer stops, after `iterations` or when `expired()`; True when the
        deadline cut it short."""
        idle = np.zeros(self.layers, dtype=np.int64)
        for _ in range(MAX_ITERATIONS if iterations is None else min(iterations, MAX_ITERATIONS)):
            active = np.flatnonzero(idle < PATIENCE)
            if active.size == 0:
                return False
            if expired():
                return True
            c = self._draw(active)
            objective = self._candidate_objectives(c)
            best = objective.argmin(axis=1)
            for row, layer in enumerate(active):
                value = objective[row, best[row]]
                better = value < self.objective[layer] - 1e-12 * max(1.0, abs(self.objective[layer]))
                if better and self.shape.dispatch == "lp" and self.enumerated:
                    better = self._exact_gain(c, row, int(best[row]))
                if better:
                    self._apply(c, row, int(best[row]))
                    idle[layer] = 0
                else:
                    idle[layer] += 1
        return False
