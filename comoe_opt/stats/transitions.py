"""Cross-layer transition graph (paper eq. 2; formulations/traces.md).

For each logged layer pair p (layer `l` → the next logged layer), counts
`N_p(i, j)` of tokens that use expert `i` at `l` and expert `j` at the next
layer give the smoothed conditional probability

    P_p(j | i) = (N_p(i, j) + ε) / (Σ_j N_p(i, j) + E·ε)

and the successor entropy `H_p(i) = −Σ_j P_p(j|i) log2 P_p(j|i)` in bits.
The graph keeps only the top-s successors of each node (the paper: s = 8 with
16-bit counts and ids, 4 B per edge); the rest of a row's mass is spread
evenly over the other E − s experts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from comoe_opt.instance import Policy
from comoe_opt.trace.batching import MicroBatches
from comoe_opt.trace.model import Trace

Pairs = Literal["kxk", "top1"]

BYTES_PER_EDGE = 4  # 16-bit successor id + 16-bit count (paper §6.1)


def transition_counts(topk: np.ndarray, num_experts: int, pairs: Pairs = "kxk") -> np.ndarray:
    """Counts [layers-1, E, E] from a [tokens, layers, k] id array.

    `kxk` counts all k × k (current, next) pairs of a token; `top1` only the
    rank-1 → rank-1 pair.
    """
    layers = topk.shape[1]
    e = num_experts
    # int32 pair keys where E² fits: the bincount is memory-bound (1.4x faster on DeepSeek-V3)
    ids = topk.astype(np.int32 if e * e < 2**31 else np.int64)
    if pairs == "top1":
        ids = ids[:, :, :1]
    out = np.empty((max(layers - 1, 0), e, e), dtype=np.int64)
    for p in range(layers - 1):
        src = ids[:, p, :, None]
        dst = ids[:, p + 1, None, :]
        flat = np.add(src.astype(np.int64) * e, dst).ravel()
        out[p] = np.bincount(flat, minlength=e * e).reshape(e, e)
    return out


@dataclass(frozen=True, eq=False)
class TransitionGraph:
    """Top-s successors per (layer pair, expert) with probability and entropy.

    Arrays are indexed `[pair, expert, ...]`; `successors[p, i, r]` is the r-th
    most likely next-layer expert of `i` and `prob[p, i, r]` its smoothed
    probability. `entropy_bits[p, i]` is the entropy of the row as the
    truncated graph represents it; `support[p, i]` the row's total count.
    """

    successors: np.ndarray  # [pairs, E, s] int64
    prob: np.ndarray  # [pairs, E, s] float64
    entropy_bits: np.ndarray  # [pairs, E]
    support: np.ndarray  # [pairs, E] int64
    num_experts: int
    eps: float

    @classmethod
    def from_counts(cls, counts: np.ndarray, eps: float = 0.5, top_s: int = 8) -> TransitionGraph:
        counts = np.asarray(counts)
        e = counts.shape[1]
        s = min(top_s, e)
        order = np.argsort(-counts, axis=2, kind="stable")[:, :, :s]
        top = np.take_along_axis(counts, order, axis=2).astype(np.float64)
        total = counts.sum(axis=2).astype(np.float64)
        denom = total + e * eps
        prob = (top + eps) / denom[:, :, None]
        rest = e - s
        rest_mass = np.clip(1.0 - prob.sum(axis=2), 0.0, 1.0)
        entropy = -(prob * np.log2(prob)).sum(axis=2)
        if rest:
            each = rest_mass / rest
            with np.errstate(divide="ignore", invalid="ignore"):
                entropy -= np.where(each > 0, rest_mass * np.log2(each), 0.0)
        return cls(order.astype(np.int64), prob, entropy, total.astype(np.int64), e, eps)

    @classmethod
    def from_trace(
        cls, trace: Trace, eps: float = 0.5, top_s: int = 8, pairs: Pairs = "kxk"
    ) -> TransitionGraph:
        return cls.from_counts(transition_counts(trace.topk, trace.num_experts, pairs), eps, top_s)

    @property
    def pairs(self) -> int:
        return self.successors.shape[0]

    @property
    def top_s(self) -> int:
        return self.successors.shape[2]

    def confidence(self) -> np.ndarray:
        """max_j P(j | i): [pairs, E]."""
        return self.prob[:, :, 0]

    def dense(self, pair: int) -> np.ndarray:
        """The [E, E] matrix P(j | i) of one pair, as the truncated graph holds it."""
        e, s = self.num_experts, self.top_s
        rest = np.clip(1.0 - self.prob[pair].sum(axis=1), 0.0, 1.0) / max(e - s, 1)
        out = np.repeat(rest[:, None], e, axis=1)
        np.put_along_axis(out, self.successors[pair], self.prob[pair], axis=1)
        return out

    def state_bytes(self) -> int:
        """On-chip state of the edges: pairs × E × s × 4 B (paper §6.1)."""
        return self.pairs * self.num_experts * self.top_s * BYTES_PER_EDGE


def window_graph(window: MicroBatches, policy: Policy) -> TransitionGraph:
    """The transition graph the slow loop learns from a window of micro-batches."""
    flat = window.experts.reshape(-1, window.layers, window.top_k)
    counts = transition_counts(flat, window.num_experts)
    return TransitionGraph.from_counts(counts, policy.transition_eps, policy.transition_top_s)
