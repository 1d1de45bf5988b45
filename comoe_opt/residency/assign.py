"""From replica counts to chiplets: which chiplets hold the r replicas of each expert.

Per layer, replicas that already sit on a chiplet stay there first (leased
ones always), then the remaining replicas are placed largest work first on
the chiplet that would finish earliest (LPT), never twice on one chiplet and
never beyond a chiplet's free pages. This turns the replica-count model's
solution (and the greedy heuristics' counts) into a `Placement`.
"""

from __future__ import annotations

import numpy as np

from comoe_opt.residency.placement import Placement
from comoe_opt.residency.problem import ResidencyProblem


def assign_replicas(problem: ResidencyProblem, counts: np.ndarray) -> Placement:
    """Place `counts[l, e]` replicas of every logical expert on distinct chiplets."""
    leased = (
        problem.leased
        if problem.leased is not None
        else np.zeros((problem.layers, problem.experts, problem.chiplets), dtype=bool)
    )
    # leased pages are placed before anything else can take their room
    resident = leased.copy()
    free = problem.capacity_pages.astype(np.int64) - leased.sum(axis=(0, 1))
    previous = problem.previous.resident if problem.previous is not None else None
    order = np.argsort(-counts.sum(axis=1), kind="stable")  # crowded layers first
    for layer in order:
        prev = previous[layer] if previous is not None else None
        _assign_layer(problem, layer, counts[layer], free, prev, resident[layer])
    for layer in range(problem.layers):
        prev = previous[layer] if previous is not None else None
        _rebalance(problem, layer, resident[layer], leased[layer], prev)
    return Placement(resident)


def _rebalance(
    problem: ResidencyProblem, layer: int, out: np.ndarray, leased: np.ndarray, previous: np.ndarray | None
) -> None:
    """Swap replicas of one layer between chiplets while the busiest chiplet gets less busy.

    A swap keeps every chiplet's page count, so capacity still holds; it is
    taken only if the window's gain (W · lower makespan) beats the copies it adds.
    """
    share = problem.work_ms[layer] / np.maximum(out.sum(axis=1), 1)[:, None]
    load = (share * out).sum(axis=0)
    movable = out & ~leased
    for _ in range(4 * problem.experts):
        c = int(np.argmax(load))
        best = None
        for e in np.flatnonzero(movable[:, c]):
            # swap e (on c) with f (on d, f not on c, e not on d): loads after the swap
            others = movable & ~out[e][None, :] & ~out[:, c][:, None]
            f_idx, d_idx = np.nonzero(others)
            if f_idx.size == 0:
                continue
            new_c = load[c] - share[e, c] + share[f_idx, c]
            new_d = load[d_idx] - share[f_idx, d_idx] + share[e, d_idx]
            peak = np.maximum(new_c, new_d)
            copies = _new_copies(previous, e, c, f_idx, d_idx)
            gain = problem.batches * (load[c] - peak) - problem.copy_ms * copies
            i = int(np.argmax(gain))
            if gain[i] > 1e-12 and peak[i] < load[c] - 1e-12 and (best is None or gain[i] > best[0]):
                best = (gain[i], e, int(f_idx[i]), int(d_idx[i]))
        if best is None:
            return
        _, e, f, d = best
        out[e, c], out[e, d], out[f, d], out[f, c] = False, True, False, True
        movable[e, c], movable[e, d], movable[f, d], movable[f, c] = False, True, False, True
        load[c] += share[f, c] - share[e, c]
        load[d] += share[e, d] - share[f, d]


def _new_copies(previous: np.ndarray | None, e: int, c: int, f: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Copies a swap adds over keeping e on c and f on d (against the previous placement)."""
    if previous is None:
        return np.zeros(f.size)
    before = (~previous[e, c]).astype(int) + (~previous[f, d]).astype(int)
    after = (~previous[e, d]).astype(int) + (~previous[f, c]).astype(int)
    return after - before


def _assign_layer(
    problem: ResidencyProblem,
    layer: int,
    counts: np.ndarray,
    free: np.ndarray,
    previous: np.ndarray | None,
    out: np.ndarray,
) -> None:
    """Fill `out` [E, C] (holding the leased replicas already) up to `counts` replicas per expert."""
    work = problem.work_ms[layer]
    share = work / np.maximum(counts, 1)[:, None]
    load = (share * out).sum(axis=0)
    wanted = np.maximum(counts.astype(np.int64) - out.sum(axis=1), 0)
    if previous is not None:  # replicas already in place stay: no copy
        for e in np.flatnonzero(wanted > 0):
            for c in np.flatnonzero(previous[e] & ~out[e] & (free > 0))[: wanted[e]]:
                out[e, c] = True
                free[c] -= 1
                wanted[e] -= 1
                load[c] += share[e, c]
    piece = np.where(counts > 0, work.min(axis=1) / np.maximum(counts, 1), 0.0)
    for e in np.argsort(-piece, kind="stable"):
        for _ in range(int(wanted[e])):
            candidates = np.flatnonzero(~out[e] & (free > 0))
            if candidates.size == 0:
                break  # no room left: the expert keeps fewer replicas
            finish = load[candidates] + share[e, candidates]
            tie = problem.nop_ms_per_token[candidates]
            c = candidates[np.lexsort((tie, finish))[0]]
            out[e, c] = True
            free[c] -= 1
            load[c] += share[e, c]
