"""From replica counts to chiplets: which chiplets hold the r replicas of each expert.

Replicas that already sit on a chiplet stay there first (leased ones
always), then the remaining replicas of all layers are placed together,
largest work first, each on the chiplet where its own layer would finish
earliest (LPT), never twice on one chiplet and never beyond a chiplet's free
pages. Interleaving the layers matters when capacity is tight: placed one
layer after another, the last layers found room only on the chiplets the
others left, and stacked there. This turns the replica-count model's
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
    work = problem.work_ms
    share = work / np.maximum(counts, 1)[:, :, None]
    load = np.zeros((problem.layers, problem.chiplets))
    wanted = np.zeros(counts.shape, dtype=np.int64)
    for layer in range(problem.layers):
        prev = previous[layer] if previous is not None else None
        load[layer], wanted[layer] = _keep_layer(counts[layer], share[layer], free, prev, resident[layer])
    piece = np.where(counts > 0, work.min(axis=2) / np.maximum(counts, 1), 0.0)
    for flat in np.argsort(-piece, axis=None, kind="stable"):
        layer, e = divmod(int(flat), problem.experts)
        for _ in range(int(wanted[layer, e])):
            if not _place(problem, share[layer, e], resident[layer, e], free, load[layer]):
                break  # no room left: the expert keeps fewer replicas
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
        best = _best_swap(problem, share, load, out, movable, previous)
        if best is None:
            return
        e, f, c, d = best
        out[e, c], out[e, d], out[f, d], out[f, c] = False, True, False, True
        movable[e, c], movable[e, d], movable[f, d], movable[f, c] = False, True, False, True
        load[c] += share[f, c] - share[e, c]
        load[d] += share[e, d] - share[f, d]


def _best_swap(
    problem: ResidencyProblem,
    share: np.ndarray,
    load: np.ndarray,
    out: np.ndarray,
    movable: np.ndarray,
    previous: np.ndarray | None,
) -> tuple[int, int, int, int] | None:
    """The swap of an expert e on the busiest chiplet c with an expert f on a chiplet d (f not on
    c, e not on d) of largest gain, or None. For each e, its pair of largest gain (first in (f, d)
    order) is the candidate, kept if it gains and lowers c's load; ties go to the first e."""
    c = int(np.argmax(load))
    on_c = np.flatnonzero(movable[:, c])
    if on_c.size == 0:
        return None
    # pairs[i, f, d]: f on d may swap with on_c[i]
    pairs = movable[None, :, :] & ~out[on_c][:, None, :] & ~out[:, c][None, :, None]
    new_c = load[c] - share[on_c, c][:, None, None] + share[:, c][None, :, None]
    new_d = load[None, None, :] - share[None, :, :] + share[on_c][:, None, :]
    peak = np.maximum(new_c, new_d)
    copies = _swap_copies(previous, on_c, c)
    gain = np.where(pairs, problem.batches * (load[c] - peak) - problem.copy_ms * copies, -np.inf)
    flat = gain.reshape(on_c.size, -1)
    first = np.argmax(flat, axis=1)  # each e's best pair, first in (f, d) order
    rows = np.arange(on_c.size)
    top, top_peak = flat[rows, first], peak.reshape(on_c.size, -1)[rows, first]
    keep = pairs.reshape(on_c.size, -1)[rows, first] & (top > 1e-12) & (top_peak < load[c] - 1e-12)
    if not keep.any():
        return None
    i = int(np.argmax(np.where(keep, top, -np.inf)))
    f, d = divmod(int(first[i]), out.shape[1])
    return int(on_c[i]), f, c, d


def _swap_copies(previous: np.ndarray | None, on_c: np.ndarray, c: int) -> np.ndarray | float:
    """[i, f, d] copies a swap of on_c[i] (on c) with f (on d) adds over keeping both in place."""
    if previous is None:
        return 0.0
    missing = (~previous).astype(int)
    before = missing[on_c, c][:, None, None] + missing[None, :, :]
    after = missing[on_c][:, None, :] + missing[:, c][None, :, None]
    return after - before


def _keep_layer(
    counts: np.ndarray, share: np.ndarray, free: np.ndarray, previous: np.ndarray | None, out: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Keep one layer's replicas already in place (`out` [E, C] holds the leased ones): no copy.
    Returns the layer's chiplet loads and the replicas each expert still wants."""
    load = (share * out).sum(axis=0)
    wanted = np.maximum(counts.astype(np.int64) - out.sum(axis=1), 0)
    if previous is not None:
        for e in np.flatnonzero(wanted > 0):
            for c in np.flatnonzero(previous[e] & ~out[e] & (free > 0))[: wanted[e]]:
                out[e, c] = True
                free[c] -= 1
                wanted[e] -= 1
                load[c] += share[e, c]
    return load, wanted


def _place(
    problem: ResidencyProblem, share: np.ndarray, out: np.ndarray, free: np.ndarray, load: np.ndarray
) -> bool:
    """One replica of an expert (its row `out` [C]) on the chiplet where its layer finishes first."""
    candidates = np.flatnonzero(~out & (free > 0))
    if candidates.size == 0:
        return False
    finish = load[candidates] + share[candidates]
    tie = problem.nop_ms_per_token[candidates]
    c = candidates[np.lexsort((tie, finish))[0]]
    out[c] = True
    free[c] -= 1
    load[c] += share[c]
    return True
