"""The slow loop: expert residency and replicas per window (MILP, heuristics, rolling horizon)."""

from comoe_opt.residency.demand import WindowDemand, demand_from_counts, window_demand
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.problem import ResidencyProblem, Tenant, residency_problem
from comoe_opt.residency.solve import METHODS, solve

__all__ = [
    "METHODS",
    "Placement",
    "ResidencyProblem",
    "Tenant",
    "WindowDemand",
    "demand_from_counts",
    "residency_problem",
    "solve",
    "window_demand",
]
