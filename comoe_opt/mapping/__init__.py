"""Fast loop: map every (token, chosen expert) of a micro-batch and layer to a replica.

`MappingProblem` (one micro-batch on one layer's `LayerCosts`) -> a method ->
`SolveResult` whose solution is `assignment[s, r]`, the chiplet serving token
`s`'s rank-`r` expert, and whose report is a `MappingReport` (mapping/report.py).
Methods: `solve_min_cost_flow` (OR-Tools, exact for the makespan), `solve_exact`
(max-flow bisection), the MILP in `comoe_opt.mapping.milp` (Pyomo + HiGHS, with
its LP bound; imported on demand), and the heuristics in `HEURISTICS`. The model
is in formulations/mapping.md.
"""

from comoe_opt.mapping.exact import solve_exact
from comoe_opt.mapping.flow import solve_min_cost_flow, solve_min_cost_flow_per_token
from comoe_opt.mapping.gap import MAPPING_METHODS, GapReport, fast_loop_gap, gap_samples, gap_summary
from comoe_opt.mapping.heuristics import (
    HEURISTICS,
    even_split,
    home,
    least_loaded,
    power_of_two,
    round_robin,
)
from comoe_opt.mapping.makespan import completion_ticks, makespan_ticks, on_demand_loads, pair_counts
from comoe_opt.mapping.placement import default_placement, layer_placement
from comoe_opt.mapping.problem import NEVER, TICK_S, LayerCosts, MappingProblem, layer_costs
from comoe_opt.mapping.report import BisectionReport, FlowReport, MappingReport, MappingResult, MilpReport

__all__ = [
    "HEURISTICS",
    "MAPPING_METHODS",
    "NEVER",
    "TICK_S",
    "BisectionReport",
    "FlowReport",
    "GapReport",
    "LayerCosts",
    "MappingProblem",
    "MappingReport",
    "MappingResult",
    "MilpReport",
    "completion_ticks",
    "default_placement",
    "even_split",
    "fast_loop_gap",
    "gap_samples",
    "gap_summary",
    "home",
    "layer_costs",
    "layer_placement",
    "least_loaded",
    "makespan_ticks",
    "on_demand_loads",
    "pair_counts",
    "power_of_two",
    "round_robin",
    "solve_exact",
    "solve_min_cost_flow",
    "solve_min_cost_flow_per_token",
]
