"""Confidence tiers of transition-graph prefetch (paper §3.2; formulations/latency.md).

After layer l is routed, each selected expert i looks up its successors at
the next layer:

* high confidence — `max_j P(j|i) >= theta_high` and `H(i) <= entropy_high_bits`:
  prefetch the top successor's page;
* middle band — `max_j P(j|i) >= theta_low` (and not high): prefetch at most
  the two most likely successors;
* otherwise (high entropy) — no prefetch.

Credits and cancellation act at run time (the evaluator); this module only
decides which pages a tier would ask for.
"""

from __future__ import annotations

import numpy as np

from comoe_opt.instance import Policy
from comoe_opt.stats.transitions import TransitionGraph


def prefetch_targets(graph: TransitionGraph, policy: Policy) -> np.ndarray:
    """Bool [pairs, E, E]: `out[p, i, j]` when selecting i at layer p prefetches j at p+1."""
    conf = graph.confidence()
    high = (conf >= policy.theta_high) & (graph.entropy_bits <= policy.entropy_high_bits)
    middle = ~high & (conf >= policy.theta_low)
    pairs, experts = conf.shape
    out = np.zeros((pairs, experts, experts), dtype=bool)
    p_idx, i_idx = np.nonzero(high | middle)
    out[p_idx, i_idx, graph.successors[p_idx, i_idx, 0]] = True
    if graph.top_s > 1:
        p_mid, i_mid = np.nonzero(middle)
        out[p_mid, i_mid, graph.successors[p_mid, i_mid, 1]] = True
    return out


def prefetched(used: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Pages prefetched for each micro-batch and layer.

    `used[b, l, e]` marks experts selected in micro-batch b at layer l;
    returns bool [batches, layers, E] (layer 0 is never prefetched).
    """
    out = np.zeros_like(used, dtype=bool)
    for p in range(targets.shape[0]):
        out[:, p + 1] = (used[:, p].astype(np.int32) @ targets[p].astype(np.int32)) > 0
    return out
