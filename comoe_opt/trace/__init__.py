"""Routing traces: generator, file formats, batching and statistics."""

from comoe_opt.trace.batching import MicroBatches, make_batches, windows
from comoe_opt.trace.io import read_trace, write_trace
from comoe_opt.trace.model import AggregateTrace, Trace
from comoe_opt.trace.source import instance_batches, instance_trace
from comoe_opt.trace.stats import TraceStats, aggregate_stats, fit_zipf_alpha, trace_stats
from comoe_opt.trace.synthetic import generate

__all__ = [
    "AggregateTrace",
    "MicroBatches",
    "Trace",
    "TraceStats",
    "aggregate_stats",
    "fit_zipf_alpha",
    "generate",
    "instance_batches",
    "instance_trace",
    "make_batches",
    "read_trace",
    "trace_stats",
    "windows",
    "write_trace",
]
