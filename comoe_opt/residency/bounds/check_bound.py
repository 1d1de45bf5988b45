"""Check the class model's LP bound without a solver: weak duality on rows rebuilt from the data.

`class_lp_certificate` (decompose.py) solves the LP relaxation of the hop-class model and hands
out its row duals y, each keyed by a named constraint family and its indices (`FAMILIES`), not by
a solver's row number. For a minimisation `min c·x + c0` over `lo ≤ A x ≤ up`, `l ≤ x ≤ u`, every
y gives the lower bound

    L(y) = c0 + Σ_i (y_i · lo_i if y_i > 0 else y_i · up_i) + Σ_j min(d_j · l_j, d_j · u_j),
    d = c − Aᵀ y,

so a checker needs no trust in y, only in the rows it builds itself. `recompute` builds, from the
`ResidencyProblem`'s arrays alone (scenario work, NoP per chiplet, miss costs, tokens, pages,
budget, quotas, leases, the previous placement), the objective, the column bounds and every row the
certificate names, as formulations/residency.md states them ("Layer decomposition bound",
"Bound certificate"), and evaluates L(y) with numpy. It shares no code with the model builder
(`ClassModel`), nor with the objective's cut enumeration: a wrong row there is not repeated here.

Robustness:

* a dual of the wrong sign for a one-sided row is taken as 0 (`Recomputed.projected` counts them);
  duplicate keys add up (both are the same row);
* columns the model leaves unbounded above get upper bounds that every placement's image meets:
  a scenario's makespan `z_ls ≤ Σ_e ω_lse / min_c v_c` (all of the layer's work on the slowest
  chiplet) and copies into a class `new_lek ≤ min(|k|, R)`. So L(y) is finite for every y and
  bounds the window objective of every placement from below: it is a bound of the class model
  restricted to a box that holds every placement's image;
* the rows hold for any chiplet grouping: a type's NoP is the least NoP in its classes, the
  capacity of a union of classes the sum of its chiplets' speeds (the certificate's grouping
  need not be checked, only the speeds, which must be related: `ω_lsec = ω_lse0 / v_c`);
* a count cut's last count column means "J or more replicas" (below R), so its coefficient is
  capped at the scenario's floor (`Σ_e ω_lse / Σ_c v_c`), below every makespan;
* an index out of range, a class set or member list that is not a set, or facts (dimensions, the
  constant, the limits) that do not match the problem raise `CertificateError`.

This module imports numpy and the problem's data class only, so that it runs where no solver does.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from comoe_opt.errors import ComoeError
from comoe_opt.residency.problem import ResidencyProblem

KIND = "comoe-opt class LP bound certificate"
VERSION = 1

# family -> its indices, as the certificate names a row (sets are sorted lists of ints)
FAMILIES: dict[str, str] = {
    "type": "(layer, expert): Σ_T t[T] − r = 0",
    "class_lo": "(layer, expert, class k): m[k] − Σ_{T ∋ k} t[T] ≥ 0",
    "class_hi": "(layer, expert, class k): m[k] − min(|k|, R) Σ_{T ∋ k} t[T] ≤ 0",
    "copies": "(layer, expert, class k): new[k] − m[k] ≥ −(previous replicas in k)",
    "replicas": "(layer, expert): Σ_k m[k] ≤ R",
    "count": "(layer, expert): Σ_j b[j] − r = 0",
    "count_lo": "(layer, expert): Σ_k m[k] − Σ_j j·b[j] ≥ 0",
    "count_hi": "(layer, expert): Σ_k m[k] − Σ_{j<J} j·b[j] − R·b[J] ≤ 0",
    "class_union": "(layer, scenario, classes D): V_D z − Σ_e ω_e Σ_{T ⊆ D} t_e[T] ≥ 0",
    "count_cut": "(layer, scenario, expert): z − Σ_j ω_e / (j v_max) b_e[j] ≥ 0 (last: capped at the floor)",
    "union_cut": "(layer, scenario, n, experts Q): z ≥ chord_n(Σ_{e ∈ Q} (Σ_k m_e[k] + C (1 − r_e)))",
    "rigid_cut": "(layer, scenario, k, experts Q): z − P Σ_{e ∈ Q} b_e[1] ≥ −P (|Q| − 1)",
    "class_pages": "(class k): Σ_{l,e} m[l,e,k] ≤ Σ_{c ∈ k} M_c",
    "budget": "(): Σ_{l,e,k} m[l,e,k] ≤ B",
    "quota": "(tenant t): Σ_{(l,e) ∈ O_t, k} m[l,e,k] ≤ Q_t",
}
COUPLING = ("class_pages", "budget", "quota")
_ARITY = {
    "type": 2, "class_lo": 3, "class_hi": 3, "copies": 3, "replicas": 2, "count": 2, "count_lo": 2,
    "count_hi": 2, "class_union": 3, "count_cut": 3, "union_cut": 4, "rigid_cut": 4,
    "class_pages": 1, "budget": 0, "quota": 1,
}  # fmt: skip

Index = tuple[Any, ...]  # ints, and for class sets and member lists a tuple of ints
Row = tuple[np.ndarray, np.ndarray, float, float, int]  # columns, coefficients, lower, upper, layer


class CertificateError(ComoeError):
    """A certificate that does not fit the problem (its facts, a row's indices)."""


@dataclass(frozen=True)
class BoundCertificate:
    """A lower bound on the window objective that `check_certificate` recomputes without a solver.

    `bound` is L(y) (module docstring) plus `constant_ms`, evaluated by the producer on the solver's
    own rows; `lp_objective` is the LP optimum the solver reported (`class_lp_bound`), which L at
    the solver's duals matches up to its tolerances. With the coupling rows' duals fixed the bound
    separates by layer: `bound = Σ layer_values + coupling_value + constant_ms`, `coupling_value`
    = Σ over the coupling rows of y · upper (≤ 0)."""

    bound: float
    lp_objective: float  # nan for duals not from a solve (`decompose.certificate_at`)
    constant_ms: float
    layer_values: list[float]
    coupling_value: float
    coupling_duals: dict[str, list[float]]  # "class_pages" [K], "budget" [1], "quota" [tenants]
    duals: list[tuple[str, Index, float]]  # (family, indices, y) of every row with y ≠ 0
    facts: dict[str, Any]  # what the problem must match (`certificate_facts`)
    seconds: dict[str, float] = field(default_factory=dict)  # solve and certificate time

    def to_json(self) -> str:
        return json.dumps(
            {
                "kind": KIND,
                "version": VERSION,
                "bound": self.bound,
                "lp_objective": self.lp_objective if math.isfinite(self.lp_objective) else None,
                "constant_ms": self.constant_ms,
                "layer_values": self.layer_values,
                "coupling_value": self.coupling_value,
                "coupling_duals": self.coupling_duals,
                "facts": self.facts,
                "seconds": self.seconds,
                "duals": [[family, _listed(index), y] for family, index, y in self.duals],
            },
            allow_nan=False,
        )

    @classmethod
    def from_json(cls, text: str) -> BoundCertificate:
        data = json.loads(text)
        if data.get("kind") != KIND or data.get("version") != VERSION:
            raise CertificateError(f"not a {KIND} (version {VERSION})")
        return cls(
            bound=float(data["bound"]),
            lp_objective=math.nan if data["lp_objective"] is None else float(data["lp_objective"]),
            constant_ms=float(data["constant_ms"]),
            layer_values=[float(v) for v in data["layer_values"]],
            coupling_value=float(data["coupling_value"]),
            coupling_duals={k: [float(v) for v in vs] for k, vs in data["coupling_duals"].items()},
            duals=[(str(f), _tupled(index), float(y)) for f, index, y in data["duals"]],
            facts=data["facts"],
            seconds={k: float(v) for k, v in data.get("seconds", {}).items()},
        )


def _listed(index: Index) -> list:
    return [_listed(i) if isinstance(i, tuple) else i for i in index]


def _tupled(index: list) -> Index:
    return tuple(_tupled(i) if isinstance(i, list) else int(i) for i in index)


def certificate_facts(
    problem: ResidencyProblem, classes_of: np.ndarray, counts: np.ndarray, cuts: dict[str, bool]
) -> dict[str, Any]:
    """What a checker matches before recomputing: dimensions, limits, the constant, the chiplet
    classes (`classes_of` [C]) and the count columns J per (layer, expert) (`counts` [L, E])."""
    return {
        "layers": problem.layers,
        "experts": problem.experts,
        "chiplets": problem.chiplets,
        "scenarios": problem.scenarios,
        "batches": problem.batches,
        "classes_of": [int(k) for k in classes_of],
        "count_columns": np.asarray(counts, dtype=np.int64).tolist(),
        "max_replicas": problem.max_replicas,
        "budget_pages": problem.budget_pages,
        "tenants": len(problem.tenants),
        "all_resident": bool(problem.all_resident),
        "copy_ms": float(problem.copy_ms),
        "constant_ms": problem.constant_ms,
        "cuts": cuts,
        "data_sha256": data_digest(problem),
    }


def data_digest(problem: ResidencyProblem) -> str:
    """SHA-256 of the arrays the bound is computed from (float64 bytes): tells a certificate of
    another window apart. Informational only: a certificate of other data still gives a valid,
    usually weaker, bound, and the same data computed elsewhere may differ in the last bits."""
    digest = hashlib.sha256()
    arrays = [
        problem.scenario_work_ms,
        problem.miss_ms,
        problem.tokens,
        problem.nop_ms_per_token,
        problem.capacity_pages,
        problem.leased,
        None if problem.previous is None else problem.previous.resident,
    ]
    arrays += [t.owns for t in problem.tenants]
    for a in arrays:
        digest.update(b"-" if a is None else np.ascontiguousarray(a, dtype=np.float64).tobytes())
    return digest.hexdigest()


@dataclass(frozen=True)
class Recomputed:
    """L(y) recomputed from the problem's data: the bound and its parts."""

    bound: float
    layer_values: np.ndarray  # [L]
    coupling_value: float
    rows: int  # distinct rows named
    projected: int  # duals of the wrong sign taken as 0
    same_data: bool  # the certificate's data digest is the problem's (`data_digest`)


def check_certificate(problem: ResidencyProblem, certificate: BoundCertificate) -> float:
    """The bound the certificate's duals prove for `problem`, recomputed from the problem's data
    (valid whatever the duals; raises `CertificateError` when the certificate does not fit)."""
    return recompute(problem, certificate).bound


def recompute(problem: ResidencyProblem, certificate: BoundCertificate) -> Recomputed:
    """`check_certificate` with the per-layer shares (module docstring)."""
    try:
        data = _Data(problem, certificate.facts)
    except (KeyError, TypeError, ValueError) as exc:
        raise CertificateError(f"the certificate's facts are incomplete or malformed: {exc!r}") from exc
    y: dict[tuple[str, Index], float] = {}
    for family, index, value in certificate.duals:
        if family not in FAMILIES:
            raise CertificateError(f"unknown constraint family {family!r}")
        if not math.isfinite(value):
            raise CertificateError(f"dual of {family}{index} is {value}")
        y[(family, index)] = y.get((family, index), 0.0) + float(value)
    n = data.columns
    aty = np.zeros(n)
    row_terms = np.zeros(problem.layers + 1)  # the last: coupling rows
    projected = 0
    for (family, index), value in y.items():
        try:
            cols, coefs, lo, up, layer = data.row(family, index)
        except (TypeError, ValueError) as exc:
            raise CertificateError(f"{family}{index}: malformed indices ({exc!r})") from exc
        if (value > 0 and lo == -math.inf) or (value < 0 and up == math.inf):
            projected += 1
            continue
        if value == 0:
            continue
        row_terms[layer] += value * (lo if value > 0 else up)
        np.add.at(aty, cols, value * coefs)
    d = data.cost - aty
    col_terms = np.minimum(d * data.lower, d * data.upper)
    layer_values = row_terms[:-1] + data.offset + np.bincount(data.layer_of, col_terms, problem.layers)
    coupling = float(row_terms[-1])
    bound = float(layer_values.sum()) + coupling + data.constant
    same = certificate.facts.get("data_sha256") == data_digest(problem)
    return Recomputed(bound, layer_values, coupling, len(y), projected, same)


class _Data:
    """The class model's columns, objective and bounds, and its rows by name, from the problem."""

    def __init__(self, p: ResidencyProblem, facts: dict[str, Any]):
        self.p = p
        _check_facts(p, facts)
        # the constant: every token's least NoP, W Σ λ min_c n_c
        nop = np.asarray(p.nop_ms_per_token, dtype=np.float64)
        self.constant = p.batches * float(np.sum(p.tokens)) * float(nop.min())
        if not math.isclose(float(facts["constant_ms"]), self.constant, rel_tol=1e-9, abs_tol=1e-12):
            raise CertificateError(
                f"certificate's constant {facts['constant_ms']} is not the problem's {self.constant}"
            )
        work = p.scenario_work_ms
        assert work is not None  # _check_facts refused a problem without balance scenarios
        self.speed = _speeds(work)  # [C], chiplet 0 has speed 1
        self.unit = work[..., 0].transpose(1, 0, 2)  # [L, S, E] on chiplet 0
        self._classes(np.asarray(facts["classes_of"], dtype=np.int64))
        J = np.asarray(facts["count_columns"], dtype=np.int64)
        R = p.max_replicas
        if J.shape != (p.layers, p.experts) or J.min() < min(2, R) or J.max() > R:
            # b[e, 1] must mean exactly one replica (rigid cuts) where two are allowed
            raise CertificateError(f"count_columns must be [L, E] within [{min(2, R)}, {R}]")
        self.J = J
        self._columns(nop)

    def _classes(self, of: np.ndarray) -> None:
        """The chiplet classes (`classes_of`), their capacities and speeds, and the types (every
        nonempty set of classes)."""
        p, C = self.p, self.p.chiplets
        if of.shape != (C,) or of.min() < 0:
            raise CertificateError(f"classes_of must give each of the {C} chiplets a class")
        K = int(of.max()) + 1
        if set(of.tolist()) != set(range(K)):
            raise CertificateError("classes_of leaves a class number without chiplets")
        if K > 16:
            raise CertificateError(f"{K} chiplet classes: types are subsets, at most 16 classes")
        self.of, self.K = of, K
        size = np.bincount(of, minlength=K)
        self.cap = np.minimum(size, p.max_replicas)  # replicas per class and expert
        self.pages = np.bincount(of, weights=p.capacity_pages, minlength=K)
        self.class_speed = np.bincount(of, weights=self.speed, minlength=K)  # Σ v_c over the class
        self.types = np.arange(1, 1 << K, dtype=np.int64)  # every nonempty set of classes
        self.has = ((self.types[:, None] >> np.arange(K)) & 1).astype(bool)  # [T, K]

    def _columns(self, nop: np.ndarray) -> None:
        """Columns r [L, E], t [L, E, T], m [L, E, K], new [L, E, K], b [L, E, jmax], z [L, S]:
        their indices, layers, costs and bounds."""
        p, of, K = self.p, self.of, self.K
        L, E, S, W, T = p.layers, p.experts, p.scenarios, p.batches, self.types.size
        jmax = int(self.J.max())
        # per (l, e) leases, previous replicas per class, and whether (l, e) must be resident
        lease = np.zeros((L, E, K))
        prev = np.zeros((L, E, K))
        for k in range(K):
            if p.leased is not None:
                lease[..., k] = p.leased[..., of == k].sum(axis=2)
            if p.previous is not None:
                prev[..., k] = p.previous.resident[..., of == k].sum(axis=2)
        self.prev = prev
        must = np.full((L, E), bool(p.all_resident)) | (lease.sum(axis=2) > 0)
        sizes = {
            "r": (L, E),
            "t": (L, E, T),
            "m": (L, E, K),
            "new": (L, E, K),
            "b": (L, E, jmax),
            "z": (L, S),
        }
        first = 0
        self.index: dict[str, np.ndarray] = {}
        layer_of = []
        for name, shape in sizes.items():
            count = int(np.prod(shape))
            self.index[name] = first + np.arange(count).reshape(shape)
            layer_of.append(
                np.broadcast_to(np.arange(L).reshape((L,) + (1,) * (len(shape) - 1)), shape).ravel()
            )
            first += count
        self.columns = first
        self.layer_of = np.concatenate(layer_of)
        cost = np.zeros(first)
        lower = np.zeros(first)
        upper = np.zeros(first)

        def put(name: str, c: Any, lo: Any, up: Any) -> None:
            i = self.index[name].ravel()
            shape = self.index[name].shape
            cost[i] = np.broadcast_to(c, shape).ravel()
            lower[i] = np.broadcast_to(lo, shape).ravel()
            upper[i] = np.broadcast_to(up, shape).ravel()

        class_nop = np.array([nop[of == k].min() for k in range(K)])
        type_nop = np.array([class_nop[self.has[i]].min() for i in range(T)]) - nop.min()
        miss = np.asarray(p.miss_ms, dtype=np.float64)
        tokens = np.asarray(p.tokens, dtype=np.float64)
        put("r", -W * miss, must.astype(np.float64), 1.0)
        put("t", W * tokens[..., None] * type_nop, 0.0, 1.0)
        put("m", 0.0, lease, self.cap.astype(np.float64))
        put("new", p.copy_ms, 0.0, self.cap.astype(np.float64))
        exists = np.arange(1, jmax + 1) <= self.J[..., None]
        put("b", 0.0, 0.0, exists.astype(np.float64))
        total = self.unit.sum(axis=2)  # [L, S]
        self.floor = total / self.speed.sum()
        put("z", W / S, self.floor, total / self.speed.min())
        self.cost, self.lower, self.upper = cost, lower, upper
        self.offset = W * miss.sum(axis=1)  # [L] misses if nothing were resident
        # the n fastest chiplets' speed, n = 0..C
        self.fastest = np.concatenate(([0.0], np.cumsum(np.sort(self.speed)[::-1])))

    # ------------------------------------------------------------------ rows

    def row(self, family: str, index: Index) -> Row:
        """(columns, coefficients, lower, upper, layer) of a named row; layer L for coupling rows."""
        if len(index) != _ARITY[family]:
            raise CertificateError(f"{family} takes {_ARITY[family]} indices, got {index}")
        return _ROWS[family](self, index)

    # coupling rows (layer L)

    def _class_pages(self, index: Index) -> Row:
        m, L, E = self.index["m"], self.p.layers, self.p.experts
        k = self._int(index[0], self.K, "class")
        return m[..., k].ravel(), np.ones(L * E), -math.inf, float(self.pages[k]), L

    def _budget(self, index: Index) -> Row:
        m = self.index["m"]
        return m.ravel(), np.ones(m.size), -math.inf, float(self.p.budget_pages), self.p.layers

    def _quota(self, index: Index) -> Row:
        t = self._int(index[0], len(self.p.tenants), "tenant")
        tenant = self.p.tenants[t]
        cols = self.index["m"][np.asarray(tenant.owns, dtype=bool)].ravel()
        return cols, np.ones(cols.size), -math.inf, float(tenant.max_pages), self.p.layers

    # scenario rows: (layer, scenario, ...)

    def _scenario(self, index: Index) -> tuple[int, int, int, np.ndarray]:
        """(layer, scenario, its z column, its work [E]) of a scenario row."""
        layer = self._int(index[0], self.p.layers, "layer")
        s = self._int(index[1], self.p.scenarios, "scenario")
        return layer, s, self.index["z"][layer, s], self.unit[layer, s]

    def _class_union(self, index: Index) -> Row:
        layer, _, z, work = self._scenario(index)
        classes = self._set(index[2], self.K, "class")
        d = sum(1 << k for k in classes)
        inside = (self.types & ~d) == 0  # types T ⊆ D
        cols = self.index["t"][layer][:, inside]  # [E, n]
        capacity = float(self.class_speed[list(classes)].sum())
        coefs = np.repeat(work, cols.shape[1])
        return np.concatenate(([z], cols.ravel())), np.concatenate(([capacity], -coefs)), 0.0, math.inf, layer

    def _count_cut(self, index: Index) -> Row:
        layer, s, z, work = self._scenario(index)
        e = self._int(index[2], self.p.experts, "expert")
        J = int(self.J[layer, e])
        js = np.arange(1, J + 1, dtype=np.float64)
        piece = work[e] / (self.speed.max() * js)
        if self.J[layer, e] < self.p.max_replicas:  # the last column is "J or more" replicas
            piece[-1] = min(piece[-1], self.floor[layer, s])
        cols = self.index["b"][layer, e, :J]
        return np.concatenate(([z], cols)), np.concatenate(([1.0], -piece)), 0.0, math.inf, layer

    def _union_cut(self, index: Index) -> Row:
        layer, _, z, work = self._scenario(index)
        C = self.p.chiplets
        mem = list(self._set(index[3], self.p.experts, "expert"))
        q = len(mem)
        n = self._int(index[2], C, "replica count")
        if n < 1:
            raise CertificateError(f"union_cut{index}: n must be in 1..{C - 1}")
        work_q = float(work[mem].sum())
        lo, hi = work_q / self.fastest[n], work_q / self.fastest[n + 1]
        slope = hi - lo  # per replica, ≤ 0
        m_cols = self.index["m"][layer][mem].ravel()
        r_cols = self.index["r"][layer][mem]
        cols = np.concatenate(([z], m_cols, r_cols))
        coefs = np.concatenate(([1.0], np.full(m_cols.size, -slope), np.full(q, slope * C)))
        return cols, coefs, lo - slope * (n - C * q), math.inf, layer

    def _rigid_cut(self, index: Index) -> Row:
        layer, _, z, work = self._scenario(index)
        E, C = self.p.experts, self.p.chiplets
        mem = list(self._set(index[3], E, "expert"))
        q = len(mem)
        k = self._int(index[2], E + 1, "k")
        if k < 1 or q < k * C + 1:
            raise CertificateError(f"rigid_cut{index}: needs k ≥ 1 and at least kC + 1 experts")
        smallest = float(np.sort(work[mem])[: k + 1].sum()) / float(self.speed.max())
        b1 = self.index["b"][layer][mem, 0]
        return np.concatenate(([z], b1)), np.concatenate(([1.0], np.full(q, -smallest))), \
            -smallest * (q - 1), math.inf, layer  # fmt: skip

    # expert rows: (layer, expert, ...)

    def _expert(self, index: Index) -> tuple[int, int, int]:
        """(layer, expert, its count columns J) of an expert row."""
        layer = self._int(index[0], self.p.layers, "layer")
        e = self._int(index[1], self.p.experts, "expert")
        return layer, e, int(self.J[layer, e])

    def _type(self, index: Index) -> Row:
        layer, e, _ = self._expert(index)
        t, r = self.index["t"][layer, e], self.index["r"][layer, e]
        return np.append(t, r), np.append(np.ones(t.size), -1.0), 0.0, 0.0, layer

    def _replicas(self, index: Index) -> Row:
        layer, e, _ = self._expert(index)
        return self.index["m"][layer, e], np.ones(self.K), -math.inf, float(self.p.max_replicas), layer

    def _count(self, index: Index) -> Row:
        layer, e, J = self._expert(index)
        b, r = self.index["b"][layer, e], self.index["r"][layer, e]
        return np.append(b[:J], r), np.append(np.ones(J), -1.0), 0.0, 0.0, layer

    def _count_lo(self, index: Index) -> Row:
        layer, e, J = self._expert(index)
        m, b = self.index["m"][layer, e], self.index["b"][layer, e]
        js = np.arange(1, J + 1, dtype=np.float64)
        return np.concatenate((m, b[:J])), np.concatenate((np.ones(self.K), -js)), 0.0, math.inf, layer

    def _count_hi(self, index: Index) -> Row:
        layer, e, J = self._expert(index)
        m, b = self.index["m"][layer, e], self.index["b"][layer, e]
        top = np.arange(1, J + 1, dtype=np.float64)
        top[-1] = float(self.p.max_replicas)
        return np.concatenate((m, b[:J])), np.concatenate((np.ones(self.K), -top)), -math.inf, 0.0, layer

    def _with_class(self, index: Index) -> tuple[int, int, int, np.ndarray]:
        """(layer, expert, class k, the type columns of the types holding k) of a class row."""
        layer, e, _ = self._expert(index)
        k = self._int(index[2], self.K, "class")
        return layer, e, k, self.index["t"][layer, e][self.has[:, k]]

    def _class_lo(self, index: Index) -> Row:
        layer, e, k, with_k = self._with_class(index)
        m = self.index["m"][layer, e]
        return np.append(m[k], with_k), np.append(1.0, -np.ones(with_k.size)), 0.0, math.inf, layer

    def _class_hi(self, index: Index) -> Row:
        layer, e, k, with_k = self._with_class(index)
        m, cap = self.index["m"][layer, e], float(self.cap[k])
        return np.append(m[k], with_k), np.append(1.0, np.full(with_k.size, -cap)), -math.inf, 0.0, layer

    def _copies(self, index: Index) -> Row:
        layer, e, k, _ = self._with_class(index)
        new, m = self.index["new"][layer, e, k], self.index["m"][layer, e]
        return np.array([new, m[k]]), np.array([1.0, -1.0]), -float(self.prev[layer, e, k]), math.inf, layer

    @staticmethod
    def _int(value: Any, size: int, what: str) -> int:
        if isinstance(value, tuple) or not 0 <= int(value) < size:
            raise CertificateError(f"{what} index {value} out of range (0..{size - 1})")
        return int(value)

    def _set(self, value: Any, size: int, what: str) -> tuple[int, ...]:
        if not isinstance(value, tuple) or not value:
            raise CertificateError(f"expected a nonempty list of {what} indices, got {value}")
        items = tuple(self._int(v, size, what) for v in value)
        if len(set(items)) != len(items):
            raise CertificateError(f"{what} indices {value} repeat")
        return items


# each family's row builder (FAMILIES names the rows)
_ROWS: dict[str, Callable[[_Data, Index], Row]] = {
    "type": _Data._type,
    "class_lo": _Data._class_lo,
    "class_hi": _Data._class_hi,
    "copies": _Data._copies,
    "replicas": _Data._replicas,
    "count": _Data._count,
    "count_lo": _Data._count_lo,
    "count_hi": _Data._count_hi,
    "class_union": _Data._class_union,
    "count_cut": _Data._count_cut,
    "union_cut": _Data._union_cut,
    "rigid_cut": _Data._rigid_cut,
    "class_pages": _Data._class_pages,
    "budget": _Data._budget,
    "quota": _Data._quota,
}


def _check_facts(p: ResidencyProblem, facts: dict[str, Any]) -> None:
    """The certificate's facts match the problem's sizes, tenants and copy time."""
    if p.scenario_work_ms is None:
        raise CertificateError("the problem has no balance scenarios")
    for name in ("layers", "experts", "chiplets", "scenarios", "batches", "max_replicas", "budget_pages"):
        if int(facts[name]) != int(getattr(p, name)):
            raise CertificateError(
                f"certificate for {name} = {facts[name]}, the problem has {getattr(p, name)}"
            )
    if int(facts["tenants"]) != len(p.tenants) or bool(facts["all_resident"]) != bool(p.all_resident):
        raise CertificateError("certificate's tenants or all_resident do not match the problem")
    if not math.isclose(float(facts["copy_ms"]), p.copy_ms, rel_tol=1e-12, abs_tol=0.0):
        raise CertificateError(f"certificate for copy_ms = {facts['copy_ms']}, the problem has {p.copy_ms}")


def _speeds(work: np.ndarray) -> np.ndarray:
    """Chiplet speeds v [C] relative to chiplet 0 with work[..., c] = work[..., 0] / v_c; raises
    when the chiplets are not related by one speed factor (the rows assume they are)."""
    base = work[..., 0]
    positive = base > 0
    if not positive.any():
        if np.any(work != 0):
            raise CertificateError("chiplet 0 has no work where others have: speeds are not related")
        return np.ones(work.shape[-1])
    ratio = work[positive] / base[positive][:, None]  # [n, C]: work on c relative to chiplet 0
    speed = 1.0 / ratio[0]
    if not np.all(ratio[0] > 0) or not np.allclose(ratio, ratio[0], rtol=1e-9, atol=0.0):
        raise CertificateError("chiplet speeds are not related by one factor: the class bound does not apply")
    if np.any(work[~positive] != 0):
        raise CertificateError("chiplet 0 has no work where others have: speeds are not related")
    return speed
