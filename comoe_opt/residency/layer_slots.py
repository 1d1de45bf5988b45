"""Plans laid out as serving engines hold them: at most `layer_slots` replicas of a layer per device.

SGLang, vLLM and TensorRT-LLM give every GPU the same number of slots in every layer; the slow
loop's memory model lets a chiplet hold more replicas of one layer and fewer of another (one
memory for all layers). With `policy.layer_slots` set (serving instances set it), `solve` lays
its plan out within it (`laid_out`): layer by layer, while a device holds more than its share,
one of its replicas moves to a device under it, the move of least objective (the layer's
balance on the problem's scenarios, or its best-split makespan, plus the copies it adds), a
replica of an expert already on every device under the limit is dropped instead when the expert
keeps another (formulations/residency.md, "Slots per layer"). The bound stands (a constraint
added to the primal only raises its optimum); a plan the layout made worse is no longer `optimal`.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from comoe_opt.best_split import sets as device_sets
from comoe_opt.best_split.cut_condition import MAX_ENUMERATED_CHIPLETS
from comoe_opt.best_split.min_cut import bottlenecks
from comoe_opt.residency.objective import layer_makespan, layer_speeds, score
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.problem import ResidencyProblem
from comoe_opt.residency.report import ResidencyResult
from comoe_opt.results import Status

MAX_TARGETS = 4  # devices under the limit each replica is tried on: the least loaded ones
# relative: a move is skipped only when its lower bound exceeds the best cost by more than
# round-off (the bound and the solved makespan are summed in different orders)
SURE = 1e-9


def over_layer_slots(problem: ResidencyProblem, placement: Placement) -> list[tuple[int, int]]:
    """(layer, device) pairs holding more than `problem.layer_slots` replicas (none when unset)."""
    if not problem.layer_slots:
        return []
    held = placement.resident.sum(axis=1)  # [L, C]
    return [(int(li), int(c)) for li, c in np.argwhere(held > problem.layer_slots)]


def laid_out(problem: ResidencyProblem, result: ResidencyResult) -> ResidencyResult:
    """`result` with its placement within `problem.layer_slots`; unchanged when it already is."""
    placement = result.solution
    if placement is None or not over_layer_slots(problem, placement):
        return result
    resident = placement.resident.copy()
    moves = sum(_lay_out_layer(problem, resident, li) for li in range(problem.layers))
    fixed = Placement(resident)
    terms = score(problem, fixed)
    # a proof survives a layout no worse than the proven plan; any other is a plan without one
    no_worse = terms.total <= result.objective + 1e-9 * max(1.0, abs(result.objective))
    status = Status.FEASIBLE if result.status == Status.OPTIMAL and not no_worse else result.status
    report = dataclasses.replace(result.report, terms=terms, layout_moves=moves)
    return dataclasses.replace(result, status=status, objective=terms.total, solution=fixed, report=report)


def _lay_out_layer(problem: ResidencyProblem, resident: np.ndarray, li: int) -> int:
    """Move or drop replicas of layer `li` (in `resident`, changed in place) until no device holds
    more than `layer_slots` of it; the number of replicas moved or dropped."""
    layer = resident[li]
    leased = problem.leased[li] if problem.leased is not None else np.zeros_like(layer)
    before = problem.previous.resident[li] if problem.previous is not None else None
    changed = 0
    while True:
        held = layer.sum(axis=0)
        over = np.flatnonzero(held > problem.layer_slots)
        if over.size == 0:
            return changed
        g = int(over[np.argmax(held[over])])
        under = np.flatnonzero(held < problem.layer_slots)
        move = _best_move(problem, layer, leased, before, li, g, under)
        if move is not None:
            e, h = move
        else:
            # nothing on g may move or go: its replicas are leased, or their experts' only ones
            # with no device free to take them, when the layer holds more replicas than its
            # slots (one memory for all layers lets a plan do that). Then a replica elsewhere
            # goes, the one of least objective of an expert that keeps another.
            if held.sum() <= problem.layer_slots * problem.chiplets:
                return changed  # leased: left as it is
            drop = _surplus_drop(problem, layer, leased, before, li)
            if drop is None:
                return changed  # every replica is its expert's last or leased: left as it is
            g, e, h = drop
        layer[e, g] = False
        if h >= 0:
            layer[e, h] = True
        changed += 1


def _best_move(
    problem: ResidencyProblem,
    layer: np.ndarray,
    leased: np.ndarray,
    before: np.ndarray | None,
    li: int,
    g: int,
    under: np.ndarray,
) -> tuple[int, int] | None:
    """(expert, target device) of the least objective off device `g`, target -1 for a drop."""
    load = _load(problem, layer, li)
    candidates = []
    for e in np.flatnonzero(layer[:, g] & ~leased[:, g]):
        free = under[~layer[e, under]]
        targets = free[np.argsort(load[free], kind="stable")[:MAX_TARGETS]]
        candidates += [(int(e), int(h)) for h in targets]
        if not targets.size and layer[e].sum() > 1:
            candidates.append((int(e), -1))  # already on every device with room: dropped instead
    if not candidates:
        return None
    _, expert, target = _least(problem, layer, before, li, [(g, e, h) for e, h in candidates])
    return expert, target


def _surplus_drop(
    problem: ResidencyProblem, layer: np.ndarray, leased: np.ndarray, before: np.ndarray | None, li: int
) -> tuple[int, int, int] | None:
    """(device, expert, -1): the drop of least objective among the layer's replicas whose expert
    keeps another (not leased), from the devices holding the most first; None when there is none."""
    held = layer.sum(axis=0)
    several = layer.sum(axis=1) > 1
    candidates = [
        (int(c), int(e), -1)
        for c in np.argsort(-held, kind="stable")
        for e in np.flatnonzero(layer[:, c] & several & ~leased[:, c])
    ]
    return _least(problem, layer, before, li, candidates) if candidates else None


def _least(
    problem: ResidencyProblem,
    layer: np.ndarray,
    before: np.ndarray | None,
    li: int,
    candidates: list[tuple[int, int, int]],
) -> tuple[int, int, int]:
    """The move (from g, expert e, to h; h = -1: dropped) of least cost, the first of the least
    (deterministic). With bounds (`_Floor`), the moves are solved from the least bound up, and one
    whose bound exceeds the best cost so far is not."""
    floor = _Floor.of(problem, layer, li)
    bounds = np.zeros(len(candidates))
    if floor is not None:
        bounds = np.array(
            [
                problem.batches * floor.makespan(e, g, h) + _copy_ms(problem, before, g, e, h)
                for g, e, h in candidates
            ]
        )
    best, best_cost = len(candidates), math.inf
    for i in np.argsort(bounds, kind="stable"):
        if floor is not None and bounds[i] > best_cost * (1 + SURE):
            break  # neither it nor any after it can beat the best
        g, e, h = candidates[i]
        cost = _cost(problem, layer, before, li, g, e, h)
        if cost < best_cost or (cost == best_cost and i < best):
            best, best_cost = int(i), cost
    return candidates[best]


def _cost(
    problem: ResidencyProblem, layer: np.ndarray, before: np.ndarray | None, li: int, g: int, e: int, h: int
) -> float:
    """The layer's objective after moving expert e's replica from g to h (dropping it: h = -1)."""
    trial = layer.copy()
    trial[e, g] = False
    if h >= 0:
        trial[e, h] = True
    return problem.batches * layer_makespan(problem, trial, li) + _copy_ms(problem, before, g, e, h)


def _copy_ms(problem: ResidencyProblem, before: np.ndarray | None, g: int, e: int, h: int) -> float:
    """The copies' price of moving e's replica from g to h: onto h where the previous plan had
    none, less the copy onto g it undoes (none without a previous plan)."""
    if before is None:
        return 0.0
    return problem.copy_ms * (int(h >= 0 and not before[e, h]) - int(not before[e, g]))


class _Floor:
    """Lower bounds of a moved replica's best-split makespans, from the layer's bottleneck sets
    before the move: by the cut condition a scenario's makespan is the largest ratio
    Σ_{e : R_e ⊆ D} w_e / Σ_{c ∈ D} v_c over chiplet sets D, so the ratio of any set, with e's
    new replica set, bounds it from below: the set that was the bottleneck, that set with the
    move's target added (the replica moves into it), and the set of all chiplets. A move whose
    bound cannot beat the best move so far is not solved: the layout chooses the same moves at a
    fraction of the min cuts. Only where the makespans are min cuts (more chiplets than
    `MAX_ENUMERATED_CHIPLETS`, related speeds); elsewhere they are cheap."""

    def __init__(self, layer: np.ndarray, w: np.ndarray, speeds: np.ndarray):
        self.layer, self.w, self.speeds = layer, w, speeds  # [E, C] replicas, [S, E] unit-speed work
        _, masks = bottlenecks(w, layer, speeds)
        self.sets = device_sets.unpack(masks, layer.shape[1])  # [S, C] each scenario's bottleneck
        # an expert with no replica counts only for the set of all
        self.placed = np.asarray(layer.any(axis=1))
        self.outside = (layer[None] & ~self.sets[:, None, :]).sum(axis=2)  # [S, E] hosts off the set
        self.mean = w.sum(axis=1) / speeds.sum()  # [S] the set of all chiplets
        self.with_target: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    @classmethod
    def of(cls, problem: ResidencyProblem, layer: np.ndarray, li: int) -> _Floor | None:
        if not problem.scenarios or problem.split != "best" or problem.chiplets <= MAX_ENUMERATED_CHIPLETS:
            return None
        speeds = layer_speeds(problem, li)
        return None if speeds is None else cls(layer, problem.scenario_work[:, li, :, 0], speeds)

    def _sets(self, h: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """([S, C] the bottleneck sets with h added (h = -1: as they are), [S, E] experts confined
        to them, [S] their work), before the move."""
        if h not in self.with_target:
            sets = self.sets.copy()
            off_h: np.ndarray = self.outside
            if h >= 0:
                sets[:, h] = True
                off_h = self.outside - (self.layer[None, :, h] & ~self.sets[:, h, None])
            confined = self.placed[None] & (off_h == 0)
            self.with_target[h] = (sets, confined, (self.w * confined).sum(axis=1))
        return self.with_target[h]

    def makespan(self, e: int, g: int, h: int) -> float:
        """A lower bound of the mean scenario makespan after e's replica moves from g to h (h = -1:
        dropped)."""
        hosts = self.layer[e].copy()
        hosts[g] = False
        if h >= 0:
            hosts[h] = True
        ratios = [self.mean]
        for sets, confined, load in [self._sets(-1), *([self._sets(h)] if h >= 0 else [])]:
            inside = bool(hosts.any()) & ~(hosts[None] & ~sets).any(axis=1)  # [S]
            moved = load + self.w[:, e] * (inside.astype(np.float64) - confined[:, e])
            ratios.append(moved / (sets * self.speeds).sum(axis=1))
        return float(np.max(ratios, axis=0).mean())


def _load(problem: ResidencyProblem, layer: np.ndarray, li: int) -> np.ndarray:
    """[C] each device's expected work with every expert's split evenly over its replicas."""
    replicas = np.maximum(layer.sum(axis=1), 1)[:, None]
    return (problem.work_ms[li] / replicas * layer).sum(axis=0)
