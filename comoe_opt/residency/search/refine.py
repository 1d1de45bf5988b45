"""Local search on the balance scenarios: swap and replace replicas within a layer.

The replica-count MILP decides how many replicas each expert gets, on the
mean load; *where* they go decides how much work the fast loop can move off
a busy chiplet in each micro-batch. This search improves a placement on the
exact scenario objective (objective.py) with the two moves of moves.py, swap
and replace, which keep every chiplet's page count, so capacity and budget
hold by construction.

A move is kept when it lowers the layer's share of the objective,
`W · (mean scenario makespan + NoP + misses) + κ · copies` (layer_score.py's
per-expert terms, as anneal.py scores it), and it respects leases, quotas,
the replica limit and all_resident (moves.py's `MoveRules`). Each layer's scenario makespans are
kept as the work confined to every chiplet set (best_split/cut_condition.py), updated by
the two experts a move touches; above 12 chiplets, to a pool of sets that
grows with each scenario's min-cut bottleneck (`_pooled_search`, the loop of
best_split/pooled.py that the drop-in's `lp` search runs too). Moves are
drawn from a generator seeded per layer, so a search is deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from comoe_opt.best_split import sets as device_sets
from comoe_opt.best_split.cut_condition import (
    CutTable,
    cut_condition_applies,
    enumerable,
    int_masks,
    masks_of,
    resident_of,
    speeds_of,
)
from comoe_opt.best_split.min_cut import bottlenecks
from comoe_opt.best_split.pooled import POOL_ROUNDS, base_pool, pooled_search
from comoe_opt.deadline import Deadline
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.problem import ResidencyProblem
from comoe_opt.residency.search.layer_score import ExpertTerms, SetRows
from comoe_opt.residency.search.moves import MoveRules


def refine(
    problem: ResidencyProblem, placement: Placement, seed: int = 0, deadline: Deadline | None = None
) -> Placement:
    """`placement` improved by `problem.search_moves` moves per layer (unchanged without scenarios).

    With a `deadline`, checked between moves, the search stops when it passes (never worse than
    `placement`): the result then depends on the machine's speed.
    """
    work = problem.scenario_work_ms
    if work is None or problem.search_moves == 0 or not cut_condition_applies(work):
        return placement
    speeds = speeds_of(work)
    table = CutTable.for_speeds(speeds) if enumerable(work) else None
    resident = placement.resident.copy()
    room = np.array([t.max_pages - int(resident[t.owns].sum()) for t in problem.tenants], dtype=np.int64)
    # each seed starts at another layer, so that searches cut short by a deadline share the layers
    order = np.roll(np.arange(problem.layers), -seed * 7).tolist()
    for started, layer in enumerate(order):
        if deadline is not None and deadline.expired():
            deadline.note(f"search: stopped by the time limit, {started} of {len(order)} layers searched")
            break
        rng = np.random.default_rng([seed, layer])
        if table is None:
            resident[layer] = _pooled_search(problem, speeds, resident[layer], layer, room, rng, deadline)
            continue
        search = _LayerSearch(problem, table, resident[layer], layer, room)
        search.run(rng, problem.search_moves, deadline)
        resident[layer] = search.resident()
    else:
        if deadline is not None and deadline.expired():  # the last layer's moves were cut short
            deadline.note("search: the time limit passed during the last layer's moves")
    return Placement(resident)


def _pooled_search(
    problem: ResidencyProblem,
    speeds: np.ndarray,
    resident: np.ndarray,
    layer: int,
    room: np.ndarray,
    rng: np.random.Generator,
    deadline: Deadline | None = None,
) -> np.ndarray:
    """The layer search on too many chiplets to enumerate their sets: best_split/pooled.py's
    rounds, each a stretch of `search_moves / POOL_ROUNDS` moves, the plan being the layer's
    replicas with the tenants' room they leave. The result is never worse, exactly, than
    `resident`."""
    rounds = _LayerRounds(problem, speeds, layer, rng, deadline)
    (best, best_room), _ = pooled_search(rounds, (resident, room.copy()))
    room[:] = best_room
    return best


_LayerPlan = tuple[np.ndarray, np.ndarray]  # a layer's replicas [E, C], the tenants' room left


@dataclass
class _LayerRounds:
    """The slow loop's pooled rounds: the layer's exact objective, a relative tolerance, a
    stretch cut short by the deadline still checked (the next round is not started)."""

    problem: ResidencyProblem
    speeds: np.ndarray
    layer: int
    rng: np.random.Generator
    deadline: Deadline | None
    check_cut_short: bool = True

    def exact(self, plan: _LayerPlan, pool: CutTable | None) -> tuple[float, CutTable]:
        """The pool's sets are the table's; the exact value is the search's objective with its
        pooled balance term replaced by the min cut's."""
        resident, room = plan
        work = self.problem.scenario_work[:, self.layer, :, 0]
        z, masks = bottlenecks(work, resident, self.speeds)
        base = base_pool(resident.shape[1]) if pool is None else pool.sets
        table = CutTable.pool(np.concatenate([base, masks]), self.speeds)
        search = _LayerSearch(self.problem, table, resident, self.layer, room.copy())
        return search.value - search.balance + self.problem.batches * float(z.mean()), table

    def search(self, plan: _LayerPlan, pool: CutTable) -> tuple[_LayerPlan, bool]:
        search = _LayerSearch(self.problem, pool, plan[0], self.layer, plan[1].copy())
        search.run(self.rng, -(-self.problem.search_moves // POOL_ROUNDS), self.deadline)
        return (search.resident(), search.room), False  # checked anyway; `stop` reads the deadline

    def keep(
        self, best: _LayerPlan, value: float, found: _LayerPlan, found_value: float
    ) -> tuple[_LayerPlan, float]:
        better = found_value < value - 1e-12 * max(1.0, abs(value))
        return (found, found_value) if better else (best, value)

    def stop(self) -> bool:
        return self.deadline is not None and self.deadline.expired()


def popcount(mask: int) -> int:
    return int(mask).bit_count()


@dataclass
class _Move:
    a: int
    b: int
    new_a: int
    new_b: int


class _LayerSearch:
    def __init__(
        self,
        problem: ResidencyProblem,
        table: CutTable,
        resident: np.ndarray,
        layer: int,
        room: np.ndarray,
    ):
        self.p, self.table, self.layer, self.room = problem, table, layer, room
        self.chiplets = resident.shape[1]
        self.work = problem.scenario_work[:, layer, :, 0]  # [S, E] on a unit-speed chiplet
        self.masks = int_masks(resident)  # each expert's replica set, for the moves
        self.packed = masks_of(resident)  # the same [E, W], for the sums over sets
        self.rules = MoveRules.of(problem, layer)
        self.owner = self.rules.owner
        experts = resident.shape[0]
        self._row = SetRows(table)  # each replica set's row of the enumeration, as seen
        self.terms = ExpertTerms(problem, layer)
        self._set_sets(self.work @ table.inside(self.packed))  # [S, sets]
        per_expert = sum(self._expert(e, self.masks[e]) for e in range(experts))
        self.value = self.balance + per_expert
        self.slot_e, self.slot_c = (a.astype(np.int64) for a in np.nonzero(resident))
        demand = (problem.tokens[layer] > 0) | (problem.miss_ms[layer] > 0)
        self.candidates = np.flatnonzero(demand)

    def resident(self) -> np.ndarray:
        return resident_of(self.packed, self.chiplets)

    # -------------------------------------------------------- objective parts

    def _set_sets(self, in_sets: np.ndarray, ratio: np.ndarray | None = None) -> None:
        """The work confined to each set, with what depends on it only: the cut ratios, the
        balance term, and the bottlenecks `_aimed` draws from (found when first needed)."""
        self.in_sets = in_sets
        self.ratio = in_sets / self.table.capacity if ratio is None else ratio
        self.balance = self._balance_of(self.ratio)
        self._bottlenecks: tuple[np.ndarray, np.ndarray | None] | None = None

    def _balance_of(self, ratio: np.ndarray) -> float:
        """W · the mean scenario makespan, from the cut ratios `in_sets / capacity`."""
        return self.p.batches * float(ratio.max(axis=1).mean())

    def _expert(self, e: int, mask: int) -> float:
        """Objective terms of one expert with replica set `mask`: NoP, miss, copies."""
        return self.terms(int(e), int(mask))

    # ------------------------------------------------------------------ moves

    def run(self, rng: np.random.Generator, moves: int, deadline: Deadline | None = None) -> None:
        """`moves` proposals: alternately aimed at a bottleneck and drawn at random; fewer when
        the `deadline` passes first."""
        if self.slot_e.size < 2:
            return
        for k in range(moves):
            if deadline is not None and deadline.expired():
                break
            proposal = self._aimed(rng) if k % 2 else self._random(rng)
            if proposal is None:
                continue
            kind, i, j_or_b = proposal
            if kind == "swap":
                move = self._swap(i, j_or_b)
                if move is not None and self._try(move):
                    self.slot_c[i], self.slot_c[j_or_b] = self.slot_c[j_or_b], self.slot_c[i]
            else:
                move = self._replace(i, j_or_b)
                if move is not None and self._try(move):
                    self.slot_e[i] = j_or_b

    def _random(self, rng: np.random.Generator) -> tuple[str, int, int] | None:
        i = int(rng.integers(self.slot_e.size))
        if rng.random() < 0.5:
            return "swap", i, int(rng.integers(self.slot_e.size))
        if self.candidates.size == 0:
            return None
        return "replace", i, int(self.candidates[rng.integers(self.candidates.size)])

    def _aimed(self, rng: np.random.Generator) -> tuple[str, int, int] | None:
        """A move that gives work confined to a scenario's bottleneck set D a way out of it.

        The scenario is drawn by its makespan's excess over the even split,
        the expert `a` among those confined to D by its work there; then either
        a replica of `a` swaps with one outside D, or a replica outside D
        becomes a replica of `a`.
        """
        if self._bottlenecks is None:  # the same until a move is taken
            ratio = self.ratio
            worst = ratio.argmax(axis=1)
            excess = ratio[np.arange(worst.size), worst] - ratio[:, -1]
            self._bottlenecks = worst, (excess / excess.sum() if excess.max() > 0 else None)
        worst, drawn = self._bottlenecks
        if drawn is None:
            return None
        s = int(rng.choice(worst.size, p=drawn))
        bottleneck = self.table.sets[worst[s]]  # [W]
        held = (self.packed != 0).any(axis=1) & ((self.packed & ~bottleneck) == 0).all(axis=1)
        confined = np.flatnonzero(held & (self.work[s] > 0))
        outside = np.flatnonzero(~resident_of(bottleneck, self.chiplets)[self.slot_c])
        if confined.size == 0 or outside.size == 0:
            return None
        weight = self.work[s, confined]
        a = int(rng.choice(confined, p=weight / weight.sum()))
        j = int(rng.choice(outside))
        if rng.random() < 0.5:
            return "swap", int(rng.choice(np.flatnonzero(self.slot_e == a))), j
        return "replace", j, a

    def _swap(self, i: int, j: int) -> _Move | None:
        a, c, b, d = int(self.slot_e[i]), int(self.slot_c[i]), int(self.slot_e[j]), int(self.slot_c[j])
        ma, mb = int(self.masks[a]), int(self.masks[b])
        if not self.rules.swap_allowed(a, ma, c, b, mb, d):
            return None
        flip = (1 << c) | (1 << d)
        return _Move(a, b, ma ^ flip, mb ^ flip)

    def _replace(self, i: int, b: int) -> _Move | None:
        a, c = int(self.slot_e[i]), int(self.slot_c[i])
        ma, mb = int(self.masks[a]), int(self.masks[b])
        if not self.rules.replace_allowed(a, ma, c, b, mb, self.room):
            return None
        return _Move(a, b, ma & ~(1 << c), mb | (1 << c))

    def _try(self, move: _Move) -> bool:
        """Apply `move` if it lowers the layer's objective."""
        a, b = move.a, move.b
        ma, mb = int(self.masks[a]), int(self.masks[b])
        change = np.array((self._row(move.new_a) - self._row(ma), self._row(move.new_b) - self._row(mb)))
        in_sets = self.in_sets + self.work[:, [a, b]] @ change
        ratio = in_sets / self.table.capacity
        before = self._expert(a, ma) + self._expert(b, mb)
        after = self._expert(a, move.new_a) + self._expert(b, move.new_b)
        value = self.value - self.balance + self._balance_of(ratio) - before + after
        if value >= self.value - 1e-12 * max(1.0, abs(self.value)):
            return False
        if self.owner.size:
            self.room -= self.owner[:, b] * (popcount(move.new_b) - popcount(int(self.masks[b])))
            self.room -= self.owner[:, a] * (popcount(move.new_a) - popcount(int(self.masks[a])))
        self.masks[a], self.masks[b] = move.new_a, move.new_b
        self.packed[[a, b]] = device_sets.from_ints([move.new_a, move.new_b], self.packed.shape[1])
        self._set_sets(in_sets, ratio)
        self.value = value
        return True
