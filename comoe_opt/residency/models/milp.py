"""Pyomo models of the slow loop (see formulations/residency.md).

* `build_full_model` — the residency MILP as stated: binary `x[l,e,c]`,
  residency `u[l,e]`, token shares `s[l,e,c]`, per-layer makespan `z[l]`.
  Exact, but symmetric in identical chiplets and large (L·E·C binaries).
* `build_replica_model` — the same problem over replica *counts*: binary
  `w[l,e,j]` = "(l, e) has exactly j replicas". Every placement maps to a
  feasible point of it with no larger objective, so its optimum (and its LP
  relaxation) bounds the full model from below; it has no chiplet symmetry
  and only L·E·J binaries, J the useful replica counts (1–3 in practice).

Both take a `ResidencyProblem` and return a `pyo.ConcreteModel` whose
objective is the window objective in ms.
"""

from __future__ import annotations

import numpy as np
import pyomo.environ as pyo

from comoe_opt.best_split.shares import share_lp
from comoe_opt.residency.problem import ResidencyProblem


def useful_replicas(problem: ResidencyProblem) -> np.ndarray:
    """J[l, e]: the most replicas that can pay off.

    A replica beyond `ceil(work / floor_l)` cannot lower the layer's makespan
    below its floor `floor_l = Σ_e min_c work / C`, so it only costs pages.
    Leased replicas are kept whatever they are worth.
    """
    piece = problem.work_ms.min(axis=2)
    floor = piece.sum(axis=1, keepdims=True) / problem.chiplets
    need = _replicas_to_floor(piece, floor)
    if problem.scenarios:  # a burst may need more replicas than the mean load (scenario cuts)
        s_piece, s_floor = scenario_floors(problem)
        need = np.maximum(need, _replicas_to_floor(s_piece, s_floor[..., None]).max(axis=0))
    useful = np.clip(need, 1, problem.max_replicas).astype(np.int64)
    demand = (problem.tokens > 0) | (problem.miss_ms > 0) | (piece > 0)
    useful = np.where(demand | problem.all_resident, useful, 0)
    return np.maximum(useful, problem.leased_replicas())


def _replicas_to_floor(piece: np.ndarray, floor: np.ndarray) -> np.ndarray:
    """Replicas that bring a work `piece` down to the `floor` (1 where the floor is 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(floor > 0, np.ceil(piece / np.maximum(floor, 1e-300) - 1e-9), 1)


def scenario_floors(problem: ResidencyProblem) -> tuple[np.ndarray, np.ndarray]:
    """Per scenario: each expert's least work [S, L, E] and the layer's even split [S, L]."""
    piece = problem.scenario_work.min(axis=3)
    return piece, piece.sum(axis=2) / problem.chiplets


def build_replica_model(problem: ResidencyProblem) -> pyo.ConcreteModel:
    """The replica-count model: a lower bound on the full model, and its replica counts."""
    m = pyo.ConcreteModel(name="replica_counts")
    jmax = useful_replicas(problem)
    piece = problem.work_ms.min(axis=2)
    floor = piece.sum(axis=1) / problem.chiplets
    W = problem.batches
    m.LE = pyo.Set(initialize=[(l, e) for l, e in zip(*np.nonzero(jmax), strict=True)], dimen=2)
    m.LEJ = pyo.Set(initialize=[(l, e, j) for l, e in m.LE for j in range(1, int(jmax[l, e]) + 1)], dimen=3)
    m.L = pyo.RangeSet(0, problem.layers - 1)
    m.w = pyo.Var(m.LEJ, domain=pyo.Binary)
    # with scenarios, balance is the scenarios' mean makespan and only their own cuts hold:
    # the mean load's floor and cuts need related chiplet speeds (Jensen) and are implied then
    mean_load = not problem.scenarios
    m.z = pyo.Var(m.L, bounds=lambda _, l: (float(floor[l]) if mean_load else 0.0, None))

    def one_count(m, l, e):
        chosen = sum(m.w[l, e, j] for j in _js(jmax, l, e))
        return chosen == 1 if problem.all_resident else chosen <= 1

    m.one_count = pyo.Constraint(m.LE, rule=one_count)

    def replicas(m, l, e):
        return sum(j * m.w[l, e, j] for j in _js(jmax, l, e))

    # slowest chiplet: an expert with j replicas puts at least work/j on one chiplet
    heavy = [(l, e) for l, e in m.LE if mean_load and piece[l, e] > floor[l] * (1 + 1e-9)]
    m.makespan = pyo.Constraint(
        pyo.Set(initialize=heavy, dimen=2),
        rule=lambda m, l, e: m.z[l] >= sum(piece[l, e] / j * m.w[l, e, j] for j in _js(jmax, l, e)),
    )
    if problem.scenarios:
        _scenario_cuts(m, problem, jmax)
    pages = sum(replicas(m, l, e) for l, e in m.LE)
    if len(m.LE):  # with no expert worth a page, there is nothing to limit
        m.capacity = pyo.Constraint(expr=pages <= problem.page_limit)
    leased = problem.leased_replicas()
    m.lease = pyo.Constraint(
        pyo.Set(initialize=[(l, e) for l, e in m.LE if leased[l, e] > 0], dimen=2),
        rule=lambda m, l, e: replicas(m, l, e) >= int(leased[l, e]),
    )
    if problem.tenants:
        m.T = pyo.RangeSet(0, len(problem.tenants) - 1)
        m.quota = pyo.Constraint(
            m.T,
            rule=lambda m, t: _at_most(
                [replicas(m, l, e) for l, e in m.LE if problem.tenants[t].owns[l, e]],
                problem.tenants[t].max_pages,
            ),
        )
    copies = _copies(m, problem, jmax, replicas)
    miss = sum(
        float(problem.miss_ms[l, e]) * (1 - sum(m.w[l, e, j] for j in _js(jmax, l, e))) for l, e in m.LE
    )
    # the least NoP (problem.constant_ms) is left out: HiGHS's gap is then on what a placement changes
    m.obj = pyo.Objective(expr=W * (sum(m.z[l] for l in m.L) + miss) + copies, sense=pyo.minimize)
    m.jmax = jmax  # kept for reading the solution
    return m


def _scenario_cuts(m: pyo.ConcreteModel, problem: ResidencyProblem, jmax: np.ndarray) -> None:
    """z_l ≥ mean_s z_ls, with z_ls ≥ the scenario's even split and ≥ min_c ω_lse / j.

    Valid because each scenario's best-routing makespan obeys the same two
    cuts as the mean load; `useful_replicas` caps j only where ω_lse / j is
    below the scenario floor anyway.
    """
    piece, floor = scenario_floors(problem)
    scenarios = range(problem.scenarios)
    m.zs = pyo.Var(m.L, scenarios, bounds=lambda _, l, s: (float(floor[s, l]), None))
    heavy = [(l, s, e) for l, e in m.LE for s in scenarios if piece[s, l, e] > floor[s, l] * (1 + 1e-9)]
    m.scenario_makespan = pyo.Constraint(
        pyo.Set(initialize=heavy, dimen=3),
        rule=lambda m, l, s, e: m.zs[l, s] >= sum(piece[s, l, e] / j * m.w[l, e, j] for j in _js(jmax, l, e)),
    )
    m.scenario_mean = pyo.Constraint(
        m.L, rule=lambda m, l: m.z[l] >= sum(m.zs[l, s] for s in scenarios) / problem.scenarios
    )


def _at_most(terms: list, limit: int) -> object:
    """`sum(terms) <= limit`, or no constraint when there are no terms (a tenant with no pages to place)."""
    return sum(terms) <= limit if terms else pyo.Constraint.Skip


def _js(jmax: np.ndarray, l: int, e: int) -> range:
    return range(1, int(jmax[l, e]) + 1)


def _copies(m: pyo.ConcreteModel, problem: ResidencyProblem, jmax: np.ndarray, replicas) -> object:
    """Pages copied: at least the replicas beyond those already resident."""
    if problem.copy_ms == 0:
        return 0.0
    prev = problem.previous_replicas()
    m.new = pyo.Var(m.LE, domain=pyo.NonNegativeReals)
    m.copied = pyo.Constraint(m.LE, rule=lambda m, l, e: m.new[l, e] >= replicas(m, l, e) - int(prev[l, e]))
    return problem.copy_ms * sum(m.new[l, e] for l, e in m.LE)


def replica_counts(m: pyo.ConcreteModel, problem: ResidencyProblem) -> np.ndarray:
    """Replica counts [L, E] of a solved replica model."""
    counts = np.zeros((problem.layers, problem.experts), dtype=np.int64)
    for (l, e, j), var in m.w.items():
        if var.value is not None and var.value > 0.5:
            counts[l, e] = j
    return counts


def set_replica_counts(m: pyo.ConcreteModel, problem: ResidencyProblem, counts: np.ndarray) -> None:
    """Load `counts` as the model's starting point (a warm start)."""
    for (l, e, j), var in m.w.items():
        var.set_value(1.0 if counts[l, e] == j else 0.0)
    piece = problem.work_ms.min(axis=2)
    share = np.where(counts > 0, 1.0 / np.maximum(counts, 1), 0.0)
    zs = None
    if hasattr(m, "zs"):
        s_piece, s_floor = scenario_floors(problem)
        zs = np.maximum(s_floor, (s_piece * share[None]).max(axis=2))  # [S, L]
        for (l, s), var in m.zs.items():
            set_start(var, float(zs[s, l]))
    for l in m.L:
        z = max(m.z[l].lb, float((piece[l] * share[l]).max(initial=0.0)))
        if zs is not None:
            z = max(z, float(zs[:, l].mean()))
        set_start(m.z[l], z)
    if hasattr(m, "new"):
        prev = problem.previous_replicas()
        for (l, e), var in m.new.items():
            var.set_value(float(max(0, counts[l, e] - prev[l, e])))


def set_start(var: pyo.Var, value: float) -> None:
    """A warm-start value, inside the variable's bounds: LP shares may exceed 1 by round-off
    (1.0000000000000002), which Pyomo reports as a warning for every such variable."""
    lower, upper = var.bounds
    if lower is not None:
        value = max(value, lower)
    if upper is not None:
        value = min(value, upper)
    var.set_value(value)


def build_full_model(problem: ResidencyProblem) -> pyo.ConcreteModel:
    """The residency MILP over x[l,e,c] (exact; for small instances and for checking)."""
    m = pyo.ConcreteModel(name="residency")
    L, E, C = problem.layers, problem.experts, problem.chiplets
    W = problem.batches
    m.L, m.E, m.C = pyo.RangeSet(0, L - 1), pyo.RangeSet(0, E - 1), pyo.RangeSet(0, C - 1)
    m.x = pyo.Var(m.L, m.E, m.C, domain=pyo.Binary)
    m.u = pyo.Var(m.L, m.E, domain=pyo.Binary)
    m.capacity = pyo.Constraint(
        m.C, rule=lambda m, c: sum(m.x[l, e, c] for l in m.L for e in m.E) <= int(problem.capacity_pages[c])
    )
    m.budget = pyo.Constraint(expr=sum(m.x.values()) <= problem.budget_pages)
    m.replicas = pyo.Constraint(
        m.L, m.E, rule=lambda m, l, e: sum(m.x[l, e, c] for c in m.C) <= problem.max_replicas
    )
    m.resident = pyo.Constraint(m.L, m.E, rule=lambda m, l, e: m.u[l, e] <= sum(m.x[l, e, c] for c in m.C))
    if problem.all_resident:
        for var in m.u.values():
            var.fix(1)
    m.any_copy = pyo.Constraint(m.L, m.E, m.C, rule=lambda m, l, e, c: m.x[l, e, c] <= m.u[l, e])
    if problem.scenarios:
        balance, nop = _scenario_balance(m, problem)
    else:
        balance, nop = _mean_load_balance(m, problem)
    if problem.leased is not None:
        for l, e, c in zip(*np.nonzero(problem.leased), strict=True):
            m.x[l, e, c].fix(1)
    if problem.tenants:
        m.T = pyo.RangeSet(0, len(problem.tenants) - 1)
        m.quota = pyo.Constraint(
            m.T,
            rule=lambda m, t: _at_most(
                [
                    m.x[l, e, c]
                    for l, e in zip(*np.nonzero(problem.tenants[t].owns), strict=True)
                    for c in m.C
                ],
                problem.tenants[t].max_pages,
            ),
        )
    prev = problem.previous.resident if problem.previous is not None else np.zeros((L, E, C), dtype=bool)
    copies = sum(m.x[l, e, c] for l in m.L for e in m.E for c in m.C if not prev[l, e, c])
    miss = sum(float(problem.miss_ms[l, e]) * (1 - m.u[l, e]) for l in m.L for e in m.E)
    m.obj = pyo.Objective(expr=W * (balance + miss + nop) + problem.copy_ms * copies, sense=pyo.minimize)
    return m


def _mean_load_balance(m: pyo.ConcreteModel, problem: ResidencyProblem) -> tuple[object, object]:
    """Token shares s[l,e,c] of the mean load: balance Σ_l z_l and NoP on those shares."""
    m.s = pyo.Var(m.L, m.E, m.C, bounds=(0, 1))
    m.z = pyo.Var(m.L, domain=pyo.NonNegativeReals)
    m.split = pyo.Constraint(m.L, m.E, rule=lambda m, l, e: sum(m.s[l, e, c] for c in m.C) == 1)
    # a resident expert runs only on its replicas; a non-resident one anywhere
    m.on_replica = pyo.Constraint(
        m.L, m.E, m.C, rule=lambda m, l, e, c: m.s[l, e, c] <= m.x[l, e, c] + 1 - m.u[l, e]
    )
    m.makespan = pyo.Constraint(
        m.L,
        m.C,
        rule=lambda m, l, c: sum(float(problem.work_ms[l, e, c]) * m.s[l, e, c] for e in m.E) <= m.z[l],
    )
    extra = _extra_nop(problem)
    nop = sum(float(extra[c] * problem.tokens[l, e]) * m.s[l, e, c] for l in m.L for e in m.E for c in m.C)
    return sum(m.z.values()), nop


def _scenario_balance(m: pyo.ConcreteModel, problem: ResidencyProblem) -> tuple[object, object]:
    """Each scenario routed at its best: shares t[l,s,e,c] per scenario, balance the mean of the
    scenarios' makespans z[l,s]; NoP sends every token to its expert's nearest replica (y)."""
    work = problem.scenario_work
    S = problem.scenarios
    busy = [(l, s, e) for l in m.L for s in range(S) for e in m.E if work[s, l, e].max() > 0]
    m.LSE = pyo.Set(initialize=busy, dimen=3)
    m.t = pyo.Var(m.LSE, m.C, bounds=(0, 1))
    m.zs = pyo.Var(m.L, range(S), domain=pyo.NonNegativeReals)
    m.split = pyo.Constraint(m.LSE, rule=lambda m, l, s, e: sum(m.t[l, s, e, c] for c in m.C) == 1)
    m.on_replica = pyo.Constraint(
        m.LSE, m.C, rule=lambda m, l, s, e, c: m.t[l, s, e, c] <= m.x[l, e, c] + 1 - m.u[l, e]
    )
    by_layer: dict[tuple[int, int], list[int]] = {}
    for l, s, e in busy:
        by_layer.setdefault((l, s), []).append(e)
    m.makespan = pyo.Constraint(
        pyo.Set(initialize=[(l, s, c) for (l, s) in by_layer for c in m.C], dimen=3),
        rule=lambda m, l, s, c: (
            sum(float(work[s, l, e, c]) * m.t[l, s, e, c] for e in by_layer[l, s]) <= m.zs[l, s]
        ),
    )
    m.y = pyo.Var(m.L, m.E, m.C, bounds=(0, 1))
    m.nearest = pyo.Constraint(m.L, m.E, rule=lambda m, l, e: sum(m.y[l, e, c] for c in m.C) == 1)
    m.y_on_replica = pyo.Constraint(
        m.L, m.E, m.C, rule=lambda m, l, e, c: m.y[l, e, c] <= m.x[l, e, c] + 1 - m.u[l, e]
    )
    extra = _extra_nop(problem)
    nop = sum(float(extra[c] * problem.tokens[l, e]) * m.y[l, e, c] for l in m.L for e in m.E for c in m.C)
    return sum(m.zs.values()) / S, nop


def _extra_nop(problem: ResidencyProblem) -> np.ndarray:
    """NoP per token beyond the least (the least is `problem.constant_ms`, left out of the models)."""
    return problem.nop_ms_per_token - problem.nop_ms_per_token.min()


def set_full_start(m: pyo.ConcreteModel, problem: ResidencyProblem, resident: np.ndarray) -> None:
    """Load a placement (with its exact shares) as the full model's starting point."""
    from comoe_opt.residency.objective import layer_shares  # objective imports nothing from here

    for (l, e, c), var in m.x.items():
        if not var.fixed:
            var.set_value(float(resident[l, e, c]))
    for (l, e), var in m.u.items():
        if not var.fixed:
            var.set_value(float(resident[l, e].any()))
    if problem.scenarios:
        _set_scenario_start(m, problem, resident)
        return
    for l in range(problem.layers):
        z, _, shares = layer_shares(problem, resident[l], l)
        set_start(m.z[l], z)
        for e in range(problem.experts):
            row = _start_row(shares[e], resident[l, e])
            for c in range(problem.chiplets):
                set_start(m.s[l, e, c], float(row[c]))


def _start_row(shares: np.ndarray, resident: np.ndarray) -> np.ndarray:
    """An expert's shares as a feasible start: its LP shares, else spread over its replicas (or all)."""
    if shares.sum() > 0:
        return shares
    if resident.any():
        return resident / resident.sum()
    return np.full(resident.size, 1.0 / resident.size)


def _set_scenario_start(m: pyo.ConcreteModel, problem: ResidencyProblem, resident: np.ndarray) -> None:
    for l in range(problem.layers):
        for s in range(problem.scenarios):
            z, _, shares = share_lp(problem.scenario_work[s, l], resident[l])
            set_start(m.zs[l, s], z)
            for e in range(problem.experts):
                if (l, s, e) in m.LSE:
                    row = _start_row(shares[e], resident[l, e])
                    for c in range(problem.chiplets):
                        set_start(m.t[l, s, e, c], float(row[c]))
        nop = np.where(resident[l], problem.nop_ms_per_token[None, :], np.inf)
        nop = np.where(resident[l].any(axis=1, keepdims=True), nop, problem.nop_ms_per_token[None, :])
        nearest = nop.argmin(axis=1)
        for (l2, e, c), var in m.y.items():
            if l2 == l:
                var.set_value(float(c == nearest[e]))


def full_model_placement(m: pyo.ConcreteModel, problem: ResidencyProblem) -> np.ndarray:
    out = np.zeros((problem.layers, problem.experts, problem.chiplets), dtype=bool)
    for (l, e, c), var in m.x.items():
        out[l, e, c] = var.value is not None and var.value > 0.5
    return out
