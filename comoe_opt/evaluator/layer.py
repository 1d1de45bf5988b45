"""Latency of one MoE layer for one micro-batch (formulations/latency.md).

Times are in ms from the moment routing is known (`R`). A chiplet `c`
receives its tokens at `arrive[c]`, then runs its experts in order of page
readiness; expert `e` cannot start before `ready[e, c]` and takes the
roofline time `max(page / local_bw, tokens · flop / peak)`. With experts
sorted by readiness, the recurrence `t ← max(t, ready_i) + exec_i` has the
closed form

    finish_c = max(arrive_c + Σ_i exec_i,  max_i (ready_i + Σ_{j ≥ i} exec_j))

which is what `chiplet_finish` evaluates, vectorised over chiplets.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ChipletSpeeds:
    """Per-chiplet constants, in ms."""

    read_ms: np.ndarray  # [C] one page at local bandwidth
    flop_ms: np.ndarray  # [C] one token of expert FLOPs at peak
    hop_ms: np.ndarray  # [C] NoP path latency from the attention chiplet (hops × hop latency)


def exec_ms(tokens: np.ndarray, speeds: ChipletSpeeds) -> np.ndarray:
    """Roofline time [E, C] of `tokens[e, c]` tokens (0 where no tokens)."""
    run = np.maximum(speeds.read_ms[None, :], tokens * speeds.flop_ms[None, :])
    return np.where(tokens > 0, run, 0.0)


def chiplet_finish(exec_: np.ndarray, ready: np.ndarray, arrive: np.ndarray) -> np.ndarray:
    """Finish time [C] of each chiplet running the experts with `exec_[e, c] > 0`."""
    active = exec_ > 0
    if not (ready[active] > 0).any():  # every page is there at once: the chiplet never waits
        total = exec_.sum(axis=0)
        return np.where(total > 0, arrive + total, 0.0)
    key = np.where(active, ready, np.inf)
    order = np.argsort(key, axis=0, kind="stable")
    ex = np.take_along_axis(exec_, order, axis=0)
    rd = np.take_along_axis(np.where(active, ready, -np.inf), order, axis=0)
    suffix = np.cumsum(ex[::-1], axis=0)[::-1]
    starts = np.where(np.take_along_axis(active, order, axis=0), rd + suffix, -np.inf)
    total = ex.sum(axis=0)
    finish = np.maximum(arrive + total, starts.max(axis=0, initial=-np.inf))
    return np.where(total > 0, finish, 0.0)


def page_loads(order_tokens: np.ndarray, page_ms: float, derate: float, start_ms: float) -> np.ndarray:
    """Completion times of on-demand page loads sharing the die-to-die link.

    Loads are served first come first served, heaviest expert first (order
    of `order_tokens`, descending); with n loads in flight the link delivers
    `(1 − derate · (1 − 1/n))` of its bandwidth.
    """
    n = order_tokens.size
    if n == 0:
        return np.zeros(0)
    effective = page_ms / (1.0 - derate * (1.0 - 1.0 / n))
    rank = np.empty(n, dtype=np.int64)
    rank[np.argsort(-order_tokens, kind="stable")] = np.arange(n)
    return start_ms + (rank + 1) * effective
