"""The drop-in's local search, shared by its two dispatches: a plan's slots for every layer, the
moves that change it, and their price. `EvenSearch` (even_search.py) and `LpSearch` (lp_search.py)
score the moves and decide which to apply.

Moves stay on one node (hierarchical plans keep EPLB's node packing): swap the experts of two
slots on different GPUs, or give a slot of an expert with a spare replica to the expert of
another slot. A move is kept only if it lowers the layer's objective: score + `move_cost` ×
experts moved relative to `prev` (an expert moved is a replica on a GPU that did not hold it);
moves are scored from the two experts they touch (the rest of the layer's sums stay).

The search stops when every layer has stopped, or when its work budget (`config.Work`: moves
scored, covariances and cut sums, counted at a typical machine's cost) is spent, so that where it
stops depends on the input alone; a caller's opt-in deadline may stop it sooner.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from comoe_opt.balancers.dropin.config import DEFAULT, SearchConfig, Work
from comoe_opt.balancers.dropin.objective import Shape, moved
from comoe_opt.best_split.even import slot_replicas


@dataclass
class Candidates:
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


MOVE_FIELDS = ("e", "f", "gi", "gj", "swap", "i", "j", "na", "nb", "valid")


def columns(c: Candidates, keep: np.ndarray) -> Candidates:
    """The candidates of the columns `keep` (bool [K]) of every row."""
    return Candidates(c.layer, *(getattr(c, name)[:, keep] for name in MOVE_FIELDS))


def one_each(c: Candidates, rows: np.ndarray, ks: np.ndarray) -> Candidates:
    """The candidates with one move per row: row r's move ks[r]."""
    return Candidates(c.layer[rows], *(getattr(c, name)[rows, ks][:, None] for name in MOVE_FIELDS))


def picked(c: Candidates, rows: np.ndarray, ks: np.ndarray) -> Candidates:
    """The candidates of rows `rows`, row r's moves ks[r] ([rows, k])."""
    return Candidates(c.layer[rows], *(getattr(c, name)[rows[:, None], ks] for name in MOVE_FIELDS))


class Search:
    """All layers' slots, searched together: the state and moves both dispatches share."""

    def __init__(
        self,
        slots: np.ndarray,
        experts: int,
        shape: Shape,
        prev: np.ndarray | None,
        move_cost: float,
        config: SearchConfig = DEFAULT,
        work: Work | None = None,
    ):
        self.slots = slots.copy()
        self.shape, self.config = shape, config
        self.work = Work() if work is None else work
        self.layers, self.experts = slots.shape[0], experts
        self.per_gpu = slots.shape[1] // shape.gpus
        self.per_node = slots.shape[1] // shape.nodes
        self.n = slot_replicas(self.slots, experts, shape.gpus)
        self.prev = prev  # [layers, E, G] or None
        self.move_cost = move_cost
        self.applied = 0

    def price(self, layers: np.ndarray) -> np.ndarray:
        """[layers] `move_cost` times the experts the layers' plans have moved off `prev`."""
        return self.move_cost * moved(self.n[layers], None if self.prev is None else self.prev[layers])

    def _moves(
        self,
        active: np.ndarray,
        i: np.ndarray,
        j: np.ndarray,
        swap: np.ndarray,
        found: np.ndarray,
        counts: bool = True,
    ) -> Candidates:
        """The moves [B, K] of slots i and j (swap, else i's expert becomes j's) in the layers;
        without `counts`, the experts' replicas per GPU after each move are left to `_counted`."""
        gi, gj = i // self.per_gpu, j // self.per_gpu
        rows = active[:, None]
        e, f = self.slots[rows, i], self.slots[rows, j]
        count_e = self.n[active].sum(axis=-1)[np.arange(active.size)[:, None], e]
        valid = found & (e != f) & np.where(swap, gi != gj, count_e >= 2)
        none = np.zeros((*i.shape, 0), dtype=np.int64)
        c = Candidates(active, e, f, gi, gj, swap, i, j, none, none, valid)
        return self._counted(c) if counts else c

    def _counted(self, c: Candidates) -> Candidates:
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
        return Candidates(c.layer, c.e, c.f, c.gi, c.gj, c.swap, c.i, c.j, na, nb, c.valid)

    def _move_costs(self, c: Candidates) -> np.ndarray:
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

    def _place(self, c: Candidates, rows: np.ndarray, ks: np.ndarray) -> None:
        """Row r's move ks[r] made in the slots and replica counts (one move per layer)."""
        layers = c.layer[rows]
        e, f, i, j = (x[rows, ks] for x in (c.e, c.f, c.i, c.j))
        swap = c.swap[rows, ks]
        self.slots[layers, i] = f
        self.slots[layers[swap], j[swap]] = e[swap]
        self.n[layers, e], self.n[layers, f] = c.na[rows, ks], c.nb[rows, ks]
        self.applied += rows.size
