"""The drop-in's search for `lp` dispatch (SGLang's `--ep-dispatch-algorithm lp`, our fast loop):
each step is served by its best split, scored by the cut condition of best_split/cut_condition.py
(max over GPU sets D of the work confined to D over |D|).

Sets are enumerated up to `MAX_ENUMERATED_CHIPLETS` GPUs (each step's bottleneck joins the layer's
pool, and a move the pool proposes is checked exactly before it is applied); beyond, the search
runs on a pool of the sets met so far and best_split/pooled.py's rounds check its result exactly.

Each iteration draws `candidates` moves per layer aimed at the GPUs in the steps' bottlenecks,
and `guided` × as many swaps toward a target packing (each takes an expert from a GPU that holds
more of it than the target to one that holds fewer), scores them all at once on the steps and
applies each layer's best, if it gains more than `significance` standard errors of its per-step
change. A layer stops after `patience` iterations without an improving move.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from comoe_opt.balancers.dropin.config import DEFAULT, SearchConfig, Work
from comoe_opt.balancers.dropin.objective import Shape, lower, moved, step_mean, step_weights
from comoe_opt.balancers.dropin.search import Candidates, Search
from comoe_opt.best_split import sets as device_sets
from comoe_opt.best_split.cut_condition import (
    MAX_ENUMERATED_CHIPLETS,
    enumerated_makespans,
    inside,
    masks_of,
    set_sizes,
)
from comoe_opt.best_split.even import slot_replicas
from comoe_opt.best_split.pooled import base_pool


class LpSearch(Search):
    """Moves drawn at random toward the bottlenecks, scored on the steps themselves."""

    def __init__(
        self,
        slots: np.ndarray,
        w: np.ndarray,
        shape: Shape,
        prev: np.ndarray | None,
        move_cost: float,
        rng: np.random.Generator,
        *,
        config: SearchConfig = DEFAULT,
        work: Work | None = None,
        pools: list[np.ndarray] | None = None,
        target: np.ndarray | None = None,
    ):
        super().__init__(slots, w.shape[-1], shape, prev, move_cost, config, work)
        self.rng = rng
        self.steps = w.shape[1]
        w = w.astype(np.float32)  # half the memory traffic; the result is checked in float64
        self.w, self.wt = w, np.ascontiguousarray(w.transpose(0, 2, 1))
        self.target_n = None if target is None else slot_replicas(target, self.experts, shape.gpus)
        self.sets = [base_pool(shape.gpus) for _ in range(self.layers)] if pools is None else pools
        self.in_sets: list[np.ndarray] = [np.empty(0)] * self.layers  # [S, sets] work inside each set
        # [E, sets] whether each expert's replicas all lie in each set, kept while the pool holds
        # (past the enumerable GPUs a search's pools are fixed): a move changes two experts' rows
        self.inside: list[np.ndarray | None] = [None] * self.layers
        self.per_step = np.zeros((self.layers, self.steps))  # each step's current makespan
        for layer in range(self.layers):  # the start's scores are not the search's work
            self.per_step[layer] = self._layer_spans(layer, charge=False)
        self.objective = self._objective(np.arange(self.layers))
        self.start_objective = self.objective.copy()

    def _objective(self, layers: np.ndarray) -> np.ndarray:
        return step_mean(self.per_step[layers], self.config.half_life) + self.price(layers)

    # -------------------------------------------------------------- exact scores and pools

    def masks(self, layer: int) -> np.ndarray:
        return masks_of(self.n[layer] > 0)

    @property
    def enumerated(self) -> bool:
        return self.shape.gpus <= MAX_ENUMERATED_CHIPLETS

    def _layer_spans(self, layer: int, charge: bool = True, changed: tuple[int, ...] = ()) -> np.ndarray:
        """Refresh the layer's pool sums; its per-step makespans: exact when the sets can be
        enumerated (each step's bottleneck joins the pool), else on the pool, where only the
        `changed` experts' rows of the layer's `inside` are recomputed (all when none are named)."""
        if self.enumerated:
            spans, worst = self._enumerated(self.masks(layer), layer, charge)
            self.sets[layer] = device_sets.union(self.sets[layer], worst)
            self.inside[layer] = None  # the pool grew
        kept = self.inside[layer]
        if self.enumerated or kept is None or not changed:
            self.in_sets[layer] = self.w[layer] @ self._inside(layer)
        else:  # two experts' rows changed: their columns of the steps' work move in or out of sets
            rows = np.asarray(changed)
            before = kept[rows].copy()
            delta = self._inside(layer, changed)[rows] - before  # [changed, sets]
            self.in_sets[layer] = self.in_sets[layer] + self.w[layer][:, rows] @ delta
        if self.enumerated:
            return spans
        return (self.in_sets[layer] / set_sizes(self.sets[layer])).max(axis=-1)

    def _enumerated(
        self, masks: np.ndarray, layer: int, charge: bool = True
    ) -> tuple[np.ndarray, np.ndarray]:
        """One exact best split of a layer's steps (every GPU set's sum built in G passes)."""
        gpus = self.shape.gpus
        if charge:
            self.work.spend(self.config.ns_per_cell * (1 << gpus) * self.steps * (gpus + 1))
        return enumerated_makespans(masks, self.w[layer], gpus)

    def _exact_gain(self, c: Candidates, row: int, k: int) -> bool:
        """On enumerable GPUs: whether the move lowers the exact objective; if not, the steps'
        bottlenecks under it join the pool, so that the pool stops proposing it."""
        layer = int(c.layer[row])
        masks = self.masks(layer)
        masks[c.e[row, k]], masks[c.f[row, k]] = masks_of(c.na[row, k] > 0), masks_of(c.nb[row, k] > 0)
        spans, worst = self._enumerated(masks, layer)
        prev = None if self.prev is None else self.prev[layer]
        n = self.n[layer].copy()
        n[c.e[row, k]], n[c.f[row, k]] = c.na[row, k], c.nb[row, k]
        value = step_mean(spans, self.config.half_life) + self.move_cost * moved(n, prev)
        if value < self.objective[layer] - 1e-9 * max(1.0, abs(self.objective[layer])):
            return True
        self.sets[layer] = device_sets.union(self.sets[layer], worst)
        self.inside[layer] = None  # the pool grew
        self.in_sets[layer] = self.w[layer] @ self._inside(layer)
        return False

    def _inside(self, layer: int, changed: tuple[int, ...] = ()) -> np.ndarray:
        """[E, sets] of the layer's pool (float32), its `changed` rows recomputed when the rest is
        kept; past the enumerable GPUs each (expert, set) recomputed costs `ns_per_expert_set` of
        the work (below, the exact split's own charge, `_enumerated`, is far larger)."""
        kept = self.inside[layer]
        if kept is None or not changed:
            kept = inside(self.masks(layer), self.sets[layer], np.float32)
            cells = kept.size
        else:
            rows = np.asarray(changed)
            kept[rows] = inside(masks_of(self.n[layer, rows] > 0), self.sets[layer], np.float32)
            cells = rows.size * kept.shape[1]
        if not self.enumerated:
            self.work.spend(self.config.ns_per_expert_set * cells)
        self.inside[layer] = kept
        return kept

    # -------------------------------------------------------------- moves

    def _draw(self, active: np.ndarray) -> Candidates:
        """K candidate moves for each active layer, slot i on a GPU drawn by its share of the
        steps' bottlenecks, and the guided swaps toward the target."""
        b, gpus = active.size, self.shape.gpus
        k = self.config.candidates
        rng = self.rng
        hot = self._bottleneck_shares(active)  # [B, G]
        gi = (rng.random((b, k, 1)) > np.cumsum(hot, axis=1)[:, None, :]).sum(axis=2)
        gi = np.minimum(gi, gpus - 1)
        i = gi * self.per_gpu + rng.integers(self.per_gpu, size=(b, k))
        j = (i // self.per_node) * self.per_node + rng.integers(self.per_node, size=(b, k))
        swap = rng.random((b, k)) < 0.5
        found = np.ones((b, k), dtype=bool)
        if self.target_n is not None and self.config.guided:
            ig, jg, has = self._toward_target(active, max(1, int(k * self.config.guided)))
            i, j = np.concatenate([i, ig], axis=1), np.concatenate([j, jg], axis=1)
            swap = np.concatenate([swap, np.ones(ig.shape, dtype=bool)], axis=1)
            found = np.concatenate([found, has], axis=1)
        return self._moves(active, i, j, swap, found)

    def _toward_target(self, active: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """([B, k] slot i, [B, k] slot j, [B, k] whether found) of swaps that bring the plan closer
        to the target: i holds an expert its GPU has more replicas of than the target gives it, j
        is on a GPU of the same node to which the target gives that expert more (a slot there that
        is itself in excess preferred)."""
        b, gpus, rng = active.size, self.shape.gpus, self.rng
        assert self.target_n is not None
        slots_n = self.slots.shape[1]
        slot_gpu = np.arange(slots_n) // self.per_gpu
        rows = active[:, None]
        held = self.slots[active]  # [B, slots]
        excess = self.n[rows, held, slot_gpu] > self.target_n[rows, held, slot_gpu]  # [B, slots]
        keys = rng.random((b, k, slots_n)) * excess[:, None, :]
        i = keys.argmax(axis=2)
        has = keys.max(axis=2) > 0
        e = held[np.arange(b)[:, None], i]  # [B, k]
        short = self.target_n[rows, e] > self.n[rows, e]  # [B, k, G]
        node = np.arange(gpus) // (self.per_node // self.per_gpu)
        short &= node[None, None, :] == node[i // self.per_gpu][..., None]
        keys = rng.random((b, k, gpus)) * short
        gj = keys.argmax(axis=2)
        has &= keys.max(axis=2) > 0
        on_gj = gj[..., None] * self.per_gpu + np.arange(self.per_gpu)  # [B, k, per_gpu]
        pick = (rng.random(on_gj.shape) + excess[np.arange(b)[:, None, None], on_gj]).argmax(axis=2)
        return i, np.take_along_axis(on_gj, pick[..., None], axis=2)[..., 0], has

    def _bottleneck_shares(self, active: np.ndarray) -> np.ndarray:
        """[B, G] how often each GPU is in a step's bottleneck (every GPU stays drawable)."""
        gpus = self.shape.gpus
        share = np.zeros((active.size, gpus))
        for row, layer in enumerate(active):
            ratio = self.in_sets[layer] / set_sizes(self.sets[layer])
            worst = self.sets[layer][ratio.argmax(axis=1)]  # [S, W]
            share[row] = device_sets.unpack(worst, gpus).sum(axis=0)
        share += 0.05 * share.sum(axis=1, keepdims=True) / gpus + 1e-12
        return share / share.sum(axis=1, keepdims=True)

    # -------------------------------------------------------------- scores

    def _candidate_objectives(self, c: Candidates) -> np.ndarray:
        """[B, K] objective of each candidate (inf when invalid)."""
        spans = self._pool_spans(c)
        score = self._pessimistic(spans, c.layer) + self._move_costs(c)
        return np.where(c.valid, score, np.inf)

    def _pessimistic(self, spans: np.ndarray, layers: np.ndarray) -> np.ndarray:
        """[B, K] each candidate's mean per-step score plus `significance` standard errors of its
        per-step change: a move must gain more than the steps' noise can explain, which is what
        keeps the plan from fitting the history's accidents."""
        p = step_weights(spans.shape[-1], self.config.half_life)
        current = self.per_step[layers]
        change = spans.astype(np.float64) - current[:, None, :]
        gain = np.einsum("...s,s->...", change, p)
        score = np.einsum("bs,s->b", current, p)[:, None] + gain
        significance = self.config.significance
        if significance > 0 and spans.shape[-1] > 1:  # the weighted mean's standard error
            spread = np.einsum("...s,s->...", (change - gain[..., None]) ** 2, p)
            spread *= spans.shape[-1] / (spans.shape[-1] - 1)
            score += significance * np.sqrt(spread * (p**2).sum())
        return score

    def _pool_spans(self, c: Candidates) -> np.ndarray:
        """[B, K, S] each candidate's per-step makespans on the layers' pools of GPU sets (padded
        with the set of all GPUs, the last of every pool, which changes no maximum)."""
        b, gpus = c.layer.size, self.shape.gpus
        width = max(self.sets[layer].shape[0] for layer in c.layer)
        sets = np.broadcast_to(device_sets.everything(gpus), (b, width, device_sets.words(gpus))).copy()
        work = np.empty((b, width, self.steps), dtype=np.float32)  # [B, P, S]
        for row, layer in enumerate(c.layer):
            size = self.sets[layer].shape[0]
            sets[row, :size] = self.sets[layer]
            work[row, :size] = self.in_sets[layer].T
            work[row, size:] = self.in_sets[layer][:, -1]
        masks = np.stack([self.masks(layer) for layer in c.layer])  # [B, E, W]
        rows, pool = np.arange(b)[:, None], sets[:, None, :, :]  # [B, 1, P, W]
        changes = []
        for expert, after in ((c.e, c.na), (c.f, c.nb)):
            new = masks_of(after > 0)[..., None, :]  # [B, K, 1, W]
            old = masks[rows, expert][..., None, :]
            now_inside = ((new & ~pool) == 0).all(axis=-1)  # [B, K, P]
            was_inside = ((old & ~pool) == 0).all(axis=-1)
            changes.append((now_inside.astype(np.float32) - was_inside)[..., None])
        self.work.spend(self.config.ns_per_cell * b * c.e.shape[1] * width * self.steps)
        loads = work[:, None] + self.wt[rows, c.e][:, :, None, :] * changes[0]  # [B, K, P, S]
        loads += self.wt[rows, c.f][:, :, None, :] * changes[1]
        loads /= set_sizes(sets).reshape(b, 1, width, 1)
        return loads.max(axis=2)

    def _apply(self, c: Candidates, row: int, k: int) -> None:
        self._place(c, np.array([row]), np.array([k]))
        layer = int(c.layer[row])
        self.per_step[layer] = self._layer_spans(layer, changed=(int(c.e[row, k]), int(c.f[row, k])))
        self.objective[layer] = self._objective(np.array([layer]))[0]

    # -------------------------------------------------------------- driver

    def run(self, expired: Callable[[], bool], iterations: int | None = None) -> bool:
        """Improve until every layer stops, after `iterations` or when `expired()`; True when the
        deadline or the work budget cut it short."""
        idle = np.zeros(self.layers, dtype=np.int64)
        limit = self.config.max_iterations
        for _ in range(limit if iterations is None else min(iterations, limit)):
            active = np.flatnonzero(idle < self.config.patience)
            if active.size == 0:
                return False
            if expired() or self.work.spent:
                return True
            c = self._draw(active)
            objective = self._candidate_objectives(c)
            best = objective.argmin(axis=1)
            better = lower(objective[np.arange(active.size), best], self.objective[active])
            if self.enumerated:
                for found in np.flatnonzero(better).tolist():
                    better[found] = self._exact_gain(c, found, int(best[found]))
            for row in np.flatnonzero(better).tolist():
                self._apply(c, row, int(best[row]))
            idle[active] = np.where(better, 0, idle[active] + 1)
        return False
