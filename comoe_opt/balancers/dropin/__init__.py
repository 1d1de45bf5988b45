"""The drop-in `rebalance_experts` (rebalance.py): its local search (search.py) and the
constants it backtests on each call's own history (backtest.py)."""
