"""The share LP: the best split of each expert's work over its replicas, for one layer.

    min  z + Σ_{e,c} cost_ec · s_ec
    s.t. Σ_c s_ec = 1                  for every active expert
         s_ec = 0 unless c holds e     (an expert with no replica may run anywhere)
         Σ_e work_ec · s_ec ≤ z        for every chiplet c

solved with HiGHS through SciPy's `linprog` (when every expert has one chiplet, its shares are
the only feasible ones and no LP is needed). `objective.layer_shares` adds
NoP as the cost; the scenario makespans (best_split/cut_condition.py) use it without.
"""

from __future__ import annotations

import numpy as np


def share_lp(
    work: np.ndarray, resident: np.ndarray, cost: np.ndarray | None = None, active: np.ndarray | None = None
) -> tuple[float, float, np.ndarray]:
    """(z, objective, shares [E, C]) for expert work [E, C] on the replica map `resident` [E, C].

    `active` (default: experts with work or cost) are the experts that must be served.
    """
    experts, chiplets = resident.shape
    cost = np.zeros((experts, chiplets)) if cost is None else cost
    if active is None:
        active = np.flatnonzero((work.sum(axis=1) > 0) | (cost.sum(axis=1) > 0))
    shares = np.zeros((experts, chiplets))
    if active.size == 0:
        return 0.0, 0.0, shares
    allowed = resident[active] | ~resident[active].any(axis=1, keepdims=True)
    e_idx, c_idx = np.nonzero(allowed)
    if e_idx.size == active.size:  # one chiplet per expert: the only feasible shares are optimal
        shares[active, c_idx] = 1.0
        loads = np.bincount(c_idx, weights=work[active, c_idx], minlength=chiplets)
        z = max(float(loads.max()), 0.0)
        return z, z + float(cost[active, c_idx].sum()), shares
    return solve_share_lp(work, cost, active, allowed)


def solve_share_lp(
    work: np.ndarray, cost: np.ndarray, active: np.ndarray, allowed: np.ndarray
) -> tuple[float, float, np.ndarray]:
    """The share LP through HiGHS, for the `active` experts on their `allowed` [A, C] chiplets."""
    import scipy.sparse as sp  # here: placements scored by cuts or by forced shares need no SciPy
    from scipy.optimize import linprog

    experts, chiplets = work.shape
    shares = np.zeros((experts, chiplets))
    e_idx, c_idx = np.nonzero(allowed)
    n = e_idx.size
    # columns: s for each allowed (expert, chiplet) pair, then z
    objective = np.concatenate((cost[active][e_idx, c_idx], [1.0]))
    a_eq = sp.csr_matrix((np.ones(n), (e_idx, np.arange(n))), shape=(active.size, n + 1))
    rows = np.concatenate((c_idx, np.arange(chiplets)))
    cols = np.concatenate((np.arange(n), np.full(chiplets, n)))
    vals = np.concatenate((work[active][e_idx, c_idx], -np.ones(chiplets)))
    a_ub = sp.csr_matrix((vals, (rows, cols)), shape=(chiplets, n + 1))
    res = linprog(
        objective,
        A_ub=a_ub,
        b_ub=np.zeros(chiplets),
        A_eq=a_eq,
        b_eq=np.ones(active.size),
        bounds=(0, None),
        method="highs",
    )
    if res.status != 0:
        raise RuntimeError(f"share LP failed: {res.message}")
    shares[active[e_idx], c_idx] = res.x[:n]
    return float(res.x[n]), float(res.fun), shares
