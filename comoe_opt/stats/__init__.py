"""Statistics of routing traces: what the loops learn from data.

Skew, entropy and predictability of a trace (`trace_stats`), the cross-layer
transition graph and the prefetch tiers it drives, and the demand of a
planning window. Statistics read the data layer (`comoe_opt.trace`) and the
instance; they import no solver.
"""

from comoe_opt.stats.demand import WindowDemand, demand_from_counts, window_demand
from comoe_opt.stats.prefetch import prefetch_targets, prefetched
from comoe_opt.stats.trace_stats import TraceStats, aggregate_stats, fit_zipf_alpha, trace_stats, window_alpha
from comoe_opt.stats.transitions import TransitionGraph, transition_counts, window_graph

__all__ = [
    "TraceStats",
    "TransitionGraph",
    "WindowDemand",
    "aggregate_stats",
    "demand_from_counts",
    "fit_zipf_alpha",
    "prefetch_targets",
    "prefetched",
    "trace_stats",
    "transition_counts",
    "window_alpha",
    "window_demand",
    "window_graph",
]
