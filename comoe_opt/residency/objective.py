"""The slow-loop objective of a placement, evaluated exactly.

For a fixed placement, the best token shares of each layer are a small LP
(best_split/shares.py):

    min  z_l + Σ_{e,c} nop_c · λ_le · s_lec
    s.t. Σ_c s_lec = 1                    for every expert with demand
         s_lec = 0 unless c holds (l, e)  (an expert with no replica may run anywhere)
         Σ_e work_lec · s_lec <= z_l      for every chiplet c

The window objective adds the on-demand loads of non-resident experts and
the copies from the previous placement:

    J = W · Σ_l (z_l + nop_l + Σ_e miss_le · [no replica]) + copy_ms · pages copied

With `problem.split = "even"` (the engines' even split), z_l and NoP are the even split's
instead (residency/even_split.py): never below the best split's, so its bounds hold.

With balance scenarios (`problem.scenarios > 0`), z_l is instead the mean
over the scenarios of each one's best-routing makespan (best_split/cut_condition.py), and
NoP is each expert's tokens sent to its nearest replica — the two are
scored apart, as the fast loop routes each micro-batch anew; both terms are
at least their mean-load counterparts' lower bounds in the replica-count
model, which therefore still bounds J.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from comoe_opt.best_split.cut_condition import makespans_at, related_speeds
from comoe_opt.best_split.shares import share_lp
from comoe_opt.errors import ComoeError
from comoe_opt.residency.even_split import chiplet_work, even_layer
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.problem import ResidencyProblem


@dataclass(frozen=True)
class ObjectiveTerms:
    """The window objective split into its terms (all in ms over the window)."""

    balance_ms: float  # W · Σ_l z_l: slowest chiplet's expected expert work
    miss_ms: float  # W · on-demand loads of experts with no replica
    nop_ms: float  # W · token link time to the chosen chiplets
    migration_ms: float  # pages copied · copy time
    pages_moved: int
    layer_makespan_ms: tuple[float, ...]  # z_l per micro-batch
    layer_balance: tuple[float, ...]  # mean / max expected chiplet work per layer (1 = even)

    @property
    def total(self) -> float:
        return self.balance_ms + self.miss_ms + self.nop_ms + self.migration_ms

    def to_dict(self) -> dict[str, float | int]:
        return {
            "total_ms": self.total,
            "balance_ms": self.balance_ms,
            "miss_ms": self.miss_ms,
            "nop_ms": self.nop_ms,
            "migration_ms": self.migration_ms,
            "pages_moved": self.pages_moved,
            "expected_balance": self.expected_balance,
        }

    @property
    def expected_balance(self) -> float:
        """Mean over layers of mean / max expected chiplet work."""
        return float(np.mean(self.layer_balance)) if self.layer_balance else 1.0


def check_feasible(problem: ResidencyProblem, placement: Placement) -> list[str]:
    """Constraint violations of a placement (empty when feasible)."""
    problems = []
    used = placement.pages_per_chiplet()
    for c in np.flatnonzero(used > problem.capacity_pages):
        problems.append(f"chiplet {c} holds {used[c]} pages > capacity {problem.capacity_pages[c]}")
    if placement.pages > problem.budget_pages:
        problems.append(f"{placement.pages} pages > replica budget {problem.budget_pages}")
    if placement.replicas().max(initial=0) > problem.max_replicas:
        problems.append(f"an expert has more than {problem.max_replicas} replicas")
    if problem.leased is not None and np.any(problem.leased & ~placement.resident):
        problems.append("a leased replica was evicted")
    if problem.all_resident and not placement.resident.any(axis=2).all():
        problems.append("an expert has no replica but every expert must stay resident")
    for tenant in problem.tenants:
        pages = int(placement.resident[tenant.owns].sum())
        if pages > tenant.max_pages:
            problems.append(f"tenant {tenant.name} holds {pages} pages > quota {tenant.max_pages}")
    return problems


def score(problem: ResidencyProblem, placement: Placement) -> ObjectiveTerms:
    """Exact objective of `placement` (raises if it violates a constraint)."""
    violations = check_feasible(problem, placement)
    if violations:
        raise ComoeError("infeasible placement: " + "; ".join(violations))
    w = problem.batches
    resident_any = placement.resident.any(axis=2)
    miss = float((problem.miss_ms * ~resident_any).sum())
    makespans, nops, balance = [], [], []
    for layer in range(problem.layers):
        if problem.scenarios or problem.split == "even":
            z, nop, even = layer_terms(problem, placement.resident[layer], layer)
            makespans.append(z)
            nops.append(nop)
            balance.append(even)
            continue
        z, nop, shares = layer_shares(problem, placement.resident[layer], layer)
        makespans.append(z)
        nops.append(nop)
        busy = (problem.work_ms[layer] * shares).sum(axis=0)
        balance.append(float(busy.mean() / busy.max()) if busy.max() > 0 else 1.0)
    moved = placement.pages_moved_from(problem.previous)
    return ObjectiveTerms(
        balance_ms=w * float(sum(makespans)),
        miss_ms=w * miss,
        nop_ms=w * float(sum(nops)),
        migration_ms=problem.copy_ms * moved,
        pages_moved=moved,
        layer_makespan_ms=tuple(makespans),
        layer_balance=tuple(balance),
    )


def layer_terms(problem: ResidencyProblem, resident: np.ndarray, layer: int) -> tuple[float, float, float]:
    """(makespan, NoP, balance) of one layer under the split the problem is planned for: the best
    split's on the scenarios, or the even split's (residency/even_split.py)."""
    if problem.split == "even":
        return even_layer(problem, resident, layer)
    return scenario_layer(problem, resident, layer)


def scenario_makespans(problem: ResidencyProblem, resident: np.ndarray, layer: int) -> np.ndarray:
    """[S] each balance scenario's makespan of one layer under the split planned for."""
    if problem.split == "even":
        return chiplet_work(problem, resident, layer).max(axis=1)
    return makespans_at(problem.scenario_work[:, layer], resident, layer_speeds(problem, layer))


def layer_makespan(problem: ResidencyProblem, resident: np.ndarray, layer: int) -> float:
    """z_l of one layer: the scenarios' or the split's (layer_terms), else the mean load's LP."""
    if problem.scenarios or problem.split == "even":
        return layer_terms(problem, resident, layer)[0]
    return layer_shares(problem, resident, layer)[0]


def scenario_layer(problem: ResidencyProblem, resident: np.ndarray, layer: int) -> tuple[float, float, float]:
    """(mean scenario makespan, nearest-replica NoP, mean scenario balance) of one layer."""
    work = problem.scenario_work[:, layer]  # [S, E, C]
    z = makespans_at(work, resident, layer_speeds(problem, layer))
    floor = work.min(axis=2).sum(axis=1) / problem.chiplets
    even = np.where(z > 0, floor / np.where(z > 0, z, 1.0), 1.0)
    return float(z.mean()), nearest_nop(problem, resident, layer), float(even.mean())


def nearest_nop(problem: ResidencyProblem, resident: np.ndarray, layer: int) -> float:
    """NoP of one layer with every token sent to its expert's nearest replica (anywhere if none)."""
    nop = np.where(resident, problem.nop_ms_per_token[None, :], np.inf).min(axis=1)
    nop = np.where(np.isfinite(nop), nop, problem.nop_ms_per_token.min())
    return float((problem.tokens[layer] * nop).sum())


_SHARES: weakref.WeakKeyDictionary[ResidencyProblem, dict] = weakref.WeakKeyDictionary()
_SPEEDS: weakref.WeakKeyDictionary[ResidencyProblem, dict] = weakref.WeakKeyDictionary()


def layer_speeds(problem: ResidencyProblem, layer: int) -> np.ndarray | None:
    """The chiplets' related speeds in one layer's scenarios (cut_condition.related_speeds), found
    once per problem and layer: a search scores thousands of replica maps of one layer."""
    seen = _SPEEDS.setdefault(problem, {})
    if layer not in seen:
        seen[layer] = related_speeds(problem.scenario_work[:, layer])
    return seen[layer]


def layer_shares(
    problem: ResidencyProblem, resident: np.ndarray, layer: int
) -> tuple[float, float, np.ndarray]:
    """(z_l, nop_l, shares [E, C]) of one layer for the replica map `resident` [E, C]; a layer
    laid out as one scored before (heuristics often agree on most layers) is not solved again."""
    seen = _SHARES.setdefault(problem, {})
    key = (layer, np.packbits(resident).tobytes())
    if key not in seen:
        seen[key] = _solve_layer_shares(problem, resident, layer)
    z, nop, shares = seen[key]
    return z, nop, shares.copy()


def _solve_layer_shares(
    problem: ResidencyProblem, resident: np.ndarray, layer: int
) -> tuple[float, float, np.ndarray]:
    work = problem.work_ms[layer]
    tokens = problem.tokens[layer]
    active = np.flatnonzero((tokens > 0) | (work.sum(axis=1) > 0))
    cost = tokens[:, None] * problem.nop_ms_per_token[None, :]
    z, total, shares = share_lp(work, resident, cost, active)
    return z, total - z, shares
