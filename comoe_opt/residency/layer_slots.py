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

import numpy as np

from comoe_opt.residency.objective import layer_makespan, score
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.problem import ResidencyProblem
from comoe_opt.residency.report import ResidencyResult
from comoe_opt.results import Status

MAX_TARGETS = 4  # devices under the limit each replica is tried on: the least loaded ones


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
        best = _best_move(problem, layer, leased, before, li, g, under)
        if best is None:
            return changed  # nothing on g may move or go (leased, or sole replicas): left as it is
        e, h = best
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
    costs = [_cost(problem, layer, before, li, g, e, h) for e, h in candidates]
    return candidates[int(np.argmin(costs))]  # first of the least: deterministic


def _cost(
    problem: ResidencyProblem, layer: np.ndarray, before: np.ndarray | None, li: int, g: int, e: int, h: int
) -> float:
    """The layer's objective after moving expert e's replica from g to h (dropping it: h = -1)."""
    trial = layer.copy()
    trial[e, g] = False
    if h >= 0:
        trial[e, h] = True
    z = layer_makespan(problem, trial, li)
    if before is None:
        return problem.batches * z
    # copies added: onto h where the previous plan had none, less the copy onto g it undoes
    copies = int(h >= 0 and not before[e, h]) - int(not before[e, g])
    return problem.batches * z + problem.copy_ms * copies


def _load(problem: ResidencyProblem, layer: np.ndarray, li: int) -> np.ndarray:
    """[C] each device's expected work with every expert's split evenly over its replicas."""
    replicas = np.maximum(layer.sum(axis=1), 1)[:, None]
    return (problem.work_ms[li] / replicas * layer).sum(axis=0)
