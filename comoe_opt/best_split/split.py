"""One whole-token split at a layer's best makespan: how many of each expert's tokens each device
serves, for timing a step under `lp` and `flow` (replay/serve.py; formulations/serving-time.md).

The best split's makespan T (cut_condition.py, rounded up to whole tokens) says how busy the
busiest device is; the time model also needs every device's own tokens and which replicas take
any. A maximum flow gives one split that reaches T: source → expert e with its tokens, e → each
device holding it, device → sink with capacity T; the flow on e → c is what c serves of e. The
network is built once per replica map and re-solved per step with new capacities (OR-Tools), so
the split is a function of the map and the counts alone.
"""

from __future__ import annotations

import numpy as np
from ortools.graph.python.max_flow import SimpleMaxFlow


class Splitter:
    """The flow network of one layer's replica map `resident` [E, C]."""

    def __init__(self, resident: np.ndarray):
        experts, devices = resident.shape
        self.shape = (experts, devices)
        e_idx, c_idx = np.nonzero(resident)
        self.expert_of, self.device_of = e_idx, c_idx
        source, sink = experts + devices, experts + devices + 1
        tails = np.concatenate((np.full(experts, source), e_idx, experts + np.arange(devices)))
        heads = np.concatenate((np.arange(experts), experts + c_idx, np.full(devices, sink)))
        caps = np.zeros(tails.size, dtype=np.int64)
        caps[experts : experts + e_idx.size] = np.iinfo(np.int64).max // 4
        self.flow = SimpleMaxFlow()
        arcs = self.flow.add_arcs_with_capacity(tails.astype(np.int32), heads.astype(np.int32), caps)
        arcs = np.asarray(arcs, dtype=np.int32)
        self.source_arcs = arcs[:experts]
        self.replica_arcs = arcs[experts : experts + e_idx.size]
        self.sink_arcs = arcs[experts + e_idx.size :]
        self.source, self.sink = source, sink

    def split(self, counts: np.ndarray, cap: int) -> np.ndarray:
        """[E, C] whole tokens each device serves of each expert, no device above `cap`; tokens
        of experts with no replica, or beyond what `cap` lets through, are left out (a `cap` at
        the layer's best makespan, rounded up, lets every token through)."""
        counts = np.asarray(counts, dtype=np.int64)
        self.flow.set_arcs_capacity(self.source_arcs, counts)
        self.flow.set_arcs_capacity(self.sink_arcs, np.full(self.sink_arcs.size, int(cap), dtype=np.int64))
        self.flow.solve(self.source, self.sink)
        out = np.zeros(self.shape, dtype=np.int64)
        out[self.expert_of, self.device_of] = self.flow.flows(self.replica_arcs)
        return out
