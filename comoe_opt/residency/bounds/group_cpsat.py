"""One scenario group's placement as a CP-SAT model (OR-Tools), for group_bound.py.

A one-layer `ResidencyProblem` on a few scenarios, with a price per page `page_cost` [E, C]:

    min (W/S') Σ_s z_s + W Σ_e m_e (1 − r_e) + W Σ_{e,c} λ_e (n_c − min n) y_ec + Σ_{e,c} (κ[new] + p_ec) x_ec
    z_s ≥ Σ_e (ω_se / V_D) u_eD           every chiplet set D (the cut condition, cut_condition.py)
    u_eD ∨ ¬r_e ∨ ⋁_{c ∉ D} x_ec           u_eD = 1 when every replica of a resident e lies in D
    y_ec ≤ x_ec, Σ_c y_ec = r_e             NoP to one replica; x_ec ≤ r_e ≤ Σ_c x_ec
    capacity, budget, replicas per expert, leases, quotas, all_resident as in residency/models/cut_model.py

CP-SAT is integral: every cost coefficient is scaled by `scale` and rounded **down**, and z_s is an
integer, so each placement's model value is at most `scale · S'` times its true value plus S' · W
(the rounding up of each z_s); the reported bound subtracts that, so it stays a lower bound of
the group's true optimum. CP-SAT detects the symmetry of interchangeable chiplets itself (its
`symmetry_level`), which the LP-based cut model (cut_model.py) cannot use: on a GPT-OSS layer the cut
model did not close even one scenario in 10 s (formulations/residency.md, "Scenario-group bound").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from comoe_opt.best_split import sets as device_sets
from comoe_opt.best_split.cut_condition import MAX_ENUMERATED_CHIPLETS, CutTable, speeds_of
from comoe_opt.residency.problem import ResidencyProblem

# CP-SAT's deterministic time (its own work units, about seconds on a desktop core) for a group
# without a time limit: the test groups close in well under one
WORK_LIMIT = 60.0
SCALE_DIGITS = 1e7  # the objective's scale: its largest term maps to about this many integer units


@dataclass(frozen=True)
class CpSatGroup:
    bound: float  # a proven lower bound of the group's objective (without `constant_ms`)
    value: float  # the best placement's objective by the model's (rounded) costs, inf without one
    resident: np.ndarray | None  # [E, C] the best placement found
    closed: bool


def solve_group_cpsat(
    problem: ResidencyProblem,
    page_cost: np.ndarray,
    *,
    time_limit_s: float | None = None,
    work_limit: float | None = None,
) -> CpSatGroup:
    """The group's bound by CP-SAT on one worker (deterministic: a work limit — CP-SAT's
    deterministic time, `WORK_LIMIT` when neither limit is given — gives the same answer on any
    machine)."""
    sub = _Model(problem, page_cost)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    if time_limit_s is not None and math.isfinite(time_limit_s):
        solver.parameters.max_time_in_seconds = max(time_limit_s, 0.01)
    timed = time_limit_s is not None and math.isfinite(time_limit_s)
    if work_limit is not None or not timed:  # never unbounded: CP-SAT's deterministic time by default
        solver.parameters.max_deterministic_time = WORK_LIMIT if work_limit is None else work_limit
    status = solver.solve(sub.model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return CpSatGroup(-math.inf, math.inf, None, False)
    return sub.read(solver, status == cp_model.OPTIMAL)


class _Model:
    def __init__(self, p: ResidencyProblem, page_cost: np.ndarray):
        if p.layers != 1:
            raise ValueError("a group is one layer")
        if p.chiplets > MAX_ENUMERATED_CHIPLETS:  # one row per chiplet set: 2^C of them
            raise ValueError(
                f"the cpsat group solver enumerates the 2^C chiplet sets: {p.chiplets} chiplets is more"
                f" than {MAX_ENUMERATED_CHIPLETS}; use the 'cuts' solver"
            )
        E, C, S, W = p.experts, p.chiplets, p.scenarios, p.batches
        self.p, m = p, cp_model.CpModel()
        self.model = m
        speeds = speeds_of(p.scenario_work)
        table = CutTable.for_speeds(speeds)
        unit = p.scenario_work[:, 0, :, 0]  # [S, E] on a unit-speed chiplet
        prev = p.previous.resident[0] if p.previous is not None else np.zeros((E, C), dtype=bool)
        extra_nop = p.nop_ms_per_token - p.nop_ms_per_token.min()
        x_cost = np.where(prev, 0.0, p.copy_ms) + np.broadcast_to(page_cost, (E, C))
        y_cost = W * p.tokens[0][:, None] * extra_nop[None, :]
        largest = max(W * float(unit.sum(axis=1).max()) / float(speeds.min()), float(np.abs(x_cost).max()),
                      float(y_cost.max()), W * float(p.miss_ms.max()), 1e-12)  # fmt: skip
        self.scale = SCALE_DIGITS / largest
        # the objective times S (so that z's coefficient is the integer W), scaled, rounded down
        factor = self.scale * S
        self.factor = factor
        x = [[m.new_bool_var(f"x{e}_{c}") for c in range(C)] for e in range(E)]
        r = [m.new_bool_var(f"r{e}") for e in range(E)]
        lease = p.leased[0] if p.leased is not None else np.zeros((E, C), dtype=bool)
        objective = []
        for e in range(E):
            for c in range(C):
                m.add_implication(x[e][c], r[e])
                if lease[e, c]:
                    m.add(x[e][c] == 1)
                objective.append(math.floor(factor * x_cost[e, c]) * x[e][c])
            m.add_bool_or(x[e]).only_enforce_if(r[e])
            m.add(sum(x[e]) <= p.max_replicas)
            if p.all_resident:
                m.add(r[e] == 1)
            objective.append(math.floor(-factor * W * p.miss_ms[0, e]) * r[e])
            if extra_nop.any() and p.tokens[0, e] > 0:
                y = [m.new_bool_var(f"y{e}_{c}") for c in range(C)]
                for c in range(C):
                    m.add_implication(y[c], x[e][c])
                    objective.append(math.floor(factor * y_cost[e, c]) * y[c])
                m.add(sum(y) == r[e])
        for c in range(C):
            m.add(sum(x[e][c] for e in range(E)) <= int(p.capacity_pages[c]))
        m.add(sum(x[e][c] for e in range(E) for c in range(C)) <= int(p.budget_pages))
        for t in p.tenants:
            owned = [x[e][c] for e in np.flatnonzero(t.owns[0]) for c in range(C)]
            if owned:
                m.add(sum(owned) <= int(t.max_pages))
        busy = np.flatnonzero(unit.max(axis=0) > 0)
        floor = unit.sum(axis=1) / float(speeds.sum())
        top = math.ceil(self.scale * float(unit.sum(axis=1).max()) / float(speeds.min())) + 1
        z = [m.new_int_var(math.floor(self.scale * floor[s]), top, f"z{s}") for s in range(S)]
        u = {}
        for d, mask in enumerate(table.sets[:-1]):  # the last set is every chiplet: z's lower bound
            outside = [c for c in range(C) if not (device_sets.as_int(mask) >> c) & 1]
            for e in busy.tolist():
                u[e, d] = m.new_bool_var(f"u{e}_{d}")
                m.add_bool_or([u[e, d], ~r[e], *(x[e][c] for c in outside)])
            for s in range(S):
                coef = [math.floor(self.scale * unit[s, e] / table.capacity[d]) for e in busy]
                if sum(coef) > self.scale * floor[s]:
                    m.add(z[s] >= sum(k * u[e, d] for k, e in zip(coef, busy.tolist(), strict=True) if k > 0))
        objective += [W * zs for zs in z]
        m.minimize(sum(objective))
        self.x, self.offset = x, W * float(p.miss_ms.sum())

    def read(self, solver: cp_model.CpSolver, optimal: bool) -> CpSatGroup:
        """Bound and value back in ms (the bound less what rounding each z up may have added)."""
        bound = (solver.best_objective_bound - self.p.batches * self.p.scenarios) / self.factor + self.offset
        value = solver.objective_value / self.factor + self.offset
        resident = np.array([[solver.boolean_value(v) for v in row] for row in self.x], dtype=bool)
        return CpSatGroup(float(bound), float(value), resident, optimal)
