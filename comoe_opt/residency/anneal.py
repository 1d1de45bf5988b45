"""Simulated annealing on the balance scenarios, one layer at a time.

The local search of refine.py keeps a move only when it lowers the layer's
objective, and stops in local optima: on GPT-OSS window 13 six searches of
20,000 moves do not improve `exact`'s placement on its worst layer, while
this annealing finds a placement 0.5% better on that layer in 40,000
proposals (formulations/residency.md, "Layer decomposition bound").

Moves are refine.py's two kinds, drawn at random over the layer's replicas,
and keep every chiplet's page count, so capacity and budget hold:

* swap — a replica of a on c and a replica of b on d trade places;
* replace — a replica of a on c becomes a replica of b on c.

A move that breaks a lease, a quota, the replica limit or all_resident is
not proposed. A worse move is taken with probability exp(−Δ / T), T falling
linearly from `temperature` times the layer's value to 0; the best layout
seen is kept, so the result is never worse. Each layer's value is
`W · (mean scenario makespan + nearest-replica NoP + misses) + κ · copies`,
exactly the layer's share of the window objective (objective.py), computed
from the cut enumeration (scenarios.py): only up to 12 chiplets related by
one speed factor; elsewhere the placement is returned unchanged.
"""

from __future__ import annotations

import math
import time

import numpy as np

from comoe_opt.deadline import Deadline
from comoe_opt.residency.objective import nearest_nop
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.problem import ResidencyProblem
from comoe_opt.residency.scenarios import CutTable, enumerable, masks_of, related_speeds


def anneal(
    problem: ResidencyProblem,
    placement: Placement,
    *,
    proposals: int,
    seed: int = 0,
    temperature: float = 0.002,
    stop_at: float | None = None,
    deadline: Deadline | None = None,
) -> Placement:
    """`placement` improved by `proposals` annealing proposals per layer (never worse).

    With `stop_at` (a `time.perf_counter()` value) the layers not reached by then stay as they
    are; with a `deadline` each layer gets at most the proposals that fit its share of the time
    left, at the pace measured so far. Either way the result then depends on the machine's speed.
    """
    work = problem.scenario_work_ms
    if work is None or not enumerable(work):
        return placement
    table = CutTable.for_speeds(related_speeds(work))
    resident = placement.resident.copy()
    room = np.array([t.max_pages - int(resident[t.owns].sum()) for t in problem.tenants], dtype=np.int64)
    pace = _Pace()
    for layer in range(problem.layers):
        if (stop_at is not None and time.perf_counter() >= stop_at) or (deadline and deadline.expired()):
            break
        state = _Layer(problem, table, resident[layer], layer, room)
        count = proposals
        if deadline is not None and math.isfinite(deadline.remaining()):
            count = pace.fitting(state, proposals, deadline.remaining() / (problem.layers - layer))
        began = time.perf_counter()
        resident[layer] = state.run(np.random.default_rng([seed, layer]), count, temperature)
        pace.record(count, time.perf_counter() - began)
    return Placement(resident)


class _Pace:
    """Seconds per proposal, measured as the layers run: with a deadline each layer gets the
    proposals that fit its share of the time left, so that every layer is annealed (a run cut at
    the deadline would leave the last layers untouched)."""

    CALIBRATION = 32  # proposals timed on a copy of the first layer, before any rate is known

    def __init__(self) -> None:
        self.proposals, self.seconds = 0, 0.0

    def record(self, proposals: int, seconds: float) -> None:
        self.proposals, self.seconds = self.proposals + proposals, self.seconds + seconds

    def fitting(self, state: _Layer, proposals: int, seconds: float) -> int:
        if not self.proposals:  # a throwaway run on a copy: the layer's own run is unchanged
            trial = _Layer(state.p, state.table, state.resident, state.layer, state.room.copy())
            began = time.perf_counter()
            trial.run(np.random.default_rng(0), self.CALIBRATION, 0.0)
            self.record(self.CALIBRATION, time.perf_counter() - began)
        rate = self.seconds / self.proposals
        return max(0, min(proposals, int(seconds / max(rate, 1e-9))))


class _Layer:
    def __init__(
        self, problem: ResidencyProblem, table: CutTable, resident: np.ndarray, layer: int, room: np.ndarray
    ):
        self.p, self.table, self.layer, self.room = problem, table, layer, room
        self.work = problem.scenario_work_ms[:, layer, :, 0]  # [S, E] on a unit-speed chiplet
        self.resident = resident.copy()
        E, C = resident.shape
        none = np.zeros((E, C), dtype=bool)
        self.prev = problem.previous.resident[layer] if problem.previous is not None else none
        self.lease = problem.leased[layer] if problem.leased is not None else none
        owns = [t.owns[layer] for t in problem.tenants]
        self.owner = np.array(owns, dtype=np.int64) if owns else np.zeros((0, E), dtype=np.int64)

    def value(self, resident: np.ndarray) -> float:
        p, layer = self.p, self.layer
        z = float(self.table.makespans(self.work @ self.table.inside(masks_of(resident))).mean())
        miss = float(p.miss_ms[layer][~resident.any(axis=1)].sum())
        copies = int((resident & ~self.prev).sum())
        return p.batches * (z + nearest_nop(p, resident, layer) + miss) + p.copy_ms * copies

    def owned_pages(self, resident: np.ndarray) -> np.ndarray:
        """Pages of each tenant in this layer."""
        return self.owner @ resident.sum(axis=1)

    def run(self, rng: np.random.Generator, proposals: int, temperature: float) -> np.ndarray:
        """The best layout seen; `room` (the quotas' pages left) is updated to it."""
        start = x = best = self.resident
        base_room = self.room.copy()
        current = best_value = self.value(x)
        start_t = temperature * max(abs(current), 1e-12)
        for k in range(proposals):
            y = self._propose(rng, x, base_room - self.owned_pages(x) + self.owned_pages(start))
            if y is None:
                continue
            v = self.value(y)
            t = start_t * (1 - k / proposals)
            if v < current or (t > 0 and rng.random() < math.exp(-(v - current) / t)):
                x, current = y, v
                if v < best_value - 1e-12 * max(1.0, abs(best_value)):
                    best, best_value = x, v
        self.room[:] = base_room - self.owned_pages(best) + self.owned_pages(start)
        return best

    def _propose(self, rng: np.random.Generator, x: np.ndarray, room: np.ndarray) -> np.ndarray | None:
        """A swap or a replace of a random replica that keeps every constraint, or None."""
        slots = np.argwhere(x)
        if slots.shape[0] == 0:
            return None
        a, c = slots[rng.integers(slots.shape[0])]
        y = x.copy()
        if rng.random() < 0.5:  # swap with another replica
            b, d = slots[rng.integers(slots.shape[0])]
            if a == b or c == d or x[a, d] or x[b, c] or self.lease[a, c] or self.lease[b, d]:
                return None
            y[a, c], y[b, d], y[a, d], y[b, c] = False, False, True, True
            return y
        b = int(rng.integers(x.shape[0]))  # replace a's replica on c by one of b
        if b == a or x[b, c] or self.lease[a, c] or x[b].sum() + 1 > self.p.max_replicas:
            return None
        if self.p.all_resident and x[a].sum() < 2:
            return None
        if np.any(self.owner[:, b] - self.owner[:, a] > room):
            return None
        y[a, c], y[b, c] = False, True
        return y
