"""The fast loop's problem: one micro-batch of one layer, in integer time ticks.

`LayerCosts` holds what stays fixed while a placement is in force (which
chiplet can serve which expert and from when, chiplet start and return
latencies, per-token service time); `MappingProblem` adds one micro-batch's
router choices. Every time is an integer number of ticks (`tick_s` seconds,
1 ns by default) so that OR-Tools, the exact reference and the heuristics all
compare the very same integers (formulations/mapping.md §1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from comoe_opt.costs import TICK_S
from comoe_opt.errors import InputError
from comoe_opt.instance import Instance

NEVER = -1  # `ready` value of a chiplet that cannot serve the expert


@dataclass(frozen=True, eq=False)
class LayerCosts:
    """Cost data of one layer under one placement, in ticks.

    `ready[e, c]` is when chiplet `c` can start tokens of expert `e` (0 for a
    resident page, the remaining arrival time of a page in flight, the
    on-demand load time for an expert without a replica), or `NEVER`.
    A chiplet starts its first token at `start[c]` (backlog + dispatch over
    the NoP), serves one token per `token_time[c]`, and its last result
    reaches the attention chiplet `finish[c]` after it completes.
    `resident[e, c]` marks placed replicas (for reporting on-demand loads).
    """

    ready: np.ndarray  # [E, C] int64
    start: np.ndarray  # [C] int64
    token_time: np.ndarray  # [C] int64, >= 1
    finish: np.ndarray  # [C] int64
    resident: np.ndarray  # [E, C] bool
    tick_s: float = TICK_S

    def __post_init__(self) -> None:
        _check_costs(self)
        for name in ("ready", "start", "token_time", "finish", "resident"):
            getattr(self, name).flags.writeable = False

    @property
    def experts(self) -> int:
        return self.ready.shape[0]

    @property
    def chiplets(self) -> int:
        return self.ready.shape[1]

    @cached_property
    def slots(self) -> np.ndarray:
        """[E, C] first slot index a token of `e` may use on `c` (-1 = never).

        Slot `j` of chiplet `c` runs from `start + j * token_time`; a token
        may use it once its page is ready (waits round up to whole slots).
        """
        wait = np.maximum(self.ready - self.start, 0)
        first = -(-wait // self.token_time)  # ceil division on integers
        return np.where(self.ready == NEVER, NEVER, first)

    @cached_property
    def base(self) -> np.ndarray:
        """[C] completion of slot j is `base + (j + 1) * token_time`."""
        return self.start + self.finish


@dataclass(frozen=True, eq=False)
class MappingProblem:
    """Map every (token, chosen expert) of one micro-batch and layer to a chiplet.

    `experts[s, r]` is the expert token `s` chose at router rank `r`; the
    router's choices never change, only which chiplet serves each of them.
    """

    experts: np.ndarray  # [S, k] integer expert ids
    costs: LayerCosts

    def __post_init__(self) -> None:
        experts = self.experts
        if not isinstance(experts, np.ndarray) or experts.ndim != 2 or experts.size == 0:
            raise InputError(None, "experts", f"must be a non-empty [tokens, k] array, got {_shape(experts)}")
        if not np.issubdtype(experts.dtype, np.integer):
            raise InputError(None, "experts", f"must hold integer expert ids, got {experts.dtype}")
        lo, hi = int(experts.min()), int(experts.max())
        if lo < 0 or hi >= self.costs.experts:
            raise InputError(None, "experts", f"ids must be in 0..{self.costs.experts - 1}, got {lo}..{hi}")

    @property
    def selections(self) -> int:
        """(token, expert) pairs to map."""
        return self.experts.size

    def demand(self) -> np.ndarray:
        """[E] selections of each expert."""
        return np.bincount(self.experts.ravel(), minlength=self.costs.experts)


def layer_costs(
    instance: Instance,
    resident: np.ndarray,
    *,
    backlog_s: np.ndarray | None = None,
    arrival_s: np.ndarray | None = None,
    tick_s: float = TICK_S,
) -> LayerCosts:
    """Costs of one layer from the instance's hardware and a placement `resident[e, c]`.

    `backlog_s[c]` is work already queued on chiplet `c`; `arrival_s[e, c]`
    (inf where nothing is arriving) is when a page in flight to `c` becomes
    usable. An expert with no resident replica may be loaded on demand to
    any chiplet, taking `page_gb / d2d_bandwidth_gb_s`.
    """
    hw = instance.hardware
    resident = np.asarray(resident, dtype=bool)
    if resident.ndim != 2 or resident.shape[1] != hw.chiplets:
        raise InputError(None, "resident", f"must be [experts, {hw.chiplets}], got {resident.shape}")
    experts, chiplets = resident.shape
    arrival = np.full((experts, chiplets), np.inf) if arrival_s is None else np.asarray(arrival_s, float)
    backlog = np.zeros(chiplets) if backlog_s is None else np.asarray(backlog_s, float)
    if arrival.shape != resident.shape or backlog.shape != (chiplets,):
        raise InputError(None, "arrival_s/backlog_s", "must be [experts, chiplets] and [chiplets]")
    if (
        (arrival < 0).any()
        or (backlog < 0).any()
        or np.isnan(arrival).any()
        or not np.isfinite(backlog).all()
    ):
        raise InputError(None, "arrival_s/backlog_s", "must be non-negative (arrival may be inf)")
    costs = instance.costs
    load_s = costs.page_load_ms * 1e-3
    # a page still arriving (prefetch, or a replica still being copied) is usable when it lands
    ready_s = np.where(np.isfinite(arrival), arrival, np.where(resident, 0.0, np.inf))
    missing = ~resident.any(axis=1)
    ready_s[missing] = np.minimum(arrival[missing], load_s)  # no replica: load on demand anywhere
    nop_s = costs.hop_ms * 1e-3
    tau_s = np.broadcast_to(costs.flop_ms * 1e-3, (chiplets,))
    return LayerCosts(
        ready=np.where(np.isfinite(ready_s), _ceil_ticks(ready_s, tick_s), NEVER),
        start=_round_ticks(backlog + nop_s, tick_s),
        token_time=np.maximum(_round_ticks(tau_s, tick_s), 1),
        finish=_round_ticks(nop_s, tick_s),
        resident=resident,
        tick_s=tick_s,
    )


def _round_ticks(seconds: np.ndarray, tick_s: float) -> np.ndarray:
    return np.rint(np.asarray(seconds) / tick_s).astype(np.int64)


def _ceil_ticks(seconds: np.ndarray, tick_s: float) -> np.ndarray:
    """Waits round up, so a page is never used before it is there (1e-9 absorbs float noise)."""
    scaled = np.where(np.isfinite(seconds), np.asarray(seconds) / tick_s, 0.0)
    return np.ceil(scaled - 1e-9).astype(np.int64)


def _check_costs(costs: LayerCosts) -> None:
    ready = costs.ready
    if not isinstance(ready, np.ndarray) or ready.ndim != 2 or ready.dtype != np.int64:
        raise InputError(None, "ready", f"must be an int64 [experts, chiplets] array, got {_shape(ready)}")
    chiplets = ready.shape[1]
    for name in ("start", "token_time", "finish"):
        value = getattr(costs, name)
        if not isinstance(value, np.ndarray) or value.shape != (chiplets,) or value.dtype != np.int64:
            raise InputError(
                None, name, f"must be an int64 array of {chiplets} chiplets, got {_shape(value)}"
            )
        if (value < 0).any():
            raise InputError(None, name, "must be non-negative")
    if (costs.token_time < 1).any():
        raise InputError(None, "token_time", "must be at least one tick")
    if (ready < NEVER).any():
        raise InputError(None, "ready", f"must be >= 0, or {NEVER} for a chiplet that cannot serve")
    if costs.resident.shape != ready.shape or costs.resident.dtype != bool:
        raise InputError(None, "resident", f"must be a bool array of shape {ready.shape}")
    if not (math.isfinite(costs.tick_s) and costs.tick_s > 0):
        raise InputError(None, "tick_s", f"must be positive, got {costs.tick_s}")


def _shape(value: object) -> object:
    return getattr(value, "shape", type(value).__name__)
