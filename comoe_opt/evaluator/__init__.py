"""Trace-driven analytic evaluator: latency/energy model, prefetch, directory, strategies."""
