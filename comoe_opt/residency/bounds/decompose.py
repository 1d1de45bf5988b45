"""Bounds that see integrality: the hop-class model and its Lagrangian over layers.

With balance scenarios the window objective is

    W · Σ_l ( (1/S) Σ_s z*_ls + NoP_l + misses_l ) + κ · copies

with z*_ls the best-routing makespan of scenario s on layer l, the largest
cut ratio over chiplet sets D (cut_condition.py). The cut model (cut_model.py) states
it over x[l,e,c]; its LP relaxation spreads fractional replicas over every
chiplet, which makes every confinement u_leD and every nearest-replica NoP
small: its root bound is the even split with the least NoP.

Chiplets of one **class** (same speed, same NoP; `device_classes`) are
interchangeable, so the class model forgets which chiplet of a class holds
a replica and keeps only:

* the **type** T of each resident (l, e): the set of classes its replicas
  lie in (binary t[l,e,T], Σ_T t = resident). Its NoP is exact,
  `λ_le · min_{k ∈ T} n_k`, and it is confined to every union of classes D
  that contains T, so the cut of D is exact and linear in t:
  `V_D · z_ls ≥ Σ_e ω_lse Σ_{T ⊆ D} t_leT` — no big-M, no fractional spread;
* replicas per class m[l,e,k] ∈ [1, min(n_k, R)] when k ∈ T (0 else), for
  pages per class, copies per class (`m − previous replicas in k`), leases
  and quotas;
* the replica count j (binary b[l,e,j]) for the count cut
  `z_ls ≥ ω_lse / (j · v_max)` of the replica-count model;
* optionally (`CutFamilies`) union cuts (the q busiest experts of a scenario with n
  replicas among them lie on at most n chiplets) and rigid cuts (P||Cmax: if
  the kC + 1 busiest all have one replica, some chiplet holds k + 1 of them).

Every placement maps to a point of this model with the same misses and NoP,
no more copies, and makespans that satisfy every cut (they are cuts of the
exact model for unions of classes, and count cuts), so its optimum bounds the
window objective from below. Classes must hold every page together
(Σ_{l,e} m[l,e,k] ≤ Σ_{c ∈ k} M_c); the per-chiplet split within a class is
what it leaves out (the bin packing of rigid experts inside a class).

Two ways to solve it:

* **joint** — one MILP over all layers (`ClassModel` without prices; its LP
  relaxation alone is `class_lp_bound`, which `exact` uses, and `class_lp_certificate` the same
  bound with its duals keyed by named rows, which check_bound.py recomputes without a solver);
* **Lagrangian** (`lagrangian_value`) — the pages per class, the budget and the
  quotas are the only constraints across layers; priced by μ_k, ν, ρ_t ≥ 0
  every layer is its own small MILP, and for any prices

      L(μ, ν, ρ) = Σ_l layer_opt_l(μ, ν, ρ) − Σ_k μ_k M_k − ν B − Σ_t ρ_t Q_t

  is a lower bound (a layer not solved to optimality contributes its proven
  dual bound). The prices are tuned by a projected subgradient.

`decompose` runs both, builds a placement from the joint model's classes and
counts (chiplets by least load within each class, then the local search of
refine.py and the annealing of anneal.py), and returns the bound, per-layer
bounds, multipliers, the placement and the time per phase. See formulations/residency.md, "Layer
decomposition bound".
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field

import highspy
import numpy as np

from comoe_opt.best_split.cut_condition import related_speeds
from comoe_opt.deadline import Deadline
from comoe_opt.errors import ComoeError
from comoe_opt.highs import INF, DirectModel, HighsOutcome, lp_work, mip_work
from comoe_opt.residency.bounds.check_bound import BoundCertificate, certificate_facts
from comoe_opt.residency.problem import ResidencyProblem
from comoe_opt.residency.schedule import LAGRANGIAN_NODES
from comoe_opt.results import Status

MAX_CLASSES = 6  # types are subsets of classes: 2^K − 1 of them
MIN_LAYER_S = 0.2  # a Lagrangian layer solve gets at least this long, even past the budget
# a price step's length relative to the prices' norm (`stepped_lagrangian`); GPT-OSS window 16: the best
# of the grid in benchmarks/studies/bench_prices.py is 0.58 times the LP prices' norm away from them
PRICE_STEP = 0.5
PRICE_STEPS = 20  # ... at most this many (a work limit: without a time limit it still ends)


@dataclass(frozen=True)
class DeviceClasses:
    """Chiplets grouped by (speed, NoP): within a class any two are interchangeable."""

    of: np.ndarray  # [C] class of each chiplet
    speed: np.ndarray  # [K] relative speed of one chiplet of the class
    nop: np.ndarray  # [K] NoP per token of the class
    size: np.ndarray  # [K] chiplets in the class
    capacity: np.ndarray  # [K] pages the class holds together

    @property
    def count(self) -> int:
        return int(self.size.size)

    def types(self) -> np.ndarray:
        """Every nonempty set of classes as a bit mask, [2^K − 1]."""
        return np.arange(1, 1 << self.count, dtype=np.int64)

    def members(self, k: int) -> np.ndarray:
        return np.flatnonzero(self.of == k)


def device_classes(problem: ResidencyProblem) -> DeviceClasses:
    """Group the chiplets by speed and NoP (speeds from the scenario work, which must be related)."""
    if problem.scenarios == 0:
        raise ComoeError("the class bound needs balance scenarios (policy.balance_scenarios > 0)")
    speeds = related_speeds(problem.scenario_work)
    if speeds is None:
        raise ComoeError("the class bound needs chiplets related by one speed factor")
    nop = problem.nop_ms_per_token
    keys = [(round(float(v), 12), round(float(n), 15)) for v, n in zip(speeds, nop, strict=True)]
    distinct = sorted(set(keys), key=lambda k: (k[1], -k[0]))
    if len(distinct) > MAX_CLASSES:
        raise ComoeError(
            f"{len(distinct)} chiplet classes (speed, NoP); the class bound handles at most {MAX_CLASSES}"
        )
    of = np.array([distinct.index(k) for k in keys], dtype=np.int64)
    size = np.bincount(of, minlength=len(distinct))
    capacity = np.bincount(of, weights=problem.capacity_pages, minlength=len(distinct)).astype(np.int64)
    speed = np.array([speeds[of == k][0] for k in range(len(distinct))])
    nop = np.array([problem.nop_ms_per_token[of == k][0] for k in range(len(distinct))])
    return DeviceClasses(of, speed, nop, size, capacity)


@dataclass(frozen=True)
class Prices:
    """Lagrange multipliers of the constraints that couple layers (all ≥ 0)."""

    class_pages: np.ndarray  # [K] μ_k per page in class k
    budget: float = 0.0  # ν per page
    quota: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [tenants] ρ_t per owned page

    @classmethod
    def of_duals(cls, coupling_duals: dict[str, list[float]]) -> Prices:
        """The prices of a certificate's coupling duals (HiGHS's duals of ≤ rows in a minimisation,
        ≤ 0; a wrong-signed one is taken as 0)."""

        def flipped(key: str) -> np.ndarray:
            return np.maximum(-np.asarray(coupling_duals[key], dtype=np.float64), 0.0)

        return cls(flipped("class_pages"), float(flipped("budget").sum()), flipped("quota"))

    def constant(self, problem: ResidencyProblem, classes: DeviceClasses) -> float:
        """Σ_k μ_k M_k + ν B + Σ_t ρ_t Q_t: subtracted from the sum of the layers' optima."""
        quotas = np.array([t.max_pages for t in problem.tenants], dtype=np.float64)
        return float(
            self.class_pages @ classes.capacity + self.budget * problem.budget_pages + self.quota @ quotas
        )


@dataclass(frozen=True)
class CutFamilies:
    """Which combinatorial cuts the class model adds beyond the class-union and count cuts."""

    union: bool = True  # pigeonhole on the busiest experts' replica counts (`_union_cuts`)
    rigid: bool = True  # P||Cmax on single-replica experts (`_rigid_cuts`)


@dataclass
class _LayerColumns:
    """Column indices of one layer's variables in a model (for reading solutions)."""

    t: np.ndarray  # [E, types]
    m: np.ndarray  # [E, K] (-1 where the class cannot be used)
    z: np.ndarray  # [S]


class ClassModel:
    """The class model of some layers in one HiGHS model; with `prices`, the coupling rows are
    left out and priced into the objective instead (one layer's Lagrangian subproblem)."""

    def __init__(
        self,
        problem: ResidencyProblem,
        classes: DeviceClasses,
        layers: list[int],
        prices: Prices | None = None,
        cuts: CutFamilies | None = None,
    ):
        self.p, self.classes, self.layers, self.prices = problem, classes, layers, prices
        self.cuts = cuts if cuts is not None else CutFamilies()
        self.lp = DirectModel()
        self.cols: dict[int, _LayerColumns] = {}
        self._page_columns: list[tuple[int, int, int, int]] = []  # (column, layer, expert, class)
        self.offset = 0.0
        # for the bound certificate (check_bound.py): each row's family and indices, in row order;
        # each layer's columns [first, end), count columns J [E] and offset; columns the model
        # leaves unbounded above, with an upper bound every placement's image meets
        self.row_keys: list[tuple] = []
        self.layer_columns: dict[int, tuple[int, int]] = {}
        self.count_columns: dict[int, np.ndarray] = {}
        self.layer_offset: dict[int, float] = {}
        self.implied_upper: dict[int, float] = {}
        for layer in layers:
            self._add_layer(layer)
        if prices is None:
            self._coupling()
        self.lp.set_offset(self.offset)
        self.lp.flush()

    # ------------------------------------------------------------- layer

    def _row(self, key: tuple, lower: float, upper: float, index, value) -> None:
        """Queue a row named by its family and indices (`check_bound.FAMILIES`)."""
        self.row_keys.append(key)
        self.lp.add_row(lower, upper, index, value)

    def _page_cost(self, layer: int, e: int, k: int) -> float:
        if self.prices is None:
            return 0.0
        owned = sum(float(self.prices.quota[i]) for i, t in enumerate(self.p.tenants) if t.owns[layer, e])
        return float(self.prices.class_pages[k]) + self.prices.budget + owned

    def _add_layer(self, layer: int) -> None:
        p, cl, lp = self.p, self.classes, self.lp
        W, S, E, K = p.batches, p.scenarios, p.experts, cl.count
        types = cl.types()
        cap = np.minimum(cl.size, p.max_replicas)
        none = np.zeros((E, K), dtype=np.int64)
        prev = per_class(cl, p.previous.resident[layer]) if p.previous is not None else none
        lease = per_class(cl, p.leased[layer]) if p.leased is not None else none
        extra_nop = np.array([cl.nop[[k for k in range(K) if (t >> k) & 1]].min() for t in types])
        extra_nop -= p.nop_ms_per_token.min()
        unit = p.scenario_work[:, layer, :, 0]  # [S, E] on a speed-1 chiplet
        top = float(cl.speed.max())
        floor = unit.sum(axis=1) / float(cl.speed @ cl.size)
        jmax = self._useful_counts(unit, floor, top)
        t_cols = np.zeros((E, types.size), dtype=np.int64)
        m_cols = np.full((E, K), -1, dtype=np.int64)
        count_cols: dict[int, np.ndarray] = {}
        r_cols = []
        first_column = lp.columns
        self.layer_offset[layer] = W * float(p.miss_ms[layer].sum())
        self.offset += self.layer_offset[layer]
        for e in range(E):
            must = p.all_resident or lease[e].any()
            r = lp.add_columns([-W * p.miss_ms[layer, e]], [float(must)], [1.0], integer=True)
            r_cols.append(r)
            t0 = lp.add_columns(W * p.tokens[layer, e] * extra_nop, np.zeros(types.size),
                                np.ones(types.size), integer=True)  # fmt: skip
            t_cols[e] = t0 + np.arange(types.size)
            self._row(("type", layer, e), 0.0, 0.0, [*t_cols[e], r], [1.0] * types.size + [-1.0])
            for k in range(K):
                with_k = t_cols[e][(types >> k) & 1 == 1]
                col = lp.add_columns([self._page_cost(layer, e, k)], [float(lease[e, k])], [float(cap[k])],
                                     integer=True)  # fmt: skip
                m_cols[e, k] = col
                self._page_columns.append((col, layer, e, k))
                self._row(("class_lo", layer, e, k), 0.0, INF, [col, *with_k], [1.0] + [-1.0] * with_k.size)
                self._row(("class_hi", layer, e, k), -INF, 0.0, [col, *with_k],
                          [1.0] + [-float(cap[k])] * with_k.size)  # fmt: skip
                if p.copy_ms > 0:  # copies into class k: at least m − replicas already there
                    new = lp.add_columns([p.copy_ms], [0.0], [INF])
                    self.implied_upper[new] = float(cap[k])  # copies ≤ m ≤ min(n_k, R)
                    self._row(("copies", layer, e, k), -float(prev[e, k]), INF, [new, col], [1.0, -1.0])
            self._row(("replicas", layer, e), -INF, float(p.max_replicas), m_cols[e], 1.0)
            J = int(jmax[e])
            b = lp.add_columns(np.zeros(J), np.zeros(J), np.ones(J), integer=True)
            count_cols[e] = b + np.arange(J)
            self._row(("count", layer, e), 0.0, 0.0, [*count_cols[e], r], [1.0] * J + [-1.0])
            js = np.arange(1, J + 1, dtype=np.float64)
            top_j = js.copy()
            top_j[-1] = float(p.max_replicas)
            self._row(("count_lo", layer, e), 0.0, INF, [*m_cols[e], *count_cols[e]],
                      np.concatenate((np.ones(K), -js)))  # fmt: skip
            self._row(("count_hi", layer, e), -INF, 0.0, [*m_cols[e], *count_cols[e]],
                      np.concatenate((np.ones(K), -top_j)))  # fmt: skip
        z0 = lp.add_columns(np.full(S, W / S), floor, np.full(S, INF))
        slowest = float(cl.speed.min())
        for s in range(S):  # a makespan is at most the layer's work on the slowest chiplet
            self.implied_upper[z0 + s] = float(unit[s].sum()) / slowest
        self.count_columns[layer] = jmax.astype(np.int64)
        self.layer_columns[layer] = (first_column, lp.columns)
        speed_of = {d: float(sum(cl.speed[k] * cl.size[k] for k in range(K) if (d >> k) & 1)) for d in types}
        proper = types[:-1]  # the last type is every class: its cut is the floor
        inside = {int(d): (types & ~d) == 0 for d in proper}  # types T ⊆ D
        for s in range(S):
            busy = np.flatnonzero(unit[s] > 0)
            for d in proper:
                cols = t_cols[busy][:, inside[int(d)]]
                vals = np.repeat(unit[s, busy], cols.shape[1])
                key = ("class_union", layer, s, tuple(k for k in range(K) if (int(d) >> k) & 1))
                self._row(key, 0.0, INF, [z0 + s, *cols.ravel()], np.concatenate(([speed_of[int(d)]], -vals)))
            for e in busy.tolist():
                piece = unit[s, e] / top
                if piece <= floor[s] * (1 + 1e-9):
                    continue
                replicas = np.arange(1, count_cols[e].size + 1)
                self._row(("count_cut", layer, s, e), 0.0, INF, [z0 + s, *count_cols[e]],
                          np.concatenate(([1.0], -piece / replicas)))  # fmt: skip
        if self.cuts.union:
            self._union_cuts(layer, unit, floor, m_cols, np.array(r_cols), z0)
        if self.cuts.rigid:
            self._rigid_cuts(layer, unit, floor, count_cols, z0)
        self.cols[layer] = _LayerColumns(t_cols, m_cols, z0 + np.arange(S))

    def _union_cuts(
        self, layer: int, unit: np.ndarray, floor: np.ndarray, m_cols: np.ndarray, r_cols: np.ndarray, z0: int
    ) -> None:
        """Pigeonhole cuts: the q busiest experts of a scenario, with n replicas among them, are
        confined to the union of their replica sets, at most n chiplets: z ≥ W_Q / cap(n), cap(n)
        the n fastest chiplets' speed. 1 / cap is convex in n, so every chord between consecutive
        counts lies below it at every integer count: z_s ≥ chord(Σ_{e ∈ Q} replicas_e), an expert
        without a replica counting as C (it runs anywhere)."""
        p = self.p
        C = p.chiplets
        fastest = np.concatenate(([0.0], np.cumsum(np.sort(self.classes.speed[self.classes.of])[::-1])))
        for s in range(p.scenarios):
            order = np.argsort(-unit[s], kind="stable")
            total = np.cumsum(unit[s, order])
            for q in range(2, min(C, order.size) + 1):
                if unit[s, order[q - 1]] <= 0:
                    break
                work = float(total[q - 1])
                values = work / fastest[np.arange(q, C + 1)]  # f(n), n = q..C
                if values[0] <= floor[s] * (1 + 1e-9):
                    continue
                members = order[:q]
                cols = m_cols[members][m_cols[members] >= 0]
                for n in range(q, C):
                    lo, hi = values[n - q], values[n + 1 - q]
                    if lo <= floor[s] * (1 + 1e-9):
                        break
                    slope = hi - lo  # per replica; z >= lo + slope * (N - n)
                    # N = Σ m + C · Σ (1 − r):  z − slope · Σ m + slope · C · Σ r ≥ lo − slope · (n − C q)
                    index = [z0 + s, *cols, *r_cols[members]]
                    value = np.concatenate(([1.0], np.full(cols.size, -slope), np.full(q, slope * C)))
                    key = ("union_cut", layer, s, n, tuple(int(e) for e in members))
                    self._row(key, lo - slope * (n - C * q), INF, index, value)

    def _rigid_cuts(self, layer: int, unit: np.ndarray, floor: np.ndarray, count_cols: dict, z0: int) -> None:
        """P||Cmax cuts for rigid experts: if the kC + 1 busiest experts of a scenario all have one
        replica, some chiplet holds k + 1 of them, at least the k + 1 smallest of those works:

            z_s ≥ P_k · (Σ_{e ∈ Q} b[e, 1] − |Q| + 1)

        (b[e, 1] = exactly one replica; `_useful_counts` keeps j = 1 apart from "more")."""
        C = self.p.chiplets
        top = float(self.classes.speed.max())
        for s in range(unit.shape[0]):
            busy = np.flatnonzero(unit[s] > 0)
            order = busy[np.argsort(-unit[s, busy], kind="stable")]
            for k in range(1, (order.size - 1) // C + 1):
                members = order[: k * C + 1]
                smallest = float(unit[s, members[-(k + 1) :]].sum()) / top
                if smallest <= floor[s] * (1 + 1e-9):
                    continue
                singles = [count_cols[int(e)][0] for e in members]
                value = np.concatenate(([1.0], np.full(len(singles), -smallest)))
                key = ("rigid_cut", layer, s, k, tuple(int(e) for e in members))
                self._row(key, -smallest * (len(singles) - 1), INF, [z0 + s, *singles], value)

    def _useful_counts(self, unit: np.ndarray, floor: np.ndarray, top: float) -> np.ndarray:
        """J_e: replica counts whose count cut can bind (a count of J means J or more)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = unit / top / np.maximum(floor[:, None], 1e-300)
            need = np.where(floor[:, None] > 0, np.ceil(ratio - 1e-9), 1)
        # at least 2 where more than one replica is allowed: b[e, 1] then means exactly one (rigid cuts)
        return np.clip(need.max(axis=0), min(2, self.p.max_replicas), self.p.max_replicas).astype(np.int64)

    # ---------------------------------------------------------- coupling

    def _coupling(self) -> None:
        p, lp = self.p, self.lp
        lp.flush()
        first = lp.h.getNumRow()
        cols = np.array([c for c, *_ in self._page_columns], dtype=np.int64)
        cls = np.array([k for *_, k in self._page_columns], dtype=np.int64)
        for k in range(self.classes.count):
            self._row(("class_pages", k), -INF, float(self.classes.capacity[k]), cols[cls == k], 1.0)
        self._row(("budget",), -INF, float(p.budget_pages), cols, 1.0)
        rows = list(range(first, first + self.classes.count + 1))
        self.tenant_rows = np.full(len(p.tenants), -1, dtype=np.int64)  # -1: the tenant owns no column
        for i, t in enumerate(p.tenants):
            owned = [c for c, l, e, _ in self._page_columns if t.owns[l, e]]
            if owned:
                self._row(("quota", i), -INF, float(t.max_pages), owned, 1.0)
                self.tenant_rows[i] = first + len(rows)
                rows.append(first + len(rows))
        self.coupling_rows = np.array(rows[: self.classes.count + 1], dtype=np.int64)

    # --------------------------------------------------------- solutions

    def pages(self) -> np.ndarray:
        """Pages per class [K] of the solution, and per tenant."""
        values = self.lp.values()
        out = np.zeros(self.classes.count)
        for col, _, _, k in self._page_columns:
            out[k] += values[col]
        return out

    def tenant_pages(self) -> np.ndarray:
        values = self.lp.values()
        return np.array(
            [sum(values[c] for c, l, e, _ in self._page_columns if t.owns[l, e]) for t in self.p.tenants]
        )

    def counts(self) -> np.ndarray:
        """Replicas per class [L, E, K] of the solution (layers not in the model stay 0)."""
        values = self.lp.values()
        out = np.zeros((self.p.layers, self.p.experts, self.classes.count), dtype=np.int64)
        for col, l, e, k in self._page_columns:
            out[l, e, k] = int(np.rint(values[col]))
        return out


# ------------------------------------------------------------------ bounds


@dataclass
class LagrangianValue:
    """L(prices) and what the layers' solutions use of each coupled resource."""

    bound: float  # Σ_l layer bound − prices.constant + problem.constant_ms
    layer_bounds: np.ndarray  # [L] each layer's proven bound (its optimum when `closed`)
    closed: np.ndarray  # [L] bool: the layer's MILP was solved to optimality
    class_pages: np.ndarray  # [K] pages per class the layers' solutions take together
    budget_pages: float
    tenant_pages: np.ndarray  # [tenants]
    counts: np.ndarray  # [L, E, K] replicas per class of the layers' solutions
    prices: Prices  # the prices it is evaluated at


def lagrangian_value(
    problem: ResidencyProblem,
    prices: Prices,
    *,
    classes: DeviceClasses | None = None,
    deadline: Deadline | None = None,
    cuts: CutFamilies | None = None,
    layer_nodes: int | None = None,
) -> LagrangianValue:
    """Every layer's class model with the coupling priced: a lower bound for any prices ≥ 0.

    With a `deadline` each layer gets an equal part of the time left (at least `MIN_LAYER_S`);
    without one, at most `layer_nodes` (default `LAGRANGIAN_NODES`) branch-and-bound nodes; a layer
    stopped short contributes its proven dual bound."""
    classes = classes if classes is not None else device_classes(problem)
    if np.any(prices.class_pages < 0) or prices.budget < 0 or np.any(prices.quota < 0):
        raise ValueError("Lagrange multipliers of ≤ constraints must be ≥ 0")
    L = problem.layers
    bounds, closed = np.zeros(L), np.zeros(L, dtype=bool)
    pages = np.zeros(classes.count)
    tenant_pages = np.zeros(len(problem.tenants))
    counts = np.zeros((L, problem.experts, classes.count), dtype=np.int64)
    for layer in range(L):
        model = ClassModel(problem, classes, [layer], prices, cuts=cuts)
        limit = None
        if deadline is not None:
            limit = max(deadline.remaining() / (L - layer), MIN_LAYER_S)
        # without a finite time for the layer, its node limit ends it
        timed = limit is not None and math.isfinite(limit)
        nodes = layer_nodes if layer_nodes is not None else None if timed else LAGRANGIAN_NODES
        outcome = model.lp.solve(
            time_limit_s=limit, mip_gap=0.0, options=None if nodes is None else mip_work(nodes)
        )
        if not math.isfinite(outcome.bound):
            raise ComoeError(f"layer {layer}: the priced class model ended {outcome.solver_status}")
        bounds[layer] = outcome.bound
        closed[layer] = outcome.status is Status.OPTIMAL
        if outcome.status.has_solution:
            counts += model.counts()
            pages += model.pages()
            tenant_pages += model.tenant_pages() if problem.tenants else 0.0
    value = float(bounds.sum()) - prices.constant(problem, classes) + problem.constant_ms
    return LagrangianValue(value, bounds, closed, pages, float(pages.sum()), tenant_pages, counts, prices)


def stepped_lagrangian(
    problem: ResidencyProblem,
    prices: Prices,
    *,
    deadline: Deadline,
    classes: DeviceClasses | None = None,
    max_steps: int = PRICE_STEPS,
) -> LagrangianValue:
    """L at `prices`, then up to `max_steps` projected subgradient steps while the `deadline`'s time
    left covers another evaluation as long as the last one took; the best value found (valid at its
    own prices).

    Each step moves the prices by `PRICE_STEP` times their norm along the unit subgradient (pages
    taken minus pages available), halved after a step without progress, from the best prices so
    far. Steps relative to the prices' own scale, not Polyak's: GPT-OSS window 16's class LP prices
    nothing on the far class, whose pages each layer then takes freely (998 of 480), and a Polyak
    step towards 0.1% above the best moved that price by about 5e-5 of the 0.002 at which L is
    29.13 against 29.01 at the LP's (formulations/residency.md, "Scenario-group bound")."""
    classes = classes if classes is not None else device_classes(problem)
    quotas = np.array([t.max_pages for t in problem.tenants], dtype=np.float64)
    clock = deadline.clock
    began = clock()
    best = lagrangian_value(problem, prices, classes=classes, deadline=deadline)
    took, theta = clock() - began, PRICE_STEP
    for _ in range(max_steps):
        if took > deadline.remaining() or theta < PRICE_STEP / 16:
            break
        current = best.prices
        g = np.concatenate((best.class_pages - classes.capacity, [best.budget_pages - problem.budget_pages],
                            best.tenant_pages - quotas))  # fmt: skip
        scale = math.sqrt(float(current.class_pages @ current.class_pages + current.budget**2
                                + current.quota @ current.quota))  # fmt: skip
        norm = float(np.linalg.norm(g))
        if norm == 0 or scale == 0:
            break
        step = theta * scale / norm * g
        K = classes.count
        budget = max(current.budget + float(step[K]), 0.0)
        moved = Prices(np.maximum(current.class_pages + step[:K], 0.0), budget,
                       np.maximum(current.quota + step[K + 1 :], 0.0))  # fmt: skip
        began = clock()
        value = lagrangian_value(problem, moved, classes=classes, deadline=deadline)
        took = clock() - began
        if value.bound > best.bound + 1e-12 * max(1.0, abs(best.bound)):
            best = value
        else:
            theta /= 2
    return best


def per_class(classes: DeviceClasses, resident: np.ndarray) -> np.ndarray:
    """[E, C] bool → [E, K] replicas per class."""
    return np.stack([resident[:, classes.of == k].sum(axis=1) for k in range(classes.count)], axis=1)


def class_lp_bound(problem: ResidencyProblem, time_limit_s: float | None = None) -> float | None:
    """The class model's LP relaxation bound (with `problem.constant_ms`), or None where the class
    model does not apply (no scenarios, unrelated speeds, too many classes) or the LP did not
    finish. `exact` takes it beside the cut model's bound: on GPT-OSS windows it is the bound the
    cut rounds reach, in a fraction of a second."""
    solved = _class_lp(problem, time_limit_s)
    if solved is None:
        return None
    return solved[1].objective + problem.constant_ms


def _class_lp(
    problem: ResidencyProblem, time_limit_s: float | None
) -> tuple[ClassModel, HighsOutcome] | None:
    """The joint class model with its integrality relaxed, solved; None where the class model does
    not apply or the LP did not finish."""
    try:
        classes = device_classes(problem)
    except ComoeError:
        return None
    model = ClassModel(problem, classes, list(range(problem.layers)))
    n = model.lp.h.getNumCol()
    model.lp.h.changeColsIntegrality(n, np.arange(n, dtype=np.int32), np.zeros(n, dtype=np.uint8))
    outcome = model.lp.solve(time_limit_s=time_limit_s, options=lp_work(model.lp.rows, model.lp.columns))
    if outcome.status is not Status.OPTIMAL:
        return None
    return model, outcome


def class_lp_certificate(
    problem: ResidencyProblem, time_limit_s: float | None = None
) -> BoundCertificate | None:
    """The class LP bound with a certificate that `check_bound.check_certificate` recomputes from the
    problem's data without a solver (LP weak duality, formulations/residency.md "Bound
    certificate"); None where `class_lp_bound` is None.

    `bound` is L(y) at HiGHS's row duals y (wrong-signed ones taken as 0), evaluated here on the
    model HiGHS holds, with the upper bounds of `ClassModel.implied_upper` on the columns it leaves
    unbounded; `lp_objective` is `class_lp_bound`'s value. The duals are keyed by constraint family
    and indices (`check_bound.FAMILIES`); with the coupling rows' duals fixed the bound separates
    into one value per layer."""
    began = time.perf_counter()
    solved = _class_lp(problem, time_limit_s)
    if solved is None:
        return None
    model, outcome = solved
    solved_at = time.perf_counter()
    y = np.asarray(model.lp.h.getSolution().row_dual, dtype=np.float64)
    certificate = certificate_at(model, y, outcome.objective + problem.constant_ms)
    seconds = {"lp": solved_at - began, "certificate": time.perf_counter() - solved_at}
    return dataclasses.replace(certificate, seconds=seconds)


def certificate_at(model: ClassModel, duals: np.ndarray, lp_objective: float = math.nan) -> BoundCertificate:
    """The certificate of any row duals `duals` (HiGHS's row order and sign convention, d = c − Aᵀy)
    on the joint class model `model` (all layers, coupling rows in): L(duals) evaluated on the
    model HiGHS holds. Wrong-signed duals of one-sided rows are taken as 0."""
    problem = model.p
    if model.prices is not None or len(model.layers) != problem.layers:
        raise ValueError("a certificate is of the joint class model over every layer")
    h = model.lp.h
    model.lp.flush()
    lp = h.getLp()
    if len(model.row_keys) != lp.num_row_:
        raise ComoeError(f"{len(model.row_keys)} named rows for the {lp.num_row_} rows of the class model")
    y = np.array(duals, dtype=np.float64)
    lower, upper = np.asarray(lp.row_lower_), np.asarray(lp.row_upper_)
    y[((y > 0) & ~np.isfinite(lower)) | ((y < 0) & ~np.isfinite(upper))] = 0.0  # wrong sign: no row term
    row_terms = np.where(y > 0, y * np.where(np.isfinite(lower), lower, 0.0),
                         y * np.where(np.isfinite(upper), upper, 0.0))  # fmt: skip
    col_lower = np.asarray(lp.col_lower_, dtype=np.float64)
    col_upper = np.asarray(lp.col_upper_, dtype=np.float64).copy()
    for col, value in model.implied_upper.items():
        col_upper[col] = min(col_upper[col], value)
    d = np.asarray(lp.col_cost_, dtype=np.float64) - _transposed_product(lp, y)
    col_terms = np.minimum(d * col_lower, d * col_upper)
    col_terms[d == 0] = 0.0
    L = problem.layers
    layer_values = np.zeros(L)
    for layer, (first, end) in model.layer_columns.items():
        layer_values[layer] = model.layer_offset[layer] + col_terms[first:end].sum()
    if sum(end - first for first, end in model.layer_columns.values()) != lp.num_col_:
        raise ComoeError("a column of the class model belongs to no layer")
    coupling_value = 0.0
    named: list[tuple[str, tuple, float]] = []  # (row family, its index, dual) of every row with a dual
    coupling: dict[str, list[float]] = {
        "class_pages": [0.0] * model.classes.count,
        "budget": [0.0],
        "quota": [0.0] * len(problem.tenants),
    }
    for key, value, term in zip(model.row_keys, y, row_terms, strict=True):
        if value == 0:
            continue
        family, index = key[0], key[1:]
        named.append((family, index, float(value)))
        if family in ("class_pages", "budget", "quota"):
            coupling_value += float(term)
            coupling[family][index[0] if index else 0] = float(value)
        else:
            layer_values[index[0]] += float(term)
    counts = np.stack([model.count_columns[layer] for layer in range(L)])
    cuts = {"union": model.cuts.union, "rigid": model.cuts.rigid}
    facts = certificate_facts(problem, model.classes.of, counts, cuts)
    bound = float(layer_values.sum()) + coupling_value + problem.constant_ms
    return BoundCertificate(
        bound=bound,
        lp_objective=lp_objective,
        constant_ms=problem.constant_ms,
        layer_values=[float(v) for v in layer_values],
        coupling_value=coupling_value,
        coupling_duals=coupling,
        duals=named,
        facts=facts,
    )


def _transposed_product(lp, y: np.ndarray) -> np.ndarray:
    """Aᵀ y for HiGHS's constraint matrix (column- or row-wise)."""
    a = lp.a_matrix_
    start, index, value = np.asarray(a.start_), np.asarray(a.index_), np.asarray(a.value_, dtype=np.float64)
    if a.format_ == highspy.MatrixFormat.kColwise:
        col = np.repeat(np.arange(lp.num_col_), np.diff(start))
        return np.bincount(col, weights=value * y[index], minlength=lp.num_col_)
    row = np.repeat(np.arange(lp.num_row_), np.diff(start))
    return np.bincount(index, weights=value * y[row], minlength=lp.num_col_)
