"""Dantzig–Wolfe over chiplet contents: one layer's priced problem as columns of chiplet contents.

At the prices of the Lagrangian over layers (decompose.py) a layer's objective is
`f_l(x) = (W/S) Σ_s z_s(x) + h_l(x)`, h_l the NoP beyond the least, misses, copies and priced
pages (group_bound.py). A column is one chiplet of class k: the experts it holds (A) and, per
scenario s, the share σ_es of each expert's work it serves (a non-resident expert's work, φ_es,
may run on any chiplet). The chiplets of a class are interchangeable, so they share one pricing
problem and the master has no chiplet labels, hence no chiplet symmetry.

The per-scenario maxima z_s do not enter the master: a column is feasible for a **makespan box**
[a, b] (per scenario) when its load in every scenario fits b_s, and every placement whose
makespans lie in the box maps to an integer point of the master (each chiplet its own column, with
the placement's best shares), so

    min { f_l(x) : a ≤ z(x) ≤ b } ≥ (W/S) Σ_s a_s + C(b),

C(b) the master's LP value (the content part: pages, misses, NoP, copies). Keeping z in the
columns instead (z_s ≥ a column's load) would let the LP mix columns with different makespans,
and their average is the mean chiplet load, the even split (formulations/residency.md,
"Dantzig–Wolfe over chiplet contents"). The box is split on one scenario's makespan at a time
(levels, bisection; the upper child keeps its parent's C(b), since C only falls as b grows), and
the layer's bound is the least bound over the open boxes: valid whenever it stops.

A column generation stopped early has no valid LP value; its Lagrangian bound is
(`_lagrangian`): for any row duals y of the right signs,
`C(b) ≥ y·rhs + Σ_j min(d_j l_j, d_j u_j) + Σ_k n_k · min(0, min_column d)`, the last term the
pricing problem's proven bound per class (Farley's bound with the class's chiplet count as the
convexity row), d = c − Aᵀy. Leases and quotas are left out (a relaxation); pages per class and
the budget are rows. Chiplets of one class must have one speed and NoP (device_classes); their
page capacity may differ, the column takes the class's largest.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field

import numpy as np

from comoe_opt.best_split.shares import share_lp
from comoe_opt.highs import DirectModel, lp_work, mip_work
from comoe_opt.residency.bounds.decompose import DeviceClasses, Prices, device_classes
from comoe_opt.residency.bounds.group_bound import page_prices
from comoe_opt.residency.problem import ResidencyProblem

INF = math.inf
PRICE_TOL = 1e-9  # a column enters when its reduced cost is below −PRICE_TOL · (1 + |master value|)
SMOOTHING = 0.7  # Wentges's dual smoothing: price at 0.7 · centre + 0.3 · the master's duals
BIG_FACTOR = 10.0  # cost of an artificial unit: this many times the layer's largest possible cost
PRICING_NODES = 10_000  # nodes of a pricing MILP, at most (its bound is what the column search uses)


@dataclass(frozen=True)
class _Layer:
    """One layer's data at the prices, per class (a class's chiplets are interchangeable)."""

    W: float
    S: int
    E: int
    K: int
    work: np.ndarray  # [K, S, E] ms of each expert's scenario work on one chiplet of class k
    price: np.ndarray  # [E, K] priced page of (e, k)
    size: np.ndarray  # [K] chiplets per class
    speed: np.ndarray  # [K] relative speed of one chiplet of the class
    pages: np.ndarray  # [K] most pages one chiplet of the class holds
    class_pages: np.ndarray  # [K] pages the class holds together
    budget: float
    max_replicas: int
    must: np.ndarray  # [E] bool: resident (all_resident or leased)
    miss: np.ndarray  # [E] W · m_e
    nop_step: np.ndarray  # [E, K-1] W λ_e (n_{k+1} − n_k): paid while no replica in classes ≤ k
    prev: np.ndarray  # [E, K] replicas already in class k
    copy_ms: float
    floating: bool  # some expert may be without a replica (its work then runs anywhere)

    @property
    def most(self) -> float:
        """An upper side of every cost the content part can take."""
        top = self.W * self.work.max(axis=0).sum(axis=1).max()
        return float(top + self.price.sum() * self.size.max() + self.miss.sum() + self.nop_step.sum()
                     + self.copy_ms * self.E * self.size.sum())  # fmt: skip


def layer_data(problem: ResidencyProblem, classes: DeviceClasses, prices: Prices, layer: int) -> _Layer:
    cl = classes
    K, E = cl.count, problem.experts
    rep = [int(cl.members(k)[0]) for k in range(K)]
    work = np.stack([problem.scenario_work[:, layer, :, c] for c in rep])
    price = page_prices(problem, cl, prices, layer)[:, rep]
    pages = np.array([problem.capacity_pages[cl.members(k)].max() for k in range(K)], dtype=np.float64)
    lease = np.zeros((E, problem.chiplets), dtype=bool) if problem.leased is None else problem.leased[layer]
    prev = np.zeros((E, K))
    if problem.previous is not None:
        prev = np.stack(
            [problem.previous.resident[layer][:, cl.of == k].sum(axis=1) for k in range(K)], axis=1
        )
    W = float(problem.batches)
    steps = np.diff(cl.nop)  # classes come sorted by NoP (device_classes)
    nop_step = W * problem.tokens[layer][:, None] * steps[None, :]
    return _Layer(
        W, problem.scenarios, E, K, work, price, cl.size.astype(np.float64), cl.speed.astype(np.float64),
        pages, cl.capacity.astype(np.float64), float(problem.budget_pages), int(problem.max_replicas),
        problem.all_resident | lease.any(axis=1), W * problem.miss_ms[layer], nop_step, prev,
        float(problem.copy_ms), not problem.all_resident,
    )  # fmt: skip


@dataclass
class _Rows:
    """The master's rows other than the convexity rows: bounds and, per family, indices."""

    lower: list[float] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)

    def add(self, count: int, lower: float, upper: float) -> np.ndarray:
        first = len(self.lower)
        self.lower += [lower] * count
        self.upper += [upper] * count
        return np.arange(first, first + count)


class Master:
    """The restricted master LP at one makespan cap b [S], in one persistent HiGHS model."""

    def __init__(self, data: _Layer, cap: np.ndarray):
        d, self.d, self.cap = data, data, np.asarray(cap, dtype=np.float64)
        S, E, K = d.S, d.E, d.K
        rows = _Rows()
        self.cover = rows.add(E * S, 1.0, INF).reshape(E, S)  # Σ (σ + φ) λ + art ≥ 1
        self.floats = rows.add(E * S, -INF, 1.0).reshape(E, S) if d.floating else None  # Σ φ λ + r ≤ 1
        self.hosted = rows.add(E, 0.0, INF)  # Σ_{p ∋ e} λ − r + art ≥ 0
        self.replicas = rows.add(E, -INF, 0.0)  # Σ_{p ∋ e} λ − R r ≤ 0
        self.near = rows.add(E * (K - 1), 0.0, INF).reshape(E, K - 1)  # Σ_{p in k' ≤ k, ∋ e} λ − H + art ≥ 0
        self.hcap = rows.add(E * (K - 1), -INF, 0.0).reshape(E, K - 1)  # H − r ≤ 0
        self.copies = rows.add(E * K, -INF, INF).reshape(E, K)  # new − Σ_{p in k ∋ e} λ ≥ −prev
        for e in range(E):
            for k in range(K):
                rows.lower[self.copies[e, k]] = -float(d.prev[e, k])
        self.class_pages = rows.add(K, -INF, 0.0)
        for k in range(K):
            rows.upper[self.class_pages[k]] = float(d.class_pages[k])
        self.budget = rows.add(1, -INF, d.budget)[0]
        self.conv = rows.add(K, -INF, 0.0)  # Σ_{p in k} λ ≤ n_k: kept out of the Lagrangian
        for k in range(K):
            rows.upper[self.conv[k]] = float(d.size[k])
        self.lower, self.upper = np.array(rows.lower), np.array(rows.upper)
        self.lp = DirectModel()
        h = self.lp.h
        h.addRows(len(rows.lower), self.lower, self.upper, 0, np.zeros(0, np.int32), np.zeros(0, np.int32),
                  np.zeros(0))  # fmt: skip
        self.big = BIG_FACTOR * d.most + 1.0
        self.offset = float(d.miss.sum())
        self.columns: list[
            tuple[int, float, float, dict[int, float]]
        ] = []  # (col, cost, lo, up) of the others
        self.patterns: list[tuple[int, int, np.ndarray]] = []  # (col, class, held)
        # r_e: −miss + NoP until a replica in the nearest class
        for e in range(E):
            entries = {int(self.hosted[e]): -1.0, int(self.replicas[e]): -float(d.max_replicas)}
            if d.floating:
                entries.update({int(self.floats[e, s]): 1.0 for s in range(S)})
            entries.update({int(self.hcap[e, k]): -1.0 for k in range(K - 1)})
            self._column(-d.miss[e] + d.nop_step[e].sum(), float(d.must[e]), 1.0, entries)
            for k in range(K - 1):  # H_ek: a replica in the classes 0..k
                self._column(
                    -d.nop_step[e, k], 0.0, 1.0, {int(self.near[e, k]): -1.0, int(self.hcap[e, k]): 1.0}
                )
            if d.copy_ms > 0:
                for k in range(K):
                    self._column(
                        d.copy_ms, 0.0, float(min(d.size[k], d.max_replicas)), {int(self.copies[e, k]): 1.0}
                    )
        for row in [*self.cover.ravel(), *self.hosted, *self.near.ravel()]:  # artificials: always feasible
            self._column(self.big, 0.0, 1.0, {int(row): 1.0})

    def _column(self, cost: float, lower: float, upper: float, entries: dict[int, float]) -> int:
        col = self.lp.h.getNumCol()
        index = np.fromiter(entries.keys(), dtype=np.int32, count=len(entries))
        value = np.fromiter(entries.values(), dtype=np.float64, count=len(entries))
        self.lp.h.addCol(float(cost), float(lower), float(upper), len(entries), index, value)
        self.columns.append((col, float(cost), float(lower), float(upper)))
        return col

    def add_pattern(self, k: int, held: np.ndarray, share: np.ndarray, floating: np.ndarray | None) -> None:
        """One chiplet of class k holding `held` [E] bool, serving `share` [E, S] (and `floating`)."""
        d = self.d
        entries: dict[int, float] = {}
        served = share + (0.0 if floating is None else floating)
        for e, s in zip(*np.nonzero(served > 0), strict=True):
            entries[int(self.cover[e, s])] = float(served[e, s])
        if floating is not None and self.floats is not None:
            for e, s in zip(*np.nonzero(floating > 0), strict=True):
                entries[int(self.floats[e, s])] = float(floating[e, s])
        for e in np.flatnonzero(held):
            entries[int(self.hosted[e])] = 1.0
            entries[int(self.replicas[e])] = 1.0
            for kk in range(k, d.K - 1):
                entries[int(self.near[e, kk])] = 1.0
            if d.copy_ms > 0:
                entries[int(self.copies[e, k])] = -1.0
        n = float(held.sum())
        entries[int(self.class_pages[k])] = n
        entries[int(self.budget)] = n
        entries[int(self.conv[k])] = 1.0
        cost = float(d.price[held, k].sum())
        col = self.lp.h.getNumCol()
        index = np.fromiter(entries.keys(), dtype=np.int32, count=len(entries))
        value = np.fromiter(entries.values(), dtype=np.float64, count=len(entries))
        self.lp.h.addCol(cost, 0.0, INF, len(entries), index, value)
        self.patterns.append((col, k, held.copy()))

    def solve(self) -> tuple[float, np.ndarray]:
        """The restricted master's LP value (with the miss offset) and its row duals."""
        self.lp.h.changeObjectiveOffset(self.offset)
        outcome = self.lp.solve(options=lp_work(self.lp.rows, self.lp.columns))
        return outcome.objective, np.asarray(self.lp.h.getSolution().row_dual, dtype=np.float64)

    def lagrangian(self, y: np.ndarray, pricing_bounds: np.ndarray) -> float:
        """C(b) ≥ this for any duals y (wrong signs count as 0) and any lower bounds of each class's
        least reduced cost of a column, `pricing_bounds` [K]."""
        y = y.copy()
        y[self.conv] = 0.0
        y[(y > 0) & ~np.isfinite(self.lower)] = 0.0
        y[(y < 0) & ~np.isfinite(self.upper)] = 0.0
        lower = np.where(np.isfinite(self.lower), self.lower, 0.0)
        upper = np.where(np.isfinite(self.upper), self.upper, 0.0)
        value = self.offset + float(np.where(y > 0, y * lower, y * upper).sum())
        lp = self.lp.h.getLp()
        starts, index, coef = (
            np.asarray(a) for a in (lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_)
        )
        for col, cost, lower, upper in self.columns:
            rows = slice(starts[col], starts[col + 1])
            reduced = cost - float(y[index[rows]] @ coef[rows])
            value += min(reduced * lower, reduced * upper)
        value += float((self.d.size * np.minimum(pricing_bounds, 0.0)).sum())
        return value

    def _terms(self, y: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Reduced cost of a class-k column per page held [E], and per unit of share served [E, S]
        (hosted, and floating): d = c − Aᵀy, the convexity row left out."""
        d = self.d
        y = y.copy()
        y[(y > 0) & ~np.isfinite(self.lower)] = 0.0
        y[(y < 0) & ~np.isfinite(self.upper)] = 0.0
        per_page = d.price[:, k] - y[self.hosted] - y[self.replicas] - y[self.class_pages[k]] - y[self.budget]
        if d.copy_ms > 0:
            per_page = per_page + y[self.copies[:, k]]
        if k < d.K - 1:
            per_page = per_page - y[self.near[:, k:]].sum(axis=1)
        gain = y[self.cover]  # [E, S] ≥ 0: value of one unit of share
        gain_float = gain + (y[self.floats] if self.floats is not None else -INF)
        return per_page, gain, gain_float

    def reduced(self, y: np.ndarray, k: int, column: tuple) -> float:
        """A column's reduced cost at y, the convexity row's dual included."""
        _, held, share, floating = column
        per_page, gain, gain_float = self._terms(y, k)
        value = float(per_page[held].sum() - (gain * share).sum())
        if floating is not None:
            value -= float((np.where(floating > 0, gain_float, 0.0) * floating).sum())
        return value - float(y[self.conv[k]])

    def price(self, y: np.ndarray, k: int) -> tuple[float, np.ndarray, np.ndarray, np.ndarray | None]:
        """Class k's pricing problem: a chiplet's contents and shares of least reduced cost, with
        the proven bound of that least reduced cost (conv dual left out)."""
        d = self.d
        S, E = d.S, d.E
        per_page, gain, gain_float = self._terms(y, k)
        m = DirectModel()
        x0 = m.add_columns(per_page, np.zeros(E), np.ones(E), integer=True)
        take = np.argwhere(gain > 0)  # [n, 2] (e, s) worth serving
        sig0 = m.add_columns(-gain[take[:, 0], take[:, 1]], np.zeros(len(take)), np.ones(len(take)))
        ftake = np.argwhere(gain_float > 0) if self.floats is not None else np.zeros((0, 2), int)
        phi0 = m.add_columns(-gain_float[ftake[:, 0], ftake[:, 1]], np.zeros(len(ftake)), np.ones(len(ftake)))
        for i, (e, _s) in enumerate(take):
            m.add_row(-INF, 0.0, [sig0 + i, x0 + e], [1.0, -1.0])
        for i, (e, _s) in enumerate(ftake):
            m.add_row(-INF, 1.0, [phi0 + i, x0 + e], [1.0, 1.0])
        for s in range(S):
            a = np.flatnonzero(take[:, 1] == s)
            f = np.flatnonzero(ftake[:, 1] == s)
            if a.size + f.size:
                index = np.concatenate((sig0 + a, phi0 + f))
                value = np.concatenate((d.work[k][s, take[a, 0]], d.work[k][s, ftake[f, 0]]))
                m.add_row(-INF, float(self.cap[s]), index, value)
        m.add_row(-INF, float(d.pages[k]), x0 + np.arange(E), 1.0)
        outcome = m.solve(mip_gap=0.0, options=mip_work(PRICING_NODES))
        values = m.values()
        held = values[x0 : x0 + E] > 0.5
        share = np.zeros((E, S))
        share[take[:, 0], take[:, 1]] = np.clip(values[sig0 : sig0 + len(take)], 0.0, 1.0)
        share *= held[:, None]
        floating = None
        if self.floats is not None:
            floating = np.zeros((E, S))
            floating[ftake[:, 0], ftake[:, 1]] = np.clip(values[phi0 : phi0 + len(ftake)], 0.0, 1.0)
            floating *= ~held[:, None]
        return float(outcome.bound), held, share, floating


def spread(master: Master) -> None:
    """Start columns: every chiplet holds every expert and serves its speed's share of each, so
    each chiplet's load is the scenario's floor (fits any cap of the box). Only where the pages of
    one chiplet and the replica limit allow it; the artificial columns keep the master feasible
    otherwise."""
    d = master.d
    if d.max_replicas < d.size.sum() or np.any(d.pages < d.E) or d.E * d.size.sum() > d.budget:
        return
    total = float(d.speed @ d.size)
    for k in range(d.K):
        master.add_pattern(k, np.ones(d.E, dtype=bool), np.full((d.E, d.S), d.speed[k] / total),
                           np.zeros((d.E, d.S)) if d.floating else None)  # fmt: skip


def placement_columns(
    problem: ResidencyProblem, classes: DeviceClasses, layer: int, resident: np.ndarray
) -> tuple[np.ndarray, list[tuple[int, np.ndarray, np.ndarray, np.ndarray | None]]]:
    """A layer's placement [E, C] as columns: each chiplet's contents and its best shares in each
    scenario (the share LP), and the placement's makespans [S] (every column fits them)."""
    work = problem.scenario_work[:, layer]  # [S, E, C]
    E, C, S = problem.experts, problem.chiplets, problem.scenarios
    shares = np.zeros((S, E, C))
    makespans = np.zeros(S)
    for s in range(S):
        makespans[s], _, shares[s] = share_lp(work[s], resident)
    held_anywhere = resident.any(axis=1)
    idle = work.sum(axis=2) == 0  # [S, E]: no work to split; the master still wants it served
    shares[idle] = np.where(held_anywhere[:, None], resident, np.arange(C)[None, :] == 0)[np.nonzero(idle)[1]]
    columns = []
    for c in range(C):
        served = shares[:, :, c].T  # [E, S]
        floating = np.where(held_anywhere[:, None], 0.0, served) if not problem.all_resident else None
        hosted = np.where(resident[:, c, None], served, 0.0)
        columns.append((int(classes.of[c]), resident[:, c].copy(), hosted, floating))
    return makespans, columns


@dataclass(frozen=True)
class ContentBound:
    """C(b) from below (the Lagrangian bound of the last duals, best over the iterations)."""

    bound: float
    master: float  # the last restricted master's value (not a bound unless converged)
    converged: bool
    iterations: int
    columns: int


def content_bound(
    data: _Layer,
    cap: np.ndarray,
    *,
    iterations: int = 200,
    stop_at: float | None = None,
    start: list[tuple[int, np.ndarray, np.ndarray, np.ndarray | None]] = (),
) -> ContentBound:
    """Column generation for C(cap): each round, every class's pricing problem; stops when no
    column has a negative reduced cost, after `iterations` rounds, or at `stop_at`. `start`: more
    starting columns (class, held [E], shares [E, S], floating shares or None), e.g. a placement's
    chiplets (`placement_columns`); they change the master's value, never the bound's validity."""
    master = Master(data, cap)
    spread(master)
    for column in start:
        master.add_pattern(*column)
    best, value, done, rounds = -INF, INF, False, 0
    center = None  # the duals of the best Lagrangian bound so far (Wentges's stability centre)
    for rounds in range(1, iterations + 1):  # noqa: B007 - the count is reported
        value, y = master.solve()
        entered = 0
        for trial in [y] if center is None else [SMOOTHING * center + (1 - SMOOTHING) * y, y]:
            found = [master.price(trial, k) for k in range(data.K)]
            bound = master.lagrangian(trial, np.array([f[0] for f in found]))
            if bound > best:
                best, center = bound, trial
            for k, column in enumerate(found):
                if master.reduced(y, k, column) < -PRICE_TOL * (1.0 + abs(value)):
                    master.add_pattern(k, *column[1:])
                    entered += 1
            if entered:
                break  # a smoothed price found a column; otherwise (mispricing) price at y itself
        if entered == 0:
            done = True
            break
        if stop_at is not None and time.perf_counter() >= stop_at:
            break
    return ContentBound(best, value, done, rounds, len(master.patterns))


@dataclass(frozen=True)
class LevelBound:
    """One layer's bound min over boxes of (W/S) Σ a + C(b), and how the search over boxes went."""

    bound: float  # the layer's priced problem, without problem.constant_ms
    root: float  # the first box's bound
    boxes: int  # content bounds computed
    open_boxes: int
    closed: bool  # no open box below the incumbent was left


def makespan_box(problem: ResidencyProblem, layer: int, incumbent: float) -> tuple[np.ndarray, np.ndarray]:
    """[a, b] every placement with f_l ≤ `incumbent` has its makespans in: a the scenarios' floors,
    b the work on the slowest chiplet, and below what the incumbent leaves above the other floors."""
    classes = device_classes(problem)
    work = problem.scenario_work[:, layer]  # [S, E, C]
    lower = work[:, :, 0].sum(axis=1) / float(classes.speed @ classes.size)  # speeds relative to chiplet 0
    upper = work.max(axis=2).sum(axis=1)
    if math.isfinite(incumbent):
        W, S = problem.batches, problem.scenarios
        upper = np.minimum(upper, S / W * incumbent - (lower.sum() - lower))
    return lower, np.maximum(upper, lower)


def level_bound(
    problem: ResidencyProblem,
    prices: Prices,
    layer: int,
    *,
    incumbent: float = INF,
    boxes: int = 1,
    iterations: int = 200,
    stop_at: float | None = None,
    classes: DeviceClasses | None = None,
) -> LevelBound:
    """The layer's bound from at most `boxes` content bounds, splitting the open box of least bound
    on its widest scenario (relative to the scenario's floor) at the middle. `incumbent`: the priced
    value of any placement of the layer (group_bound.reduced_layer_values), which limits the box."""
    classes = classes if classes is not None else device_classes(problem)
    data = layer_data(problem, classes, prices, layer)
    W, S = data.W, data.S
    a, b = makespan_box(problem, layer, incumbent)
    floor = a.copy()

    def bounded(hi: np.ndarray, parent: float) -> float:  # C only falls as the cap grows
        return max(content_bound(data, hi, iterations=iterations, stop_at=stop_at).bound, parent)

    content = bounded(b, -INF)
    root = W / S * a.sum() + content
    heap = [(root, 0, a, b, content)]
    made, tie = 1, 1
    while heap and made < boxes and heap[0][0] < incumbent:
        if stop_at is not None and time.perf_counter() >= stop_at:
            break
        value, _, lo, hi, content = heapq.heappop(heap)
        width = (hi - lo) / np.maximum(floor, 1e-12)
        s = int(np.argmax(width))
        if width[s] <= 1e-9:
            heapq.heappush(heap, (value, tie, lo, hi, content))
            break
        mid = 0.5 * (lo[s] + hi[s])
        upper_half = lo.copy()
        upper_half[s] = mid
        heapq.heappush(heap, (W / S * upper_half.sum() + content, tie, upper_half, hi, content))
        lower_half = hi.copy()
        lower_half[s] = mid
        below = bounded(lower_half, content)
        made += 1
        heapq.heappush(heap, (W / S * lo.sum() + below, tie + 1, lo, lower_half, below))
        tie += 2
    least = heap[0][0] if heap else INF
    bound = min(least, incumbent)
    return LevelBound(
        float(bound), float(min(root, incumbent)), made, len(heap), not heap or least >= incumbent
    )


def window_level_bound(
    problem: ResidencyProblem,
    prices: Prices,
    class_values: np.ndarray | None = None,
    *,
    boxes: int = 1,
    iterations: int = 200,
) -> float:
    """L(prices) with each layer's value the larger of `class_values[l]` (a proven bound of the
    layer's priced problem; none: −inf) and its level bound (with `problem.constant_ms`)."""
    classes = device_classes(problem)
    values = np.full(problem.layers, -INF) if class_values is None else np.asarray(class_values, np.float64)
    for layer in range(problem.layers):
        found = level_bound(problem, prices, layer, boxes=boxes, iterations=iterations, classes=classes)
        values[layer] = max(values[layer], found.bound)
    return float(values.sum()) - prices.constant(problem, classes) + problem.constant_ms
