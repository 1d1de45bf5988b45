"""Planning: the one path from what the slow loop has seen to a placement, window by window."""

from comoe_opt.planning.rolling import Leases, WindowPlan, rolling_horizon
from comoe_opt.planning.window import Plan, counts_history, plan_window

__all__ = ["Leases", "Plan", "WindowPlan", "counts_history", "plan_window", "rolling_horizon"]
