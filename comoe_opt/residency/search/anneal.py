"""Simulated annealing on the balance scenarios, one layer at a time.

The local search of refine.py keeps a move only when it lowers the layer's
objective, and stops in local optima: on GPT-OSS window 13 six searches of
20,000 moves do not improve `exact`'s placement on its worst layer, while
this annealing finds a placement 0.5% better on that layer in 40,000
proposals (formulations/residency.md, "Layer decomposition bound").

Moves are refine.py's two kinds (moves.py: swap and replace, which keep every
chiplet's page count), drawn at random over the layer's replicas; a move that
breaks a lease, a quota, the replica limit or all_resident (`MoveRules`) is
not proposed. A worse move is taken with probability exp(−Δ / T), T falling
linearly from `temperature` times the layer's value to 0; the best layout
seen is kept, so the result is never worse. Each layer's value is
`W · (mean scenario makespan + nearest-replica NoP + misses) + κ · copies`,
exactly the layer's share of the window objective (objective.py), computed
from the cut enumeration (best_split/cut_condition.py) and the per-expert
terms of layer_score.py, as refine.py scores it: only up to 12 chiplets related by
one speed factor; elsewhere the placement is returned unchanged.
"""

from __future__ import annotations

import math
import time

import numpy as np

from comoe_opt.best_split import sets as device_sets
from comoe_opt.best_split.cut_condition import (
    CutTable,
    enumerable,
    int_masks,
    masks_of,
    resident_of,
    speeds_of,
)
from comoe_opt.deadline import Deadline
from comoe_opt.residency.objective import nearest_nop
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.problem import ResidencyProblem
from comoe_opt.residency.search.layer_score import ExpertTerms, SetRows, previous_masks
from comoe_opt.residency.search.moves import MoveRules


def anneal(
    problem: ResidencyProblem,
    placement: Placement,
    *,
    proposals: int,
    seed: int = 0,
    temperature: float = 0.002,
    stop_at: float | None = None,
    deadline: Deadline | None = None,
    fit_to: Deadline | None = None,
) -> Placement:
    """`placement` improved by `proposals` annealing proposals per layer (never worse).

    The count is fixed: the result does not depend on the machine's speed. A `stop_at` (a
    `time.perf_counter()` value) or a `deadline` that passes leaves the layers not yet reached
    as they are; layers are taken from layer `seed` on (cyclically), so that runs with
    successive seeds cut short by a deadline still reach every layer in turn.

    Only with `fit_to` (`exact`'s longer runs under a time limit, which end on it by design) is
    the count a ceiling: each layer gets the proposals that fit its share of `fit_to`'s time left,
    at the pace measured on `fit_to`'s clock, so that one run reaches every layer.
    """
    work = problem.scenario_work_ms
    if work is None or not enumerable(work):
        return placement
    table = CutTable.for_speeds(speeds_of(work))
    resident = placement.resident.copy()
    room = np.array([t.max_pages - int(resident[t.owns].sum()) for t in problem.tenants], dtype=np.int64)
    pace = None if fit_to is None or not math.isfinite(fit_to.limit_s) else _Pace(fit_to)
    for k in range(problem.layers):
        if (stop_at is not None and time.perf_counter() >= stop_at) or (deadline and deadline.expired()):
            break
        layer = (seed + k) % problem.layers
        state = _Layer(problem, table, resident[layer], layer, room)
        count = proposals if pace is None else pace.fitting(state, proposals, problem.layers - k)
        began = 0.0 if pace is None else pace.clock()
        resident[layer] = state.run(np.random.default_rng([seed, layer]), count, temperature)
        if pace is not None:
            pace.record(count, pace.clock() - began)
    return Placement(resident)


class _Pace:
    """Seconds per proposal on a deadline's clock, measured as the layers run: each layer gets the
    proposals that fit its share of the time left (a run cut at the deadline would leave the last
    layers untouched)."""

    CALIBRATION = 32  # proposals timed on a copy of the first layer, before any rate is known

    def __init__(self, deadline: Deadline) -> None:
        self.deadline, self.clock = deadline, deadline.clock
        self.proposals, self.seconds = 0, 0.0

    def record(self, proposals: int, seconds: float) -> None:
        self.proposals, self.seconds = self.proposals + proposals, self.seconds + seconds

    def fitting(self, state: _Layer, proposals: int, layers_left: int) -> int:
        if not self.proposals:  # a throwaway run on a copy: the layer's own run is unchanged
            trial = _Layer(state.p, state.table, state.resident, state.layer, state.room.copy())
            began = self.clock()
            trial.run(np.random.default_rng(0), self.CALIBRATION, 0.0)
            self.record(self.CALIBRATION, self.clock() - began)
        rate = self.seconds / self.proposals
        share = self.deadline.remaining() / layers_left
        return max(0, min(proposals, int(share / max(rate, 1e-9))))


class _Layer:
    """One layer's annealing on replica sets held as bit masks (bit c: a replica on chiplet c).

    A move changes two experts' masks, so the work confined to each chiplet set changes by their
    two rows of the enumeration only (`_Scores`); NoP, misses and copies are per-expert terms
    looked up by mask."""

    def __init__(
        self, problem: ResidencyProblem, table: CutTable, resident: np.ndarray, layer: int, room: np.ndarray
    ):
        self.p, self.table, self.layer, self.room = problem, table, layer, room
        self.work = problem.scenario_work[:, layer, :, 0]  # [S, E] on a unit-speed chiplet
        self.resident = resident.copy()
        self.chiplets = resident.shape[1]
        self.rules = MoveRules.of(problem, layer)
        self.owner = self.rules.owner

    def value(self, resident: np.ndarray) -> float:
        """The layer's share of the window objective, computed afresh."""
        p, layer = self.p, self.layer
        z = float(self.table.makespans(self.work @ self.table.inside(masks_of(resident))).mean())
        miss = float(p.miss_ms[layer][~resident.any(axis=1)].sum())
        prev = previous_masks(p, layer)
        copies = sum((m & ~q).bit_count() for m, q in zip(_masks(resident), prev, strict=True))
        return p.batches * (z + nearest_nop(p, resident, layer) + miss) + p.copy_ms * copies

    def run(self, rng: np.random.Generator, proposals: int, temperature: float) -> np.ndarray:
        """The best layout seen; `room` (the quotas' pages left) is updated to it."""
        state = _Scores(self, _masks(self.resident))
        slots = [int(i) for i in np.flatnonzero(self.resident)]  # replicas as e·C + c, row-major
        room = self.room.copy()
        best, best_value = list(state.masks), state.value
        start_t = temperature * max(abs(state.value), 1e-12)
        for k in range(proposals):
            if not slots:
                break
            move = self._propose(rng, state.masks, slots, room)
            if move is None:
                continue
            a, new_a, b, new_b, moved_slots = move
            v = state.value_of(a, new_a, b, new_b)
            t = start_t * (1 - k / proposals)
            if v < state.value or (t > 0 and rng.random() < math.exp(-(v - state.value) / t)):
                state.take()
                for i, slot in moved_slots:
                    slots[i] = slot
                if len(moved_slots) == 1 and self.owner.shape[0]:  # a replace: b's tenants gain a page
                    room -= self.owner[:, b] - self.owner[:, a]
                if v < best_value - 1e-12 * max(1.0, abs(best_value)):
                    best, best_value = list(state.masks), v
        resident = resident_of(device_sets.from_ints(best, device_sets.words(self.chiplets)), self.chiplets)
        self.room[:] = self.room - self.owned_pages(resident) + self.owned_pages(self.resident)
        return resident

    def owned_pages(self, resident: np.ndarray) -> np.ndarray:
        """Pages of each tenant in this layer."""
        return self.owner @ resident.sum(axis=1)

    def _propose(
        self, rng: np.random.Generator, masks: list[int], slots: list[int], room: np.ndarray
    ) -> tuple[int, int, int, int, tuple[tuple[int, int], ...]] | None:
        """A swap or a replace of a random replica that keeps every constraint, as (a, a's new
        mask, b, b's new mask, the slots it rewrites as (index, e·C + c)), or None."""
        C = self.chiplets
        i = int(rng.integers(len(slots)))
        a, c = divmod(slots[i], C)
        bit_c = 1 << c
        if rng.random() < 0.5:  # swap with another replica
            j = int(rng.integers(len(slots)))
            b, d = divmod(slots[j], C)
            if not self.rules.swap_allowed(a, masks[a], c, b, masks[b], d):
                return None
            both = bit_c | (1 << d)
            return a, masks[a] ^ both, b, masks[b] ^ both, ((i, a * C + d), (j, b * C + c))
        b = int(rng.integers(len(masks)))  # replace a's replica on c by one of b
        if not self.rules.replace_allowed(a, masks[a], c, b, masks[b], room):
            return None
        return a, masks[a] & ~bit_c, b, masks[b] | bit_c, ((i, b * C + c),)


class _Scores:
    """The value of a layer's masks, kept up to date as moves are taken. The work confined to
    each chiplet set changes by the two moved experts' rows only; the rows of masks seen are
    kept; NoP per token is looked up per mask. The sums are rebuilt from scratch every `RESYNC`
    moves taken, so round-off cannot build up. A proposal is scored in buffers allocated once
    (it is the annealing's inner loop: most proposals are not taken)."""

    RESYNC = 1000

    def __init__(self, layer: _Layer, masks: list[int]):
        self.layer = layer
        self._row = SetRows(layer.table, per_capacity=True)  # 1 / capacity of the sets holding a mask
        self._terms = ExpertTerms(layer.p, layer.layer)
        self.taken = 0
        scenarios, sets = layer.work.shape[0], layer.table.sets.shape[0]
        self._work = np.empty((scenarios, 2))  # the two moved experts' work, [S, 2]
        self._change = np.empty((2, sets))  # ... and the change of their rows
        self._delta = np.empty((scenarios, sets))
        self._scored = np.empty((scenarios, sets))  # the confined work the last proposal scored
        self._reset(masks)

    def _reset(self, masks: list[int]) -> None:
        self.masks = list(masks)
        self.inside = np.stack([self._row(m) for m in self.masks])  # [E, sets], each over its capacity
        self.confined = self.layer.work @ self.inside  # [S, sets]: the cut ratios
        self.terms = [self._terms(e, m) for e, m in enumerate(self.masks)]
        self.terms_sum = math.fsum(self.terms)
        self.value = self._value(self.confined, self.terms_sum)

    def _value(self, ratios: np.ndarray, other: float) -> float:
        return self.layer.p.batches * float(ratios.max(axis=1).sum()) / ratios.shape[0] + other

    def value_of(self, a: int, new_a: int, b: int, new_b: int) -> float:
        """The value with a's and b's masks changed; `take` then applies it."""
        row_a, row_b = self._row(new_a), self._row(new_b)
        work, change = self._work, self._change
        work[:, 0], work[:, 1] = self.layer.work[:, a], self.layer.work[:, b]
        np.subtract(row_a, self.inside[a], out=change[0])
        np.subtract(row_b, self.inside[b], out=change[1])
        np.matmul(work, change, out=self._delta)
        np.add(self.confined, self._delta, out=self._scored)
        term_a, term_b = self._terms(a, new_a), self._terms(b, new_b)
        other = self.terms_sum - self.terms[a] - self.terms[b] + term_a + term_b
        self._pending = (a, new_a, term_a, b, new_b, term_b, row_a, row_b)
        return self._value(self._scored, other)

    def take(self) -> None:
        """Apply the move `value_of` last scored."""
        a, new_a, term_a, b, new_b, term_b, row_a, row_b = self._pending
        self.masks[a], self.masks[b] = new_a, new_b
        self.taken += 1
        if self.taken % self.RESYNC == 0:
            self._reset(self.masks)
            return
        self.inside[a], self.inside[b] = row_a, row_b
        self.terms[a], self.terms[b] = term_a, term_b
        self.terms_sum = math.fsum(self.terms)
        self.confined, self._scored = self._scored, self.confined  # the scored buffer becomes current
        self.value = self._value(self.confined, self.terms_sum)


def _masks(resident: np.ndarray) -> list[int]:
    return int_masks(resident)
