"""The drop-in's local search (balancers/dropin/rebalance.py), vectorised over layers and candidate moves.

Every layer is a row of slots (`phy2log`); GPU g owns slots g·R/G … (g+1)·R/G − 1. A plan is
scored on scenarios, per-step loads normalised so that each step's mean GPU load is 1: the
score is the mean over the steps of the step's largest GPU load, i.e. its max/mean imbalance,
under the engine's dispatch:

* `even` — each expert's tokens split evenly over its replicas (vLLM, SGLang `static`):
  GPU g carries Σ_e n_ge / c_e · w_e (n_ge of e's c_e replicas on g);
* `lp` — the best split of each step (SGLang `--ep-dispatch-algorithm lp`, our fast loop):
  the cut condition of best_split/cut_condition.py, max over GPU sets D of the work confined to D over |D|.
  Sets are enumerated up to `MAX_ENUMERATED_CHIPLETS` GPUs; beyond, each step's bottleneck is
  found by min cut (best_split/min_cut.py) and the search runs on a pool of the sets met so far, checked
  exactly before its result is kept (best_split/pooled.py, the loop the slow loop's search runs too).

Steps are weighted by recency (`step_weights`: halved every `HALF_LIFE` steps back), since a plan
serves the steps after its history. `even` is scored on the steps' weighted moments
(`MomentSearch`: each GPU's expected peak from its load's mean and variance, covariances between
experts included); `lp` on the steps themselves.

The search starts, per layer, from whichever scores best once its moves are paid for: the map in
service (`previous`), EPLB's packing, or `risk_pack`, EPLB's replicas packed again heaviest
first onto the GPU whose load's mean + `risk` standard deviations is least (experts that burst
together end up apart, which EPLB, seeing only sums, cannot do).

Moves stay on one node (hierarchical plans keep EPLB's node packing): swap the experts of two
slots on different GPUs, or give a slot of an expert with a spare replica to the expert of
another slot. A move is kept only if it lowers the layer's objective: score + `move_cost` ×
experts moved relative to `previous` (an expert moved is a replica on a GPU that did not hold
it); moves are scored from the two experts they touch (incremental: the loads, moments or cut
sums of the rest stay).

* `even` (`MomentSearch.descend`): steepest descent. Each pass scores every move of every layer
  (a swap from the two GPUs it changes, O(1) per move), applies each layer's best, then up to
  `EXTRA_MOVES` more of the pass's improving moves that touch other experts, each re-scored on
  the plan as it then is; a layer stops when no move improves it. The best moves come first, so
  a search cut short by the deadline has made the ones worth most. Given `previous`, a move must
  also lower the objective, before its price, on each of two halves of the steps (`half_moments`:
  alternate blocks of `CROSS_BLOCK` steps, beyond most of the steps' autocorrelation): a move
  that only one half asks for fits that half's accidents, and the steps after the plan will not
  ask for it either.
* `lp`: each iteration draws `CANDIDATES` moves per layer aimed at the GPUs in the steps'
  bottlenecks, and `GUIDED` × as many swaps toward the covariance-aware packing (each takes an
  expert from a GPU that holds more of it than the packing to one that holds fewer), scores them
  all at once and applies each layer's best. A layer stops after `PATIENCE` iterations without
  an improving move.

The search stops when every layer has stopped, or when its work budget (`Work`: moves scored,
covariances and cut sums, counted at a typical machine's cost) is spent, so that where it stops
depends on the input alone; a caller's opt-in deadline may stop it sooner. Where a node has more
slots than a pass can score at once (`MAX_NEIGHBOURHOOD`), a layer scores the moves off its
hottest GPUs; the experts' pairwise covariances are held for at most `CROSS_BYTES`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np

from comoe_opt.best_split.cut_condition import (
    MAX_ENUMERATED_CHIPLETS,
    enumerated_makespans,
    inside,
    masks_of,
    set_sizes,
    unit_speed_makespans,
)
from comoe_opt.best_split.even import slot_replicas
from comoe_opt.best_split.pooled import base_pool

CANDIDATES = 96  # moves scored per layer and iteration
SIGNIFICANCE = 1.0  # standard errors of its per-step change a move's gain must exceed
POWER = 1.0
LSE = True
# steps this far back weigh half as much as the newest (None: all alike); the plan serves the
# steps after its history, which resemble the recent ones most (chosen on GPT-OSS windows 1-32
# among None, 128, 64 and 32)
HALF_LIFE: float | None = 64.0
# further candidates per layer and iteration, as a share of CANDIDATES: swaps toward the
# covariance-aware packing (`target`), so that a search from the map in service can take the part
# of a re-pack that pays for its moves (0.5 chosen on GPT-OSS windows 1-32 among 0, 0.25, 0.5)
GUIDED = 0.5
# even, given `previous`: a move must also lower the objective (before its price) on each of two
# halves of the steps, alternate blocks of this many (None: no such check). The steps' loads are
# autocorrelated (GPT-OSS: 0.2 one step apart, 0.06 eight apart), so blocks keep the halves close
# to independent; 1, 4, 8 and 16 were measured (benchmarks/results/dropin.md)
CROSS_BLOCK: int | None = 8
# a call's own half-life (the drop-in's backtest chooses it per call: rebalance.py); unset, HALF_LIFE
_CALL_HALF_LIFE: ContextVar[tuple[float | None] | None] = ContextVar("half_life", default=None)


@contextmanager
def half_life(value: float | None) -> Iterator[None]:
    """Within the block, steps are weighted with half-life `value` (None: all alike) instead of
    `HALF_LIFE`; a context variable, so concurrent calls do not see each other's."""
    token = _CALL_HALF_LIFE.set((value,))
    try:
        yield
    finally:
        _CALL_HALF_LIFE.reset(token)


CROSS_TRIES = 8  # a layer's best improving moves checked on the halves per pass, best first
# bytes of the experts' pairwise covariances held at once (ahead of the rest: 134 MB a layer at
# the drop-in's limit of 4,096 experts; DeepSeek-V3's 58 layers of 256 hold 30 MB)
CROSS_BYTES = 256 * 2**20
MAX_NEIGHBOURHOOD = 2**20  # moves of one layer scored at once (beyond: its hottest GPUs' moves)
# elements of one block of spare slots' gifts ([layers, spare slots, node's slots, GPUs], float32)
GIFT_CELLS = 2**21
CHUNK = 25_000  # moves `descend` scores at once (bounds its memory and its overrun of a deadline)
EXTRA_MOVES = 3  # even: further moves per layer and iteration, each re-scored before it is applied
DRAWS = 128  # normal draws that turn each GPU's load mean and spread into an expected peak (even)
# iterations without an improving move before a layer stops (lp's moves are rarer finds)
PATIENCE = {"even": 3, "lp": 5}
MAX_ITERATIONS = 10_000  # a guard: each applied move lowers the objective, so the search ends anyway


# The search's work, counted in what it takes on a typical machine (nanoseconds of one core of the
# project's 2-core AMD EPYC host, NumPy 2.4, measured on the drop-in's six timing inputs, GPT-OSS and
# DeepSeek-V3 shapes: benchmarks/results/dropin.md). They turn counts into a budget; the count
# itself, not the clock, decides where a search stops.
NS_PER_MOVE = 550.0  # even: one move scored (a swap or a spare slot's gift, halves' checks included)
NS_PER_PAIR_STEP = 0.8  # even: one (expert pair, step) term of a layer's covariances, once per layer
NS_PER_CELL = 5.0  # lp: one (GPU set, step) sum of a candidate, or of an exact best split


class Work:
    """A budget of work (model nanoseconds, the `NS_*` costs) that the search spends as it
    scores, so that where it stops depends on the input alone, never on the machine or its load."""

    def __init__(self, budget: float = float("inf")):
        self.budget, self.used = budget, 0.0
        self.refused = False  # a batch of work was not begun: it would have gone past the budget

    def spend(self, units: float) -> None:
        self.used += units

    def fits(self, units: float) -> bool:
        """Whether `units` more stay within the budget (if not, the budget counts as spent)."""
        self.refused |= self.used + units > self.budget
        return not self.refused

    @property
    def spent(self) -> bool:
        return self.refused or self.used >= self.budget


@dataclass(frozen=True)
class Shape:
    gpus: int
    nodes: int  # moves stay within a node (1: anywhere)
    dispatch: str  # "even" or "lp"


def normalised(steps: np.ndarray, gpus: int) -> np.ndarray:
    """[layers, S, E] loads with each (layer, step)'s mean GPU load 1 (all-zero steps stay 0)."""
    total = steps.sum(axis=-1, keepdims=True) / gpus
    return np.divide(steps, total, out=np.zeros_like(steps), where=total > 0)


def step_mean(spans: np.ndarray) -> np.ndarray:
    """What the search minimises over a layer's steps (the last axis, oldest first): the mean of
    each step's max/mean GPU load raised to `POWER` (above 1, the worst peaks weigh more), each
    step weighted by `step_weights` (recent steps more)."""
    return np.einsum("...s,s->...", spans.astype(np.float64) ** POWER, step_weights(spans.shape[-1]))


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
    n = slot_replicas(slots, w.shape[-1], shape.gpus)
    return np.stack([unit_speed_makespans(n[layer] > 0, w[layer]) for layer in range(w.shape[0])])


def even_loads(slots: np.ndarray, w: np.ndarray, gpus: int) -> np.ndarray:
    """[layers, S, G] GPU loads when each expert's load is split evenly over its replicas (a
    gather and a sum: no BLAS call, whose threads contend on a loaded host)."""
    layers, replicas = slots.shape
    count = np.zeros((layers, w.shape[-1]), dtype=w.dtype)
    np.add.at(count, (np.arange(layers)[:, None], slots), 1)
    share = w / np.maximum(count, 1)[:, None, :]
    per_slot = np.take_along_axis(share, slots[:, None, :], axis=2)  # [layers, S, slots]
    return per_slot.reshape(layers, w.shape[1], gpus, replicas // gpus).sum(axis=-1)


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


_MOVE_FIELDS = ("e", "f", "gi", "gj", "swap", "i", "j", "na", "nb", "valid")


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
        target: np.ndarray | None = None,
    ):
        self.slots = slots.copy()
        self.shape, self.rng = shape, rng
        self.layers, self.steps, self.experts = w.shape
        self._keep_steps(w)
        self.per_gpu = slots.shape[1] // shape.gpus
        self.per_node = slots.shape[1] // shape.nodes
        self.n = slot_replicas(self.slots, self.experts, shape.gpus)
        self.target_n = None if target is None else slot_replicas(target, self.experts, shape.gpus)
        self.prev = prev  # [layers, E, G] or None
        self.move_cost = move_cost
        self.significance = SIGNIFICANCE if significance is None else significance
        self.sets: list[np.ndarray] = [] if pools is None else pools
        self.per_step = np.zeros((self.layers, self.steps))  # each step's current makespan
        self.gpu_rows = np.zeros((0, shape.gpus, self.steps), dtype=np.float32)  # even: loads
        self.in_sets: list[np.ndarray] = []  # lp: [S, sets] work confined to each set
        self._reset_scores()
        self.start_objective = self.objective.copy()
        self.applied = 0
        self.work = Work()  # the caller's budget replaces it

    # -------------------------------------------------------------- state

    def _keep_steps(self, w: np.ndarray) -> None:
        w = w.astype(np.float32)  # half the memory traffic; the result is checked in float64
        self.w, self.wt = w, np.ascontiguousarray(w.transpose(0, 2, 1))

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
        return masks_of(self.n[layer] > 0)

    def _pool_score(self, layer: int, in_sets: np.ndarray) -> np.ndarray:
        return (in_sets / set_sizes(self.sets[layer], self.shape.gpus)).max(axis=-1)

    @property
    def enumerated(self) -> bool:
        return self.shape.gpus <= MAX_ENUMERATED_CHIPLETS

    def _lp_layer(self, layer: int) -> np.ndarray:
        """Refresh the layer's pool sums; its per-step makespans: exact when the sets can be
        enumerated (each step's bottleneck joins the pool), else on the pool."""
        if self.enumerated:
            self._spendenumerated_makespans()
            spans, worst = enumerated_makespans(self.masks(layer), self.w[layer], self.shape.gpus)
            self.sets[layer] = np.union1d(self.sets[layer], worst)
        self.in_sets[layer] = self.w[layer] @ inside(self.masks(layer), self.sets[layer], np.float32)
        return spans if self.enumerated else self._pool_score(layer, self.in_sets[layer])

    def _exact_gain(self, c: _Candidates, row: int, k: int) -> bool:
        """lp on enumerable GPUs: whether the move lowers the exact objective; if not, the steps'
        bottlenecks under it join the pool, so that the pool stops proposing it."""
        layer = int(c.layer[row])
        masks = self.masks(layer)
        bits = np.int64(1) << np.arange(self.shape.gpus, dtype=np.int64)
        masks[c.e[row, k]], masks[c.f[row, k]] = (c.na[row, k] > 0) @ bits, (c.nb[row, k] > 0) @ bits
        self._spendenumerated_makespans()
        spans, worst = enumerated_makespans(masks, self.w[layer], self.shape.gpus)
        prev = None if self.prev is None else self.prev[layer]
        n = self.n[layer].copy()
        n[c.e[row, k]], n[c.f[row, k]] = c.na[row, k], c.nb[row, k]
        value = step_mean(spans) + self.move_cost * moved(n, prev)
        if value < self.objective[layer] - 1e-9 * max(1.0, abs(self.objective[layer])):
            return True
        self.sets[layer] = np.union1d(self.sets[layer], worst)
        self.in_sets[layer] = self.w[layer] @ inside(self.masks(layer), self.sets[layer], np.float32)
        return False

    def _spendenumerated_makespans(self) -> None:
        """One exact best split of a layer's steps: every GPU set's sum built in G passes."""
        if hasattr(self, "work"):  # the start's scores are not the search's
            self.work.spend(NS_PER_CELL * (1 << self.shape.gpus) * self.steps * (self.shape.gpus + 1))

    # -------------------------------------------------------------- moves

    def _draw(self, active: np.ndarray) -> _Candidates:
        """K candidate moves for each active layer, slot i on a GPU drawn by its share of peaks."""
        b, gpus = active.size, self.shape.gpus
        k = CANDIDATES
        rng = self.rng
        hot = self._peak_shares(active)  # [B, G]
        gi = (rng.random((b, k, 1)) > np.cumsum(hot, axis=1)[:, None, :]).sum(axis=2)
        gi = np.minimum(gi, gpus - 1)
        i = gi * self.per_gpu + rng.integers(self.per_gpu, size=(b, k))
        j = (i // self.per_node) * self.per_node + rng.integers(self.per_node, size=(b, k))
        swap = rng.random((b, k)) < 0.5
        found = np.ones((b, k), dtype=bool)
        if self.target_n is not None and GUIDED:
            ig, jg, has = self._toward_target(active, max(1, int(k * GUIDED)))
            i, j = np.concatenate([i, ig], axis=1), np.concatenate([j, jg], axis=1)
            swap = np.concatenate([swap, np.ones(ig.shape, dtype=bool)], axis=1)
            found = np.concatenate([found, has], axis=1)
            k = i.shape[1]
        return self._moves(active, i, j, swap, found)

    def _moves(
        self,
        active: np.ndarray,
        i: np.ndarray,
        j: np.ndarray,
        swap: np.ndarray,
        found: np.ndarray,
        counts: bool = True,
    ) -> _Candidates:
        """The moves [B, K] of slots i and j (swap, else i's expert becomes j's) in the layers;
        without `counts`, the experts' replicas per GPU after each move are left to `_counted`."""
        gi, gj = i // self.per_gpu, j // self.per_gpu
        rows = active[:, None]
        e, f = self.slots[rows, i], self.slots[rows, j]
        count_e = self.n[active].sum(axis=-1)[np.arange(active.size)[:, None], e]
        valid = found & (e != f) & np.where(swap, gi != gj, count_e >= 2)
        none = np.zeros((*i.shape, 0), dtype=np.int64)
        c = _Candidates(active, e, f, gi, gj, swap, i, j, none, none, valid)
        return self._counted(c) if counts else c

    def _counted(self, c: _Candidates) -> _Candidates:
        """`c` with e's and f's replicas per GPU after each move (na, nb)."""
        if c.na.shape[-1]:
            return c
        b, k = c.e.shape
        rows = c.layer[:, None]
        na, nb = self.n[rows, c.e], self.n[rows, c.f]  # fancy indexing: copies
        bi, ki = np.meshgrid(np.arange(b), np.arange(k), indexing="ij")
        na[bi, ki, c.gi] -= 1
        nb[bi, ki, c.gi] += 1
        na[bi, ki, c.gj] += c.swap
        nb[bi, ki, c.gj] -= c.swap
        return _Candidates(c.layer, c.e, c.f, c.gi, c.gj, c.swap, c.i, c.j, na, nb, c.valid)

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

    def _peak_shares(self, active: np.ndarray) -> np.ndarray:
        """[B, G] how often each GPU carries a step's peak (even) or is in its bottleneck (lp)."""
        gpus = self.shape.gpus
        if self.shape.dispatch == "even":
            peaks = self.gpu_rows[active].argmax(axis=1)  # [B, S]
            share = (peaks[..., None] == np.arange(gpus)).sum(axis=1).astype(np.float64)
        else:
            share = np.zeros((active.size, gpus))
            for row, layer in enumerate(active):
                ratio = self.in_sets[layer] / set_sizes(self.sets[layer], gpus)
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
        score = self._pessimistic(spans, c.layer) + self._move_costs(c)
        return np.where(c.valid, score, np.inf)

    def _move_costs(self, c: _Candidates) -> np.ndarray:
        """[B, K] `move_cost` times the experts each candidate leaves moved off `prev`."""
        if self.prev is None:
            return np.zeros(c.e.shape)
        rows, prev = c.layer[:, None], self.prev

        def change(expert: np.ndarray, gpu: np.ndarray, step: int) -> np.ndarray:
            held, kept = self.n[rows, expert, gpu], prev[rows, expert, gpu]
            return np.maximum(held + step - kept, 0) - np.maximum(held - kept, 0)

        # only e's and f's replicas on GPUs gi and gj change
        delta = change(c.e, c.gi, -1) + change(c.f, c.gi, 1)
        delta += np.where(c.swap, change(c.e, c.gj, 1) + change(c.f, c.gj, -1), 0)
        return self.move_cost * (moved(self.n[c.layer], self.prev[c.layer])[:, None] + delta)

    def _pessimistic(self, spans: np.ndarray, layers: np.ndarray) -> np.ndarray:
        """[B, K] each candidate's mean per-step score plus `self.significance` standard errors of
        its per-step change: a move must gain more than the steps' noise can explain, which is
        what keeps the plan from fitting the history's accidents."""
        p = step_weights(spans.shape[-1])
        current = self.per_step[layers] ** POWER
        change = spans.astype(np.float64) ** POWER - current[:, None, :]
        gain = np.einsum("...s,s->...", change, p)
        score = np.einsum("bs,s->b", current, p)[:, None] + gain
        if self.significance > 0 and spans.shape[-1] > 1:  # the weighted mean's standard error
            spread = np.einsum("...s,s->...", (change - gain[..., None]) ** 2, p)
            spread *= spans.shape[-1] / (spans.shape[-1] - 1)
            score += self.significance * np.sqrt(spread * (p**2).sum())
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
        self.work.spend(NS_PER_CELL * b * c.e.shape[1] * width * self.steps)
        loads = work[:, None] + self.wt[rows, c.e][:, :, None, :] * changes[0]  # [B, K, P, S]
        loads += self.wt[rows, c.f][:, :, None, :] * changes[1]
        loads /= set_sizes(sets.ravel(), gpus).reshape(b, 1, width, 1)
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
            active = np.flatnonzero(idle < PATIENCE[self.shape.dispatch])
            if active.size == 0:
                return False
            if expired() or self.work.spent:
                return True
            c = self._draw(active)
            objective = self._candidate_objectives(c)
            best = objective.argmin(axis=1)
            current = self.objective[active]
            better = _lower(objective[np.arange(active.size), best], current)
            if self.shape.dispatch == "lp" and self.enumerated:
                for row in np.flatnonzero(better):
                    better[row] = self._exact_gain(c, int(row), int(best[row]))
            better, best = self._confirmed(c, objective, current, better, best)
            self._apply_all(c, np.flatnonzero(better), best[better])
            self._more_moves(c, objective, current, better, best)
            idle[active] = np.where(better, 0, idle[active] + 1)
        return False

    def _apply_all(self, c: _Candidates, rows: np.ndarray, ks: np.ndarray) -> None:
        for row, k in zip(rows.tolist(), ks.tolist(), strict=True):
            self._apply(c, row, k)

    def _more_moves(
        self, c: _Candidates, objective: np.ndarray, current: np.ndarray, better: np.ndarray, best: np.ndarray
    ) -> None:
        """MomentSearch applies more than one move per layer and iteration; this search does not."""

    def neighbourhood_size(self) -> int:
        """Moves `descend` scores per layer and pass (at most; some are not valid moves)."""
        return int(self._neighbourhood(np.zeros(1, dtype=np.int64)).e.shape[1])

    def _neighbourhood(self, layers: np.ndarray) -> _Candidates:
        """Every move of the layers: each swap of two slots on different GPUs of a node, and each
        slot of an expert with a spare replica given to any other slot's expert of its node."""
        si, sj, hot = self._slot_pairs(layers)
        rows = layers[:, None]
        spare = self.n[rows, self.slots[layers]].sum(axis=-1) >= 2  # [B, slots]
        if hot is not None:  # only the hot GPUs' spare slots are given away
            spare &= hot[np.arange(self.slots.shape[1]) // self.per_gpu][None, :]
        width = max(1, int(spare.sum(axis=1).max()))
        ri = np.argsort(~spare, axis=1, kind="stable")[:, :width]  # spare slots first
        has = np.take_along_axis(spare, ri, axis=1)
        node_j = np.arange(self.per_node)[None, None, :]
        rj = (ri // self.per_node * self.per_node)[..., None] + node_j  # [B, width, per_node]
        b = layers.size
        i = np.concatenate([np.tile(si, (b, 1)), np.repeat(ri, self.per_node, axis=1)], axis=1)
        j = np.concatenate([np.tile(sj, (b, 1)), rj.reshape(b, -1)], axis=1)
        swap = np.zeros(i.shape, dtype=bool)
        swap[:, : si.size] = True
        found = np.ones(i.shape, dtype=bool)
        found[:, si.size :] = np.repeat(has, self.per_node, axis=1)
        return self._moves(layers, i, j, swap, found, counts=False)

    def _slot_pairs(self, layers: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(slot i, slot j) of every swap of two slots on different GPUs of a node, and None; a
        single layer whose node has too many slots for that (`MAX_NEIGHBOURHOOD`) gets the swaps
        that take a slot off one of its hottest GPUs (by mean load, ties to the lower GPU), the
        only GPUs whose peak a swap can lower, and those GPUs as a mask."""
        slots_n, per_node, per_gpu = self.slots.shape[1], self.per_node, self.per_gpu
        if 3 * per_node * per_node // 2 * self._gift_weight() <= MAX_NEIGHBOURHOOD or layers.size != 1:
            i, j = np.divmod(np.arange(slots_n * per_node), per_node)
            j += i // per_node * per_node  # j runs over i's node only
            keep = i // per_gpu < j // per_gpu
            return i[keep], j[keep], None
        gpus = self.shape.gpus
        count = max(1, int(MAX_NEIGHBOURHOOD // (per_gpu * per_node * self._gift_weight())))
        load = self._gpu_means(int(layers[0]))
        hot = np.zeros(gpus, dtype=bool)
        hot[np.argsort(-load, kind="stable")[:count]] = True
        i = np.flatnonzero(hot[np.arange(slots_n) // per_gpu])
        j = (i // per_node * per_node)[:, None] + np.arange(per_node)[None, :]
        i = np.broadcast_to(i[:, None], j.shape)
        gi, gj = i // per_gpu, j // per_gpu
        keep = (gi != gj) & (~hot[gj] | (gi < gj))  # a pair of two hot GPUs once
        return i[keep], j[keep], hot

    def _gift_weight(self) -> float:
        """What scoring a spare slot's gift costs, in swaps: it touches every GPU (a swap two),
        and the costs were measured at 8 GPUs."""
        return max(1.0, self.shape.gpus / 8)

    def _scoring_units(self, c: _Candidates) -> float:
        """The moves `c` holds, each gift weighted by `_gift_weight`."""
        gifts = int((~c.swap).sum())
        return c.swap.size - gifts + gifts * self._gift_weight()

    def _gpu_means(self, layer: int) -> np.ndarray:
        """[G] each GPU's mean load over the steps."""
        return self.gpu_rows[layer].mean(axis=-1)

    def _confirmed(
        self, c: _Candidates, objective: np.ndarray, current: np.ndarray, better: np.ndarray, best: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(better, best) once the layers' chosen moves are checked (MomentSearch: on the halves)."""
        return better, best


class MomentSearch(Search):
    """`even` dispatch scored on the steps' moments instead of the steps themselves.

    A GPU's load under the even split is linear in the experts' loads, so its (recency-weighted)
    mean over the steps and its variance (with every covariance between experts: experts that
    burst together should not share a GPU) follow from the experts' means and covariances. The score is the
    expected peak, the mean over `DRAWS` fixed standard normal draws z of max_g (mean_g + sd_g
    z_g): a smooth function of the plan that the steps' accidents move far less than the mean
    of their peaks, which is what a plan should be judged by on the steps that come next. A
    move touches two experts, so its score costs O(GPUs x DRAWS), whatever the history's length.
    """

    next_room: int  # the next room of the covariance cache to reuse, round the ring

    def __init__(
        self,
        *args: object,
        moments: Moments | None = None,
        halves: tuple[Moments, Moments] | None = None,
        few: bool = False,
        **kwargs: object,
    ):
        kwargs["significance"] = 0.0  # the score is smooth: no step-noise penalty
        self.moments = moments
        self.few = few
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        # the same plan scored on each half of the steps, kept in step with it move by move
        self.halves = [self._on(half) for half in (halves or ())]

    def _on(self, moments: Moments) -> MomentSearch:
        """A search of the same plan scored on `moments` (whose steps it takes its shape from)."""
        shape_of = np.broadcast_to(np.float32(0), (self.layers, moments.dev.shape[2], self.experts))
        rng = np.random.default_rng(0)  # it draws no moves
        return MomentSearch(
            self.slots, shape_of, self.shape, self.prev, self.move_cost, rng, moments=moments, few=True
        )

    def _cross_checked(self, c: _Candidates, rows: np.ndarray, ks: np.ndarray) -> np.ndarray:
        """[rows, ...] whether row r's move ks[r, ...] lowers the objective, before its price, on
        every half of the steps (`ks` [rows] or [rows, k])."""
        if not self.halves or rows.size == 0:
            return np.ones(ks.shape, dtype=bool)
        ks2 = ks.reshape(rows.size, -1)
        ok = np.ones(ks2.shape, dtype=bool)
        sub = self._counted(
            _Candidates(c.layer[rows], *(getattr(c, n)[rows[:, None], ks2] for n in _MOVE_FIELDS))
        )
        price: float | np.ndarray = 0.0  # paid on the whole move; the halves judge its gain alone
        if self.prev is not None:
            price = (
                self._move_costs(sub)
                - self.move_cost * moved(self.n[sub.layer], self.prev[sub.layer])[:, None]
            )
        for half in self.halves:
            value = half._candidate_objectives(sub) - price
            current = half.objective[sub.layer][:, None]
            ok &= _lower(value, current)
        return ok.reshape(ks.shape)

    def _confirmed(
        self, c: _Candidates, objective: np.ndarray, current: np.ndarray, better: np.ndarray, best: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each layer's best move among its `CROSS_TRIES` best improving candidates that also
        improve on both halves of the steps (none: the layer has no move this iteration)."""
        if not self.halves or not better.any():
            return better, best
        rows = np.flatnonzero(better)
        order = np.argsort(objective[rows], axis=1, kind="stable")[:, :CROSS_TRIES]  # [b, tries]
        tried = np.take_along_axis(objective[rows], order, axis=1)
        improving = _lower(tried, current[rows, None])
        ok = self._cross_checked(c, rows, order) & improving
        better, best = better.copy(), best.copy()
        better[rows] = ok.any(axis=1)
        best[rows] = order[np.arange(rows.size), ok.argmax(axis=1)]
        return better, best

    def _cross_cost(self, layers: np.ndarray) -> float:
        """The work of the layers' covariances not yet at hand (`_cross`)."""
        if self.cross is None:
            return 0.0
        fresh = int((self.cross_at[np.unique(layers)] < 0).sum())
        return NS_PER_PAIR_STEP * fresh * self.experts**2 * self.steps

    def _cross(self, layers: np.ndarray, e: np.ndarray, f: np.ndarray) -> np.ndarray:
        """Cov(w_e, w_f) (broadcast indices); a search that scores every move keeps each layer's
        pairs from when first asked for, in at most `CROSS_BYTES` (the oldest layer not asked for
        now makes room; all layers fit at the shapes engines use)."""
        if self.cross is not None:
            self._hold_cross(np.unique(layers))
            return np.asarray(self.cross[self.cross_at[layers], e, f])
        return np.asarray((self.dev[layers, e] * self.dev[layers, f]).mean(axis=-1))

    def _hold_cross(self, need: np.ndarray) -> None:
        assert self.cross is not None
        for layer in need[self.cross_at[need] < 0].tolist():
            while True:  # the next room round the ring whose layer is not needed now
                at = self.next_room
                self.next_room = (self.next_room + 1) % self.cross.shape[0]
                old = int(self.held_by[at])
                if old < 0 or old not in need:
                    break
            if old >= 0:
                self.cross_at[old] = -1
            self.cross[at] = np.einsum("es,fs->ef", self.dev[layer], self.dev[layer]) / max(self.steps, 1)
            self.cross_at[layer], self.held_by[at] = at, layer

    def cross_layers(self) -> int:
        """Layers whose covariances are held at once (a batch of layers must not exceed it)."""
        return self.layers if self.cross is None else self.cross.shape[0]

    def _keep_steps(self, w: np.ndarray) -> None:
        if self.moments is None:
            self.moments = step_moments(w)
        self.steps = self.moments.dev.shape[2]  # the deviations' columns (see `step_moments`)

    def _reset_scores(self) -> None:
        assert self.moments is not None
        self.mean, self.dev, self.var_w = self.moments.mean, self.moments.dev, self.moments.var_w
        share = self.n / np.maximum(self.n.sum(axis=-1, keepdims=True), 1)  # [L, E, G]
        self.mu = np.einsum("le,leg->lg", self.mean, share)
        # einsum's own loops, not a BLAS product: BLAS threads contend badly on a shared host
        per_slot = np.take_along_axis(self.dev, self.slots[:, :, None], axis=1)  # [L, slots, S]
        per_slot /= np.take_along_axis(self.n.sum(axis=-1), self.slots, axis=1)[:, :, None]
        centred = per_slot.reshape(self.layers, self.shape.gpus, -1, self.steps).sum(axis=2)  # [L, G, S]
        self.cov = np.einsum("les,lgs->leg", self.dev, centred) / max(self.steps, 1)  # [L, E, G]
        # Cov(w_e, w_f) of every pair, for a search that scores every move (the halves score few)
        rooms = min(self.layers, max(1, CROSS_BYTES // (8 * self.experts**2)))
        self.cross = None if self.few else np.zeros((rooms, self.experts, self.experts))
        self.cross_at = np.full(self.layers, -1, dtype=np.int64)  # each layer's room, -1: none
        self.held_by = np.full(rooms, -1, dtype=np.int64)
        self.next_room = 0
        self.var_g = (centred**2).mean(axis=-1)  # [L, G]
        self.z = np.random.default_rng(0).standard_normal((DRAWS, self.shape.gpus))
        if self.steps == 1:
            self.z = np.zeros((1, self.shape.gpus))  # one step: its peak, exactly
        self.temperatures = temperatures(self.moments, self.shape.gpus)
        self.per_step = self._peaks(self.mu, self.var_g)
        self.objective = step_mean(self.per_step) + self.move_cost * moved(self.n, self.prev)

    def _peaks(self, mu: np.ndarray, var: np.ndarray, layers: np.ndarray | None = None) -> np.ndarray:
        """[..., DRAWS] max over GPUs of mean + sd z, for mu and var [..., G]."""
        if LSE and self.steps > 1:
            return self._lse(mu, var, layers)
        sd = np.sqrt(np.maximum(var, 0.0))
        # [..., G, DRAWS]: the draws innermost, so the max over GPUs runs along contiguous rows
        return (mu[..., None] + sd[..., None] * self.z.T).max(axis=-2)

    def _lse(self, mu: np.ndarray, var: np.ndarray, layers: np.ndarray | None) -> np.ndarray:
        """[L or b, 1] min over temperatures t of t log sum_g exp(mu_g / t + var_g / 2t^2), a bound
        on the expected peak that is smooth and costs O(GPUs) per candidate; the layers' best
        temperatures are kept (`layers`: the rows of mu, all when None)."""
        t = self.temperatures  # [T]
        bound = _lse_at(mu[..., None, :], var[..., None, :], t[:, None])[..., 0]  # [.., T]
        best = bound.argmin(axis=-1)
        if layers is None:
            self.best_t = best
        else:
            self.best_t[layers] = best
        return np.take_along_axis(bound, best[..., None], axis=-1)

    def _gpu_means(self, layer: int) -> np.ndarray:
        return np.asarray(self.mu[layer])

    def _peak_shares(self, active: np.ndarray) -> np.ndarray:
        gpus = self.shape.gpus
        sd = np.sqrt(np.maximum(self.var_g[active], 0.0))
        peaks = (self.mu[active][:, None, :] + sd[:, None, :] * self.z).argmax(axis=-1)  # [B, DRAWS]
        share = (peaks[..., None] == np.arange(gpus)).sum(axis=1).astype(np.float64)
        share += 0.05 * share.sum(axis=1, keepdims=True) / gpus + 1e-12
        return share / share.sum(axis=1, keepdims=True)

    def _changes(
        self, layer: np.ndarray, c: _Candidates, dtype: type = np.float64
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(new mean, new variance) of every GPU's load under each candidate, and the share changes
        (in `dtype`: float32 halves the work of scoring whole neighbourhoods)."""
        rows = layer[:, None]
        ne, nf = self.n[rows, c.e], self.n[rows, c.f]
        ce, cf = ne.sum(-1, keepdims=True).astype(dtype), nf.sum(-1, keepdims=True).astype(dtype)
        keep = c.swap[..., None]  # a swap keeps both replica counts; else e gives f a replica
        da = (
            c.na.astype(dtype) / np.maximum(np.where(keep, ce, ce - 1), 1) - ne.astype(dtype) / ce
        )  # [B, K, G]
        db = c.nb.astype(dtype) / np.where(keep, cf, cf + 1) - nf.astype(dtype) / cf

        def at(x: np.ndarray) -> np.ndarray:
            return x.astype(dtype, copy=False)

        mean_e, mean_f = at(self.mean[rows, c.e])[..., None], at(self.mean[rows, c.f])[..., None]
        mu = at(self.mu[layer])[:, None] + da * mean_e + db * mean_f
        cross = at(self._cross(rows, c.e, c.f))[..., None]
        var_e, var_f = at(self.var_w[rows, c.e])[..., None], at(self.var_w[rows, c.f])[..., None]
        var = da * (da * var_e + 2 * at(self.cov[rows, c.e]) + 2 * db * cross)
        var += db * (db * var_f + 2 * at(self.cov[rows, c.f]))
        var += at(self.var_g[layer])[:, None]
        return mu, var, da, db

    def descend(
        self,
        expired: Callable[[], bool],
        iterations: int | None = None,
        left: Callable[[], float] | None = None,
    ) -> bool:
        """Steepest descent: every move of every active layer scored (the worst layers first), each
        layer's best improving one that the halves confirm applied (and up to `EXTRA_MOVES` more,
        re-scored), until no layer improves, after `iterations` passes, or when the next chunk of
        about `CHUNK` moves would take `self.work` past its budget (the first chunk always runs)
        or `expired()` (an opt-in clock, read before each chunk). With `left` (seconds left of
        that clock), a chunk is not begun when the last one took longer than what is left. True
        when the work budget or the clock cut it short."""
        active = np.arange(self.layers)
        took = 0.0
        for _ in range(MAX_ITERATIONS if iterations is None else min(iterations, MAX_ITERATIONS)):
            if active.size == 0:
                return False
            improved = np.zeros(active.size, dtype=bool)
            active = active[np.argsort(-self.objective[active], kind="stable")]
            per_chunk = max(1, int(CHUNK // (3 * self.per_node**2 // 2 * self._gift_weight())))
            per_chunk = min(per_chunk, self.cross_layers())
            for at in range(0, active.size, per_chunk):
                before = 0.0 if left is None else left()
                if expired() or (left is not None and before < took):
                    return True
                layers = active[at : at + per_chunk]
                c = self._neighbourhood(layers)
                cost = NS_PER_MOVE * self._scoring_units(c) + self._cross_cost(layers)
                if self.work.used > 0 and not self.work.fits(cost):
                    return True
                self.work.spend(cost)
                objective = self._all_objectives(c)
                best = objective.argmin(axis=1)
                current = self.objective[layers]
                better = _lower(objective[np.arange(layers.size), best], current)
                better, best = self._confirmed(c, objective, current, better, best)
                rows = np.flatnonzero(better)
                chosen = self._counted(_one_each(c, rows, best[rows]))
                exact = self._candidate_objectives(chosen)[:, 0]  # float64, and their new moments
                held = _lower(exact, current[rows])  # float32 only chose them
                better[rows[~held]] = False
                self._apply_all(chosen, np.flatnonzero(held), np.zeros(int(held.sum()), dtype=np.int64))
                self._more_moves(c, objective, current, better, best)
                improved[at : at + per_chunk] = better
                if left is not None:
                    took = before - left()
            active = active[improved]
        return False

    def _all_objectives(self, c: _Candidates) -> np.ndarray:
        """[B, K] the objective of each candidate, as `_candidate_objectives` scores it but in
        float32 (to choose by; a chosen move is scored again in float64 before it is applied);
        swaps from the two GPUs they change (the other GPUs' terms of the bound stay), when scored
        by the bound. Sets no moments for `_apply_all`."""
        if not (LSE and self.steps > 1) or not c.swap.any():
            return self._candidate_objectives(self._counted(c))
        out = np.full(c.e.shape, np.inf)
        swaps = np.asarray(c.swap.all(axis=0))  # the neighbourhood's swaps share their columns
        if not swaps.all():  # in blocks of whole spare slots (each a run of a node's slots)
            at = np.flatnonzero(~swaps)
            width = max(1, GIFT_CELLS // (c.layer.size * self.per_node * self.shape.gpus)) * self.per_node
            for first in range(0, at.size, width):
                block = np.zeros(swaps.size, dtype=bool)
                block[at[first : first + width]] = True
                out[:, block] = self._gift_objectives(c, block)
        s = _columns(c, swaps)
        rows, b = s.layer[:, None], np.arange(s.layer.size)[:, None]
        f4 = np.float32
        t = self.temperatures[self.best_t[s.layer]][:, None].astype(f4)  # [B, 1]
        mu, var = self.mu[s.layer].astype(f4), self.var_g[s.layer].astype(f4)  # [B, G]
        top = mu.max(axis=-1, keepdims=True)
        expo = (mu - top) / t + var / (2 * t**2)
        peak = expo.max(axis=-1, keepdims=True)
        total = np.exp(expo - peak).sum(axis=-1, keepdims=True)  # [B, 1]
        count = self.n[s.layer].sum(axis=-1)  # [B, E] replicas of each expert
        a = (1.0 / count[b, s.e]).astype(f4)  # [B, K]
        bf = (1.0 / count[b, s.f]).astype(f4)
        shift = a * self.mean[rows, s.e].astype(f4) - bf * self.mean[rows, s.f].astype(f4)  # e leaves gi
        spread = a**2 * self.var_w[rows, s.e].astype(f4) + bf**2 * self.var_w[rows, s.f].astype(f4)
        spread -= 2 * a * bf * self._cross(rows, s.e, s.f).astype(f4)
        kept = total - np.exp(expo[b, s.gi] - peak) - np.exp(expo[b, s.gj] - peak)  # the other GPUs
        total = np.maximum(kept, 0.0)
        # a swap that loads a GPU far past the current peak overflows float32 to inf: its value is
        # then inf, the move is never taken, and the overflow is no error
        with np.errstate(over="ignore"):
            for g, sign in ((s.gi, -1.0), (s.gj, 1.0)):
                new_mu = mu[b, g] + sign * shift
                cov = a * self.cov[rows, s.e, g].astype(f4) - bf * self.cov[rows, s.f, g].astype(f4)
                new_var = var[b, g] + spread + 2 * sign * cov
                total = total + np.exp((new_mu - top) / t + new_var / (2 * t**2) - peak)
            value = top + t * (peak + np.log(total))
        out[:, swaps] = np.where(s.valid, value + self._move_costs(s), np.inf)
        return out

    def _gift_objectives(self, c: _Candidates, cols: np.ndarray) -> np.ndarray:
        """[B, gifts] in float32: the neighbourhood's gifts (columns `cols`, spare slot i by the
        node's slots j), each expert's terms taken once and broadcast over the other's."""
        b, per, f4 = c.layer.size, self.per_node, np.float32
        at = np.flatnonzero(cols)
        width = at.size // per
        i = c.i[:, at].reshape(b, width, per)[:, :, 0]  # [B, W]: the spare slots
        j = c.j[:, at].reshape(b, width, per)  # [B, W, P]: the node's slots
        if self.shape.nodes == 1:
            j = j[:, :1]  # the same slots for every spare slot
        rows, cube = c.layer[:, None], c.layer[:, None, None]
        e, gi = self.slots[rows, i], i // self.per_gpu  # [B, W]
        f = self.slots[cube, j]  # [B, 1 or W, P]
        ne = self.n[rows, e].astype(f4)  # [B, W, G]
        ce = ne.sum(axis=-1, keepdims=True)
        lose = (np.arange(self.shape.gpus) == gi[..., None]).astype(f4)  # e's replica on gi goes to f
        da = ((ne - lose) / np.maximum(ce - 1, 1) - ne / ce)[:, :, None]  # [B, W, 1, G]
        nf = self.n[cube, f].astype(f4)  # [B, 1 or W, P, G]
        cf = nf.sum(axis=-1, keepdims=True)
        db = nf * (1 / (cf + 1) - 1 / cf) + lose[:, :, None] / (cf + 1)  # [B, W, P, G]
        mean_e = self.mean[rows, e].astype(f4)[..., None, None]
        mean_f = self.mean[cube, f].astype(f4)[..., None]
        mu = self.mu[c.layer].astype(f4)[:, None, None] + da * mean_e + db * mean_f
        var_e = self.var_w[rows, e].astype(f4)[..., None, None]
        var_f = self.var_w[cube, f].astype(f4)[..., None]
        cross = self._cross(cube, e[:, :, None], f).astype(f4)[..., None]  # [B, W, P, 1]
        var = da * (da * var_e + 2 * self.cov[rows, e].astype(f4)[:, :, None] + 2 * db * cross)
        var += db * (db * var_f + 2 * self.cov[cube, f].astype(f4))
        var += self.var_g[c.layer].astype(f4)[:, None, None]
        t = self.temperatures[self.best_t[c.layer]].astype(f4)[:, None, None, None]
        value = _lse_at(mu, var, t)[..., 0]  # [B, W, P]
        if self.prev is not None:
            kept_e, kept_f = self.prev[rows, e, gi][..., None], self.prev[cube, f, gi[..., None]]
            held_e, held_f = self.n[rows, e, gi][..., None], self.n[cube, f, gi[..., None]]
            delta = np.maximum(held_e - 1 - kept_e, 0) - np.maximum(held_e - kept_e, 0)  # [B, W, 1]
            delta = delta + np.maximum(held_f + 1 - kept_f, 0) - np.maximum(held_f - kept_f, 0)
            base = moved(self.n[c.layer], self.prev[c.layer])[:, None, None]
            value = value + self.move_cost * (base + delta)
        return np.where(c.valid[:, at], value.reshape(b, -1), np.inf)

    def _candidate_objectives(self, c: _Candidates, dtype: type = np.float64) -> np.ndarray:
        """[B, K] each candidate's objective; in float64 it also keeps their new moments for
        `_apply_all`."""
        self._last = self._changes(c.layer, c, dtype)  # the chosen moves' new moments, for _apply_all
        if LSE and self.steps > 1:
            # each layer at the temperature that bounds its current plan best: an upper bound on a
            # candidate's bound, exact for the current plan, so an accepted move still lowers it
            t = self.temperatures[self.best_t[c.layer]][:, None, None].astype(dtype)
            score = step_mean(_lse_at(self._last[0], self._last[1], t))
        else:
            score = step_mean(self._peaks(self._last[0], self._last[1]))
        return np.where(c.valid, score + self._move_costs(c), np.inf)

    def _more_moves(
        self, c: _Candidates, objective: np.ndarray, current: np.ndarray, better: np.ndarray, best: np.ndarray
    ) -> None:
        """After each layer's best move: up to `EXTRA_MOVES` more of the iteration's candidates
        that improved on their own and touch none of the experts moved since, each scored again
        on the plan as it now is and applied only if it still lowers the objective (a fraction
        of an iteration's cost each)."""
        if not EXTRA_MOVES or not better.any():
            return
        rows = np.flatnonzero(better)
        touched = np.zeros((rows.size, self.experts), dtype=bool)
        local, first = np.arange(rows.size), best[rows]
        touched[local, c.e[rows, first]] = touched[local, c.f[rows, first]] = True
        alone = _lower(objective[rows], current[rows, None])
        alone[local, first] = False
        for _ in range(EXTRA_MOVES):
            r = np.arange(rows.size)[:, None]
            ok = alone & ~touched[r, c.e[rows]] & ~touched[r, c.f[rows]]
            live = np.flatnonzero(ok.any(axis=1))
            if live.size == 0:
                return
            k = np.where(ok[live], objective[rows[live]], np.inf).argmin(axis=1)
            sub = self._counted(_one_each(c, rows[live], k))
            gain = self._candidate_objectives(sub)[:, 0]
            keep = gain < self.objective[sub.layer] - 1e-12 * np.maximum(1.0, np.abs(gain))
            keep[keep] = self._cross_checked(
                sub, np.flatnonzero(keep), np.zeros(int(keep.sum()), dtype=np.int64)
            )
            keep = np.flatnonzero(keep)
            self._apply_all(sub, keep, np.zeros(keep.size, dtype=np.int64))
            alone[live, k] = False
            kept = live[keep]
            touched[kept, sub.e[keep, 0]] = touched[kept, sub.f[keep, 0]] = True

    def _apply_all(self, c: _Candidates, rows: np.ndarray, ks: np.ndarray) -> None:
        """Every layer's chosen move at once (one per layer, so no two touch the same rows)."""
        if rows.size == 0:
            return
        layers = c.layer[rows]
        mu, var, da, db = (x[rows, ks] for x in self._last)
        e, f, i, j = (x[rows, ks] for x in (c.e, c.f, c.i, c.j))
        for expert, change in ((e, da), (f, db)):
            column = self._cross(layers[:, None], np.arange(self.experts)[None, :], expert[:, None])
            self.cov[layers] += column[:, :, None] * change[:, None, :]
        self.mu[layers], self.var_g[layers] = mu, var
        swap = c.swap[rows, ks]
        self.slots[layers, i] = f
        self.slots[layers[swap], j[swap]] = e[swap]
        self.n[layers, e], self.n[layers, f] = c.na[rows, ks], c.nb[rows, ks]
        self.applied += rows.size
        self.per_step[layers] = self._peaks(mu, var, layers)
        prev = None if self.prev is None else self.prev[layers]
        self.objective[layers] = step_mean(self.per_step[layers]) + self.move_cost * moved(
            self.n[layers], prev
        )
        for half in self.halves:
            sub = _one_each(c, rows, ks)
            half._candidate_objectives(sub)
            half._apply_all(sub, np.arange(rows.size), np.zeros(rows.size, dtype=np.int64))


def _columns(c: _Candidates, keep: np.ndarray) -> _Candidates:
    """The candidates of the columns `keep` (bool [K]) of every row."""
    return _Candidates(c.layer, *(getattr(c, name)[:, keep] for name in _MOVE_FIELDS))


def _one_each(c: _Candidates, rows: np.ndarray, ks: np.ndarray) -> _Candidates:
    """The candidates with one move per row: row r's move ks[r]."""
    return _Candidates(c.layer[rows], *(getattr(c, name)[rows, ks][:, None] for name in _MOVE_FIELDS))


@dataclass(frozen=True)
class Moments:
    """What MomentSearch needs of the steps, whatever the plan: each expert's (recency-weighted)
    mean load [L, E], its deviations from it [L, E, S] and their variance [L, E]."""

    mean: np.ndarray
    dev: np.ndarray  # scaled by sqrt(steps x weight), so that their plain means over steps are weighted
    var_w: np.ndarray


def step_moments(w: np.ndarray, p: np.ndarray | None = None) -> Moments:
    """The moments of normalised steps `w` [layers, S, E] under step weights `p` [S] summing to 1
    (default `step_weights`)."""
    w = w.astype(np.float64)
    steps = w.shape[1]
    p = step_weights(steps) if p is None else p
    mean = np.einsum("lse,s->le", w, p)  # [L, E]
    scale = np.sqrt(steps * p)
    dev = np.ascontiguousarray(((w - mean[:, None, :]) * scale[None, :, None]).transpose(0, 2, 1))
    return Moments(mean, dev, (dev**2).mean(axis=-1))


def half_weights(steps: int, block: int | None = None) -> tuple[np.ndarray, np.ndarray] | None:
    """[steps] step weights of the two halves of the steps, alternate blocks of `block` steps
    (default `CROSS_BLOCK`) counted back from the newest, each weighted by recency as the whole is
    and zero off its half; None when the check is off or the steps make fewer than two blocks each."""
    block = CROSS_BLOCK if block is None else block
    if block is None or steps < 4 * block:
        return None
    side = (np.arange(steps)[::-1] // block) % 2
    p = step_weights(steps)
    a, b = (np.where(side == h, p, 0.0) / p[side == h].sum() for h in (0, 1))
    return a, b


def half_moments(w: np.ndarray, block: int | None = None) -> tuple[Moments, Moments] | None:
    """The moments of the two halves (`half_weights`) of the steps `w` [layers, S, E]."""
    weights = half_weights(w.shape[1], block)
    if weights is None:
        return None
    a, b = (step_moments(w[:, q > 0], q[q > 0]) for q in weights)
    return a, b


def peaks_of_loads(loads: np.ndarray, p: np.ndarray, t: np.ndarray) -> np.ndarray:
    """[layers] the `even` objective from each step's GPU loads [layers, S, G] (`even_loads`)
    under step weights `p` [S] and temperatures `t` (`temperatures` of the same steps' moments):
    what `expected_peaks` gives, without the experts' moments."""
    mu = np.einsum("lsg,s->lg", loads, p)
    var = np.einsum("lsg,s->lg", (loads - mu[:, None]) ** 2, p)
    return _lse_at(mu[..., None, :], var[..., None, :], t[:, None])[..., 0].min(axis=-1)


def step_weights(steps: int) -> np.ndarray:
    """[steps] weights summing to 1, oldest step first, halving every `HALF_LIFE` steps back from
    the newest (all alike when `HALF_LIFE` is None; `half_life` sets it for a block)."""
    override = _CALL_HALF_LIFE.get()
    life = HALF_LIFE if override is None else override[0]
    if life is None or steps <= 1:
        return np.full(steps, 1.0 / max(steps, 1))
    p = 0.5 ** ((steps - 1 - np.arange(steps)) / life)
    return p / p.sum()


def temperatures(moments: Moments, gpus: int) -> np.ndarray:
    """[T] the LSE bound's temperatures, from the steps alone (not the plan), so that every plan
    is scored alike."""
    spread = float(np.sqrt(moments.var_w.sum(axis=-1) / gpus).mean()) or 1.0
    return spread * np.array([0.25, 0.5, 1.0, 2.0, 4.0]) / np.sqrt(2 * np.log(max(gpus, 2)))


def _lse_at(mu: np.ndarray, var: np.ndarray, t: np.ndarray) -> np.ndarray:
    """[..., 1] t log sum_g exp(mu_g / t + var_g / 2t^2) over the last axis (GPUs), for mu and var
    [..., G] and t broadcast to [..., 1]: E[max_g X_g] <= it for Gaussian X_g of those moments."""
    top = mu.max(axis=-1, keepdims=True)
    expo = (mu - top) / t + var / (2 * t**2)
    peak = expo.max(axis=-1, keepdims=True)
    return top + t * (peak + np.log(np.exp(expo - peak).sum(axis=-1, keepdims=True)))


def expected_peaks(slots: np.ndarray, w: np.ndarray, gpus: int, moments: Moments | None = None) -> np.ndarray:
    """[layers] the `even` objective of `slots` on normalised steps `w` [layers, S, E], as
    MomentSearch scores it (`moments`: those of `w`, when already at hand)."""
    moments = step_moments(w) if moments is None else moments
    _, experts, steps = moments.dev.shape
    n = slot_replicas(slots, experts, gpus)
    share = n / np.maximum(n.sum(axis=-1, keepdims=True), 1)  # [L, E, G]
    mu = np.einsum("le,leg->lg", moments.mean, share)
    if steps == 1:
        return mu.max(axis=-1)
    centred = np.einsum("leg,les->lgs", share, moments.dev)
    var = (centred**2).mean(axis=-1)
    t = temperatures(moments, gpus)
    return _lse_at(mu[..., None, :], var[..., None, :], t[:, None])[..., 0].min(axis=-1)


def risk_pack(
    eplb_map: np.ndarray,
    moments: Moments,
    gpus: int,
    nodes: int,
    risk: float,
    prev: np.ndarray | None = None,
    stay: float = 0.0,
) -> np.ndarray:
    """[layers, slots] EPLB's replicas (its counts, its nodes) packed again, heaviest per replica
    first, each onto the GPU with a free slot (on the expert's node) whose load after taking it
    has the least mean + `risk` standard deviations, covariances between experts included."""
    layers, slots = eplb_map.shape
    experts = moments.mean.shape[1]
    per_gpu, per_node = slots // gpus, gpus // nodes
    count = np.zeros((layers, experts), dtype=np.int64)
    np.add.at(count, (np.arange(layers)[:, None], eplb_map), 1)
    share = 1.0 / np.maximum(count, 1)
    items = np.sort(eplb_map, axis=1)  # every replica once; the order below sorts them
    heavy = np.take_along_axis(moments.mean * share, items, axis=1)
    items = np.take_along_axis(items, np.argsort(-heavy, axis=1, kind="stable"), axis=1)
    node_of = np.zeros((layers, experts), dtype=np.int64)  # EPLB's node of each expert
    node_of[np.arange(layers)[:, None], eplb_map] = (np.arange(slots) // (slots // nodes))[None, :]
    gpu_node = np.arange(gpus) // per_node
    mu = np.zeros((layers, gpus))
    var = np.zeros((layers, gpus))
    centred = np.zeros((layers, gpus, moments.dev.shape[2]))  # each GPU's load deviation per step
    free = np.full((layers, gpus), per_gpu)
    out = np.empty_like(eplb_map)
    rows = np.arange(layers)
    steps = max(moments.dev.shape[2], 1)
    held = None if prev is None else prev.copy()  # replicas of `prev` not yet kept
    for t in range(slots):
        e = items[:, t]
        s = share[rows, e]
        dev_e = moments.dev[rows, e]  # [L, S]
        new_var = var + (s**2 * moments.var_w[rows, e])[:, None]
        new_var += 2 * s[:, None] * np.einsum("lgs,ls->lg", centred, dev_e) / steps
        score = mu + (s * moments.mean[rows, e])[:, None] + risk * np.sqrt(np.maximum(new_var, 0.0))
        if held is not None:
            score += stay * (held[rows, e] == 0)
        score[(free == 0) | (gpu_node[None, :] != node_of[rows, e][:, None])] = np.inf
        g = score.argmin(axis=1)
        if held is not None:
            held[rows, e, g] = np.maximum(held[rows, e, g] - 1, 0)
        mu[rows, g] += s * moments.mean[rows, e]
        var[rows, g] = new_var[rows, g]
        centred[rows, g] += s[:, None] * dev_e
        out[rows, g * per_gpu + per_gpu - free[rows, g]] = e
        free[rows, g] -= 1
    return out


def _lower(value: np.ndarray, current: np.ndarray) -> np.ndarray:
    """Where `value` is below `current` by more than round-off (1e-12 relative, at least absolute)."""
    return value < current - 1e-12 * np.maximum(1.0, np.abs(current))
