"""The drop-in's search by steps (its default past `SearchConfig.step_search_gpus` devices):
swaps off each layer's hottest GPU, scored exactly on every step.

At 32-320 GPUs EPLB's packing takes 1-4 us per slot, and the moment search (even_search.py)
spends more than that on its starts alone: the experts' covariances, the covariance-aware packing,
every move of a node scored on them. This search is sized to EPLB's own cost instead. A pass
looks at one GPU per layer, the one that is the peak on the most (recency-weighted) steps, and
scores every swap of one of its slots with a slot of another GPU of its node on every step:
only the hot GPU and the swap's partner change, so a step's new peak is the larger of theirs and
the largest other GPU's load (the step's top three loads hold it). Each layer takes its best swap
where it lowers the layer's objective, the recency-weighted mean of the steps' peaks plus
`move_cost` per expert moved off the map in service, and the layer's loads are updated in place.

Replica counts stay as the start has them (EPLB's, or the map in service's): a swap moves two
experts, never a replica's expert. The passes are bounded by work (`STEP_NS_PER_CELL` per
(layer, swap, step) scored), so the plan is a function of the input alone.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from comoe_opt.balancers.dropin.config import Work
from comoe_opt.balancers.dropin.objective import Shape, moved, step_weights
from comoe_opt.balancers.dropin.timing import StepTimes
from comoe_opt.best_split.even import expert_replicas, slot_replicas

# model nanoseconds of scoring one swap on one step (gathers, three maxima, a weighted sum),
# measured at the scale suite's shapes on the project's 2-core host
STEP_NS_PER_CELL = 7.5
CHUNK_CELLS = 2**18  # (layer, swap, step) cells scored at once: a few float32 arrays stay in cache


def gpu_step_loads(slots: np.ndarray, w_t: np.ndarray, gpus: int) -> np.ndarray:
    """[layers, G, S] each GPU's load on each step under the even split, for `slots`
    [layers, slots] and normalised steps `w_t` [layers, E, S] (experts first: a slot's steps
    are gathered as one contiguous row)."""
    layers = slots.shape[0]
    inverse = 1.0 / np.maximum(expert_replicas(slots, w_t.shape[1]), 1)
    per_slot = w_t[np.arange(layers)[:, None], slots]  # [L, slots, S]
    per_slot *= np.take_along_axis(inverse, slots, 1)[..., None]
    return _per_gpu(per_slot, gpus)


def gpu_step_active(slots: np.ndarray, w_t: np.ndarray, gpus: int, times: StepTimes) -> np.ndarray:
    """[layers, G, S] each GPU's expected active slots on each step (timing.py's activity)."""
    layers = slots.shape[0]
    activity = times.activity(w_t, expert_replicas(slots, w_t.shape[1]))  # [L, E, S]
    return _per_gpu(activity[np.arange(layers)[:, None], slots], gpus)


def step_peaks(slots: np.ndarray, w_t: np.ndarray, gpus: int, times: StepTimes | None) -> np.ndarray:
    """[layers, S] each step's value of `slots`: its max/mean GPU load, or with `times` its
    slowest GPU's time in units of the step's balanced time."""
    loads = gpu_step_loads(slots, w_t, gpus)
    if times is None:
        return loads.max(axis=1)
    return times.value(loads, gpu_step_active(slots, w_t, gpus, times)).max(axis=1)


def _per_gpu(per_slot: np.ndarray, gpus: int) -> np.ndarray:
    """[L, G, S] the sums of `per_slot` [L, slots, S] over each GPU's slots."""
    layers, replicas = per_slot.shape[:2]
    per_gpu = per_slot.reshape(layers, gpus, replicas // gpus, -1)
    out = per_gpu[:, :, 0].copy()
    for k in range(1, per_gpu.shape[2]):  # a few adds of [L, G, S]: a middle-axis sum is slower
        out += per_gpu[:, :, k]
    return out


def step_objective(slots: np.ndarray, w: np.ndarray, p: np.ndarray, gpus: int) -> np.ndarray:
    """[layers] the recency-weighted mean (weights `p` [S]) of each step's max/mean GPU load of
    `slots` [layers, slots] on normalised steps `w` [layers, S, E] under the even split."""
    return gpu_step_loads(slots, w.transpose(0, 2, 1), gpus).max(axis=1) @ p


class StepSearch:
    """Every layer's plan `slots` with each step's GPU loads `loads` [L, G, S] kept exact."""

    def __init__(
        self,
        slots: np.ndarray,
        w: np.ndarray,
        shape: Shape,
        prev_n: np.ndarray | None,
        move_cost: float,
        half_life: float | None,
        work: Work,
        partners: int = 4,
        w_t: np.ndarray | None = None,
        times: StepTimes | None = None,
    ):
        self.slots, self.w, self.shape = slots.copy(), w, shape
        self.layers, replicas = slots.shape
        self.per_gpu = replicas // shape.gpus
        self.node_slots = replicas // shape.nodes
        self.prev_n, self.move_cost, self.work = prev_n, move_cost, work
        self.n = slot_replicas(self.slots, w.shape[-1], shape.gpus)  # [L, E, G]
        self.most_partners = partners
        # [L, E, S]: a slot's steps contiguous (given: the caller's copy)
        self.w_t = np.ascontiguousarray(w.transpose(0, 2, 1)) if w_t is None else w_t
        self.w32 = self.w_t.astype(np.float32)
        self.p = step_weights(w.shape[1], half_life)
        # replicas per expert: swaps never change them
        self.count = np.maximum(expert_replicas(self.slots, w.shape[-1]), 1).astype(np.float64)
        self.loads = gpu_step_loads(self.slots, self.w_t, shape.gpus)  # [L, G, S]
        # with `times`: each slot's expected activity per expert [L, E, S], each GPU's active
        # slots [L, G, S], and what the search minimises, each GPU's time (else its load)
        self.times = times
        self.act32 = None if times is None else times.activity(self.w_t, self.count).astype(np.float32)
        self.active = None if times is None else gpu_step_active(self.slots, self.w_t, shape.gpus, times)
        self.values = self._values()
        self.objective = self.values.max(axis=1) @ self.p + self.price()
        self.start_objective = self.objective.copy()

    def _values(self) -> np.ndarray:
        """[L, G, S] each GPU's value per step: its time with `times`, else its load (the same array)."""
        if self.times is None:
            return self.loads
        assert self.active is not None
        return self.times.value(self.loads, self.active)

    def peaks(self) -> np.ndarray:
        """[L, S] each step's value of the plan (step_peaks')."""
        return self.values.max(axis=1)

    def price(self) -> np.ndarray:
        """[layers] the moves' price of the plan as it is (objective.moved's count)."""
        if self.prev_n is None:
            return np.zeros(self.layers)
        return self.move_cost * moved(self.n, self.prev_n)

    def partners(self) -> int:
        """GPUs a pass pairs with each layer's hot GPU: its node's coolest, at most `partners`."""
        return max(1, min(self.most_partners, self.shape.gpus // self.shape.nodes - 1))

    def pass_cells(self) -> int:
        """(layer, swap, step) cells one pass scores."""
        return self.layers * self.per_gpu**2 * self.partners() * self.w.shape[1]

    def descend(self, expired: Callable[[], bool], passes: int | None) -> bool:
        """Passes until no layer improves, `passes` are made, or the work budget or the clock's cap
        is spent (the first pass always runs); True when cut short."""
        active = np.arange(self.layers)
        done = 0
        while active.size and (passes is None or done < passes):
            cells = active.size * self.pass_cells() // self.layers
            if done and (not self.work.fits(cells * STEP_NS_PER_CELL) or expired()):
                return True
            self.work.spend(cells * STEP_NS_PER_CELL)
            improved = [self._pass(chunk) for chunk in self._chunks(active)]
            active = np.concatenate(improved)
            done += 1
        return False

    def _chunks(self, layers: np.ndarray) -> list[np.ndarray]:
        per_layer = max(1, self.pass_cells() // self.layers)
        size = max(1, CHUNK_CELLS // per_layer)
        return [layers[i : i + size] for i in range(0, layers.size, size)]

    def _pass(self, rows: np.ndarray) -> np.ndarray:
        """Each of `rows`' best swap off its hottest GPU, applied where it improves; the layers
        improved. Swaps are scored in float32 on [B, A, M, P, S] arrays (A: the hot GPU's slots,
        M: partner GPUs, P: their slots), the one taken checked in float64."""
        values, p, gpus, per_gpu = self.values[rows], self.p, self.shape.gpus, self.per_gpu
        b, steps, lay = rows.size, values.shape[2], np.arange(rows.size)
        # Step 1: each layer's hot GPU (the peak on the most weight of steps) and the coolest
        # GPUs of its node (by weighted mean value) as partners
        peak_gpu = values.argmax(axis=1)  # [B, S]
        hot_weight = np.zeros((b, gpus))
        np.add.at(hot_weight, (lay[:, None], peak_gpu), p[None, :])
        hot = hot_weight.argmax(axis=-1)  # [B]
        per_node = gpus // self.shape.nodes
        mean = np.einsum("bgs,s->bg", values, p).reshape(b, self.shape.nodes, per_node)
        mean = mean[lay, hot // per_node]  # [B, per_node]: the hot GPU's node
        mean[lay, hot % per_node] = np.inf
        partner = np.argsort(mean, axis=1, kind="stable")[:, : self.partners()]
        partner += (hot // per_node * per_node)[:, None]  # [B, M] GPUs
        slot_a = hot[:, None] * per_gpu + np.arange(per_gpu)  # [B, A]
        slot_c = partner[:, :, None] * per_gpu + np.arange(per_gpu)  # [B, M, P]
        slots = self.slots[rows]
        e = np.take_along_axis(slots, slot_a, 1)  # [B, A]
        f = np.take_along_axis(slots, slot_c.reshape(b, -1), 1).reshape(slot_c.shape)  # [B, M, P]
        # Step 2: each step's change: the hot GPU gains d = f's share - e's, the partner loses it
        w, count = self.w32[rows], self.count[rows].astype(np.float32)
        share_e = self._shares(w, count, e)  # [B, A, S]
        share_f = self._shares(w, count, f.reshape(b, -1)).reshape(*f.shape, steps)  # [B, M, P, S]
        d = share_f[:, None] - share_e[:, :, None, None]  # [B, A, M, P, S]
        # Step 3: each step's new peak: the two GPUs changed, or the largest of the others
        new_hot, new_partner = self._changed(rows, hot, partner, e, f, d)
        others = values.astype(np.float32)  # [B, G, S]
        others[lay, hot] = -np.inf
        first = others.argmax(axis=1)  # [B, S]: the largest GPU other than the hot one
        first_value = np.take_along_axis(others, first[:, None], 1)[:, 0]
        np.put_along_axis(others, first[:, None], -np.inf, 1)
        second_value = others.max(axis=1)
        rest = np.where(partner[:, :, None] == first[:, None, :], second_value[:, None], first_value[:, None])
        new_peak = np.maximum(new_hot, new_partner, out=new_hot)
        np.maximum(new_peak, rest[:, None, :, None], out=new_peak)
        # Step 4: the moves' price, and each layer's best swap kept where it improves
        gain = np.einsum("bamps,s->bamp", new_peak, p.astype(np.float32)).astype(np.float64)
        gain -= (values.max(axis=1) @ p)[:, None, None, None]
        if self.prev_n is not None:  # a replica costs where it exceeds the map in service's
            hot_b = hot[:, None, None]
            arrive = self._excess(rows, e[:, :, None], partner[:, None, :], 0)[..., None]  # [B, A, M, 1]
            arrive = arrive + self._excess(rows, f, hot_b, 0)[:, None]  # f onto the hot GPU
            leave = self._excess(rows, e, hot[:, None], 1)[:, :, None, None]
            leave = leave + self._excess(rows, f, partner[:, :, None], 1)[:, None]
            gain += self.move_cost * (arrive - leave)
        gain[e[:, :, None, None] == f[:, None]] = np.inf
        flat = gain.reshape(b, -1)
        best = flat.argmin(axis=1)
        better = flat[lay, best] < -1e-9
        ia, im, ip = np.unravel_index(best, gain.shape[1:])
        rows_in = lay[better]
        taken_a = slot_a[rows_in, ia[better]]
        taken_c = slot_c[rows_in, im[better], ip[better]]
        return self._apply(rows[better], taken_a, taken_c)

    def _changed(
        self,
        rows: np.ndarray,
        hot: np.ndarray,
        partner: np.ndarray,
        e: np.ndarray,
        f: np.ndarray,
        d: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """([B, A, M, P, S] the hot GPU's, the partner's) value per step after each swap of a slot
        of `e` [B, A] off `hot` [B] with one of `f` [B, M, P] off `partner` [B, M], the hot GPU
        gaining load `d` [B, A, M, P, S]: their loads, and with `times` their times."""
        lay = np.arange(rows.size)
        loads32 = self.loads[rows].astype(np.float32)  # [B, G, S]
        hot_load = loads32[lay, hot][:, None, None, None]  # [B, 1, 1, 1, S]
        partner_load = np.take_along_axis(loads32, partner[:, :, None], 1)[:, None, :, None]
        if self.times is None:
            return hot_load + d, partner_load - d
        assert self.act32 is not None and self.active is not None
        act = self.act32[rows]  # [B, E, S]: one slot's activity
        gained = self._taken(act, f.reshape(rows.size, -1)).reshape(*f.shape, -1)[:, None]
        gained = gained - self._taken(act, e)[:, :, None, None]  # [B, A, M, P, S]
        active32 = self.active[rows].astype(np.float32)
        hot_active = active32[lay, hot][:, None, None, None]
        partner_active = np.take_along_axis(active32, partner[:, :, None], 1)[:, None, :, None]
        new_hot = self.times.value(hot_load + d, hot_active + gained, rows).astype(np.float32)
        new_partner = self.times.value(partner_load - d, partner_active - gained, rows)
        return new_hot, new_partner.astype(np.float32)

    @staticmethod
    def _taken(w: np.ndarray, experts: np.ndarray) -> np.ndarray:
        """[B, K, S] the rows of `w` [B, E, S] of `experts` [B, K]."""
        return np.take_along_axis(w, experts[:, :, None], 1)

    @staticmethod
    def _shares(w: np.ndarray, count: np.ndarray, experts: np.ndarray) -> np.ndarray:
        """[B, K, S] each step's load of one replica of `experts` [B, K] (`w` [B, E, S])."""
        per_expert = np.take_along_axis(w, experts[:, :, None], 1)
        return per_expert / np.take_along_axis(count, experts, 1)[..., None]

    def _excess(self, rows: np.ndarray, experts: np.ndarray, gpu: np.ndarray, above: int) -> np.ndarray:
        """1 where `experts` [B, ...] hold at least `above` more replicas on `gpu` than the map in
        service did (above=0: one more arriving costs; 1: one leaving saves), else 0."""
        assert self.prev_n is not None
        rows = rows.reshape(-1, *(1,) * (np.ndim(experts) - 1))
        held, before = self.n[rows, experts, gpu], self.prev_n[rows, experts, gpu]
        return (held - before >= above).astype(np.float64)

    def _apply(self, rows: np.ndarray, a: np.ndarray, c: np.ndarray) -> np.ndarray:
        """Swap slots `a` and `c` of layers `rows`, loads updated in float64; a swap that does not
        lower its layer's objective exactly is undone. The layers improved."""
        if rows.size == 0:
            return rows
        hot, partner = a // self.per_gpu, c // self.per_gpu
        e, f = self.slots[rows, a], self.slots[rows, c]
        d = self.w_t[rows, f] / self.count[rows, f][:, None]  # [r, S]: the hot GPU's change
        d -= self.w_t[rows, e] / self.count[rows, e][:, None]
        self.slots[rows, a], self.slots[rows, c] = f, e
        self._count(rows, e, f, hot, partner, 1)
        self._move(rows, hot, partner, d, self._activity_change(rows, e, f))
        value = self.values[rows].max(axis=1) @ self.p + self.price()[rows]
        kept = value < self.objective[rows] - 1e-12 * np.maximum(1.0, self.objective[rows])
        undo = ~kept
        self.slots[rows[undo], a[undo]], self.slots[rows[undo], c[undo]] = e[undo], f[undo]
        self._count(rows[undo], e[undo], f[undo], hot[undo], partner[undo], -1)
        back = self._activity_change(rows[undo], f[undo], e[undo])
        self._move(rows[undo], hot[undo], partner[undo], -d[undo], back)
        self.objective[rows[kept]] = value[kept]
        return rows[kept]

    def _activity_change(self, rows: np.ndarray, e: np.ndarray, f: np.ndarray) -> np.ndarray | None:
        """[r, S] the hot GPU's change of active slots when a slot of `f` [r] replaces one of `e`."""
        if self.times is None:
            return None
        w = np.stack([self.w_t[rows, f], self.w_t[rows, e]], axis=1)  # [r, 2, S]
        count = np.stack([self.count[rows, f], self.count[rows, e]], axis=1)  # [r, 2]
        activity = self.times.activity(w, count, rows)
        return activity[:, 0] - activity[:, 1]

    def _move(
        self, rows: np.ndarray, hot: np.ndarray, partner: np.ndarray, d: np.ndarray, gained: np.ndarray | None
    ) -> None:
        """The hot GPUs gain load `d` [r, S] (and active slots `gained`) from the partners; their
        values follow."""
        self.loads[rows, hot] += d
        self.loads[rows, partner] -= d
        if gained is None or self.times is None:
            return  # the values are the loads
        assert self.active is not None
        self.active[rows, hot] += gained
        self.active[rows, partner] -= gained
        for gpu in (hot, partner):
            self.values[rows, gpu] = self.times.value(self.loads[rows, gpu], self.active[rows, gpu], rows)

    def _count(self, rows, e, f, hot, partner, sign: int) -> None:  # type: ignore[no-untyped-def]
        """The replica counts of a swap of `e` (off `hot`) and `f` (off `partner`), or its undoing."""
        self.n[rows, e, hot] -= sign
        self.n[rows, e, partner] += sign
        self.n[rows, f, partner] -= sign
        self.n[rows, f, hot] += sign
