"""The slow loop: expert residency and replicas of one window (problem, MILPs, heuristics).

Planning window after window (the rolling horizon) is `comoe_opt.planning`'s job.
"""

from comoe_opt.residency.placement import Placement
from comoe_opt.residency.problem import ResidencyProblem, Tenant, residency_problem
from comoe_opt.residency.solve import RESIDENCY_METHODS, solve

__all__ = ["RESIDENCY_METHODS", "Placement", "ResidencyProblem", "Tenant", "residency_problem", "solve"]
