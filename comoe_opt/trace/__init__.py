"""Routing traces: the data layer (model, file formats, synthetic generator, decode batching).

Statistics of traces live in `comoe_opt.stats`; nothing here imports them."""

from comoe_opt.trace.batching import MicroBatches, make_batches, windows
from comoe_opt.trace.io import read_trace, write_trace
from comoe_opt.trace.model import AggregateTrace, Trace
from comoe_opt.trace.source import instance_batches, instance_trace, load_batches, load_trace
from comoe_opt.trace.synthetic import generate

__all__ = [
    "AggregateTrace",
    "MicroBatches",
    "Trace",
    "generate",
    "instance_batches",
    "instance_trace",
    "load_batches",
    "load_trace",
    "make_batches",
    "read_trace",
    "windows",
    "write_trace",
]
