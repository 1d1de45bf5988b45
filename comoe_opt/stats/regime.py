"""Is an expert's time its weight read or its FLOPs? And so: can a replica pay?

On a device an expert that serves n tokens takes the roofline time
`max(t_read, n · t_flop)` (formulations/latency.md): its page is read once,
whatever its few tokens. The two meet at the crossover `n* = t_read / t_flop`
tokens. Below it (low-batch decode) the time is the read, and a device's
time is about its active experts times one page read: splitting an expert's
tokens over replicas (the engines' even split, or balancing token counts)
makes each replica read the whole page and shortens nothing. A replica then
pays only as a second place for an expert's *whole* load, and splitting pays
only for the (step, expert) loads above `n*`. `batch_regime` measures where a
trace's steps fall.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from comoe_opt.costs import Costs


@dataclass(frozen=True)
class Regime:
    """Where a trace's expert loads sit against the roofline's crossover."""

    crossover_tokens: float  # n* = t_read / t_flop (fastest device's ratio)
    tokens_per_active_expert: float  # mean over (step, layer, active expert)
    share_above_crossover: float  # share of (step, layer, active expert) loads above n*

    @property
    def bound(self) -> str:
        return "weight-read" if self.tokens_per_active_expert < self.crossover_tokens else "compute"

    @property
    def splitting_pays(self) -> bool:
        """Whether splitting an expert's tokens over replicas shortens layers often enough to
        matter: 5% of the loads above the crossover."""
        return self.share_above_crossover >= 0.05

    def to_dict(self) -> dict[str, Any]:
        return {
            "bound": self.bound,
            "crossover_tokens": self.crossover_tokens,
            "tokens_per_active_expert": self.tokens_per_active_expert,
            "share_above_crossover": self.share_above_crossover,
            "splitting_pays": self.splitting_pays,
        }

    def summary(self) -> str:
        line = (
            f"regime: {self.bound} bound, {self.tokens_per_active_expert:.1f} tokens per active expert and"
            f" step against {self.crossover_tokens:.1f} where compute takes over"
            f" ({100 * self.share_above_crossover:.1f}% of loads above it)"
        )
        if not self.splitting_pays:
            line += (
                ". Splitting an expert's tokens over replicas (even split, token balancing) makes each"
                " replica read the whole page for a few tokens: it balances token counts, the engines'"
                " proxy, but does not shorten layers at this batch size; a replica pays only as another"
                " place for an expert's whole load"
            )
        return line


def batch_regime(experts: np.ndarray, num_experts: int, costs: Costs) -> Regime:
    """The regime of micro-batches `experts[b, s, l, r]` on the devices `costs` describes."""
    crossover = _crossover(costs)
    batches, _, layers, _ = experts.shape
    offsets = (np.arange(batches * layers, dtype=np.int64) * num_experts).reshape(batches, 1, layers, 1)
    flat = (experts.astype(np.int64) + offsets).ravel()
    loads = np.bincount(flat, minlength=batches * layers * num_experts)
    return _regime(loads, crossover)


def counts_regime(steps: np.ndarray, costs: Costs) -> Regime:
    """The regime of per-step expert counts `steps[t, l, e]` (a recorder dump: each count a token
    that selected the expert) on the devices `costs` describes."""
    return _regime(np.asarray(steps).ravel(), _crossover(costs))


def _crossover(costs: Costs) -> float:
    flop = np.asarray(costs.flop_ms, dtype=np.float64)
    read = np.asarray(costs.read_ms, dtype=np.float64)
    ratio = np.where(flop > 0, read / np.maximum(flop, 1e-300), np.inf)
    return float(np.min(np.broadcast_to(ratio, np.broadcast(read, flop).shape)))


def _regime(loads: np.ndarray, crossover: float) -> Regime:
    """The regime of (step, layer, expert) loads, active or not, against `crossover` tokens."""
    active = loads[loads > 0]
    if active.size == 0:
        return Regime(crossover, 0.0, 0.0)
    return Regime(crossover, float(active.mean()), float((active > crossover).mean()))
