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
from comoe_opt.best_split.even import expert_replicas, slot_replicas

# model nanoseconds of scoring one swap on one step (gathers, three maxima, a weighted sum),
# measured at the scale suite's shapes on the project's 2-core host
STEP_NS_PER_CELL = 7.5
CHUNK_CELLS = 2**18  # (layer, swap, step) cells scored at once: a few float32 arrays stay in cache


def gpu_step_loads(slots: np.ndarray, w_t: np.ndarray, gpus: int) -> np.ndarray:
    """[layers, G, S] each GPU's load on each step under the even split, for `slots`
    [layers, slots] and normalised steps `w_t` [layers, E, S] (experts first: a slot's steps
    are gathered as one contiguous row)."""
    layers, replicas = slots.shape
    inverse = 1.0 / np.maximum(expert_replicas(slots, w_t.shape[1]), 1)
    per_slot = w_t[np.arange(layers)[:, None], slots]  # [L, slots, S]
    per_slot *= np.take_along_axis(inverse, slots, 1)[..., None]
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
        self.objective = self.loads.max(axis=1) @ self.p + self.price()
        self.start_objective = self.objective.copy()

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
        loads, p, gpus, per_gpu = self.loads[rows], self.p, self.shape.gpus, self.per_gpu
        b, steps, lay = rows.size, loads.shape[2], np.arange(rows.size)
        # Step 1: each layer's hot GPU (the peak on the most weight of steps) and the coolest
        # GPUs of its node (by weighted mean load) as partners
        peak_gpu = loads.argmax(axis=1)  # [B, S]
        hot_weight = np.zeros((b, gpus))
        np.add.at(hot_weight, (lay[:, None], peak_gpu), p[None, :])
        hot = hot_weight.argmax(axis=-1)  # [B]
        per_node = gpus // self.shape.nodes
        mean = np.einsum("bgs,s->bg", loads, p).reshape(b, self.shape.nodes, per_node)
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
        loads32 = loads.astype(np.float32)  # [B, G, S]
        hot_load = loads32[lay, hot]  # [B, S]
        partner_load = np.take_along_axis(loads32, partner[:, :, None], 1)  # [B, M, S]
        others = loads32.copy()
        others[lay, hot] = -np.inf
        first = others.argmax(axis=1)  # [B, S]: the largest GPU other than the hot one
        first_load = np.take_along_axis(others, first[:, None], 1)[:, 0]
        np.put_along_axis(others, first[:, None], -np.inf, 1)
        second_load = others.max(axis=1)
        rest = np.where(partner[:, :, None] == first[:, None, :], second_load[:, None], first_load[:, None])
        new_peak = np.maximum(hot_load[:, None, None, None] + d, partner_load[:, None, :, None] - d)
        np.maximum(new_peak, rest[:, None, :, None], out=new_peak)
        # Step 4: the moves' price, and each layer's best swap kept where it improves
        gain = np.einsum("bamps,s->bamp", new_peak, p.astype(np.float32)).astype(np.float64)
        gain -= (loads.max(axis=1) @ p)[:, None, None, None]
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
        self.loads[rows, hot] += d
        self.loads[rows, partner] -= d
        value = self.loads[rows].max(axis=1) @ self.p + self.price()[rows]
        kept = value < self.objective[rows] - 1e-12 * np.maximum(1.0, self.objective[rows])
        undo = ~kept
        self.slots[rows[undo], a[undo]], self.slots[rows[undo], c[undo]] = e[undo], f[undo]
        self._count(rows[undo], e[undo], f[undo], hot[undo], partner[undo], -1)
        self.loads[rows[undo], hot[undo]] -= d[undo]
        self.loads[rows[undo], partner[undo]] += d[undo]
        self.objective[rows[kept]] = value[kept]
        return rows[kept]

    def _count(self, rows, e, f, hot, partner, sign: int) -> None:  # type: ignore[no-untyped-def]
        """The replica counts of a swap of `e` (off `hot`) and `f` (off `partner`), or its undoing."""
        self.n[rows, e, hot] -= sign
        self.n[rows, e, partner] += sign
        self.n[rows, f, partner] -= sign
        self.n[rows, f, hot] += sign
