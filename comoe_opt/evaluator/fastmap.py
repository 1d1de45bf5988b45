"""The fast loop inside the runtime: which chiplet serves each (token, chosen expert).

Candidates of an expert, best first: chiplets with a published replica; else
chiplets whose prefetch buffer holds (or is receiving) the page; else an
on-demand load. Strategies differ in how they pick among candidates:

* `home` — every token of an expert to one chiplet: its home replica (static
  homes for experts without one);
* `even` — an expert's tokens split evenly over its replicas, in token order
  (what EPLB-based engines do);
* `flow` — CoMoE's congestion-aware mapping: the min-cost flow of
  `comoe_opt.mapping` over expert activations, with this layer's page
  readiness and dispatch times (see `_flow`).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

import numpy as np

from comoe_opt.costs import TICK_S
from comoe_opt.evaluator.layer import ChipletSpeeds
from comoe_opt.evaluator.strategies import Strategy
from comoe_opt.instance import Instance
from comoe_opt.mapping.flow import solve_min_cost_flow
from comoe_opt.mapping.problem import NEVER, LayerCosts, MappingProblem


class Runtime(Protocol):
    """What the fast loop reads of the runtime's state."""

    instance: Instance
    strategy: Strategy
    speeds: ChipletSpeeds
    home: np.ndarray  # [L, E] home chiplet of each expert
    page_ms: float  # one on-demand page load over the die-to-die link
    E: int


def map_tokens(
    rt: Runtime,
    layer: int,
    experts: np.ndarray,
    published: np.ndarray,
    buffered: np.ndarray,
    ahead_ms: float,
) -> np.ndarray:
    """Assignment [tokens, k] of chiplets for one micro-batch and layer."""
    mapping = rt.strategy.mapping
    if mapping == "flow" and (rt.instance.policy.balance != "work" or _compute_bound(rt, experts)):
        return _token_flow(rt, layer, experts, published, buffered, ahead_ms)
    if mapping == "flow":
        return _flow(rt, layer, experts, published, buffered, ahead_ms)
    return _home_or_even(rt.home[layer], experts, published, buffered, even=mapping == "even")


def _home_or_even(
    home: np.ndarray, experts: np.ndarray, published: np.ndarray, buffered: np.ndarray, even: bool
) -> np.ndarray:
    """`home` and `even` for all experts at once. In token order, the i-th of an expert's
    (token, rank) pairs goes to its replica number (P_e + i) mod r (`even`, r > 1 replicas in
    chiplet order, P_e the micro-batch's selections of experts before e: the one even split,
    best_split/even.py) or to its home replica (else its first); an expert with no replica goes to
    the buffer holding its page (earliest), else to its home (an on-demand load)."""
    flat = experts.ravel()
    order = np.argsort(flat, kind="stable")  # grouped by expert, token order inside a group
    grouped = flat[order]
    count = np.bincount(flat, minlength=published.shape[0])
    start = np.cumsum(count) - count
    position = np.arange(flat.size) - start[grouped]
    replicas = published.sum(axis=1)
    by_chiplet = np.argsort(~published, axis=1, kind="stable")  # each expert's replicas first
    experts_all = np.arange(published.shape[0])
    first = np.where(published[experts_all, home], home, by_chiplet[:, 0])
    fallback = np.where(np.isfinite(buffered).any(axis=1), np.argmin(buffered, axis=1), home)
    r = replicas[grouped]
    target = np.where(r == 0, fallback[grouped], first[grouped])
    if even:  # the even split's rule (best_split/even.py): slot (P_e + i) mod r
        spread = by_chiplet[grouped, (start[grouped] + position) % np.maximum(r, 1)]
        target = np.where(r > 1, spread, target)
    assignment = np.empty_like(flat)
    assignment[order] = target
    return assignment.reshape(experts.shape)


def _flow(
    rt: Runtime,
    layer: int,
    experts: np.ndarray,
    published: np.ndarray,
    buffered: np.ndarray,
    ahead_ms: float,
) -> np.ndarray:
    """Min-cost flow over expert activations: each used expert is one unit of work.

    In weight-read-bound decode an expert's time on a chiplet is its page read
    whatever its few tokens, so a chiplet's queue grows by one read per expert
    it runs, and splitting an expert over replicas would read the page twice.
    The units are therefore the used experts (all their tokens follow), with
    the readiness of each candidate chiplet and one read per unit.
    """
    used, tokens = np.unique(experts, return_counts=True)
    unit_ms = np.maximum(rt.speeds.read_ms, float(np.median(tokens)) * rt.speeds.flop_ms)
    ready_ms = _ready_ms(rt, layer, published, buffered, ahead_ms)[used]
    units = np.arange(used.size, dtype=np.int64)[:, None]
    chosen = _solve_flow(rt, layer, units, ready_ms, unit_ms, published[used])
    chiplet_of = np.empty(rt.E, dtype=np.int64)
    chiplet_of[used] = chosen[:, 0]
    return chiplet_of[experts]


def _compute_bound(rt: Runtime, experts: np.ndarray) -> bool:
    """Whether the layer's median expert takes longer to compute its tokens than to read its
    page (the roofline `_flow` prices a unit by): then splitting a hot expert's tokens over its
    replicas saves more compute than the extra page read costs, and the flow maps pairs."""
    _, tokens = np.unique(experts, return_counts=True)
    compute = float(np.median(tokens)) * float(np.median(rt.speeds.flop_ms))
    return compute > float(np.median(rt.speeds.read_ms))


def _token_flow(
    rt: Runtime,
    layer: int,
    experts: np.ndarray,
    published: np.ndarray,
    buffered: np.ndarray,
    ahead_ms: float,
) -> np.ndarray:
    """Min-cost flow over (token, expert) pairs, for instances that balance tokens
    (`policy.balance = "tokens"`: compute-bound devices, serving engines)."""
    ready_ms = _ready_ms(rt, layer, published, buffered, ahead_ms)
    return _solve_flow(rt, layer, experts, ready_ms, rt.speeds.flop_ms, published)


def _ready_ms(
    rt: Runtime, layer: int, published: np.ndarray, buffered: np.ndarray, ahead_ms: float
) -> np.ndarray:
    """[E, C] when each chiplet could start an expert: 0 on a replica, the buffered page's
    arrival, or — for an expert with neither — an on-demand load to its home chiplet. The load
    stays in that chiplet's buffer; homes spread the experts without a replica over the chiplets
    (LPT), so later micro-batches find their pages again instead of evicting each other."""
    ready = np.where(published, 0.0, buffered)
    no_copy = np.flatnonzero(~np.isfinite(ready).any(axis=1))
    ready[no_copy, rt.home[layer, no_copy]] = ahead_ms + rt.page_ms
    return ready


def _solve_flow(
    rt: Runtime,
    layer: int,
    units: np.ndarray,
    ready_ms: np.ndarray,
    unit_ms: np.ndarray,
    resident: np.ndarray,
) -> np.ndarray:
    forced = forced_assignment(units, ready_ms)
    if forced is not None:
        return forced
    return min_cost_flow(rt, layer, units, ready_ms, unit_ms, resident)


def forced_assignment(units: np.ndarray, ready_ms: np.ndarray) -> np.ndarray | None:
    """The assignment when every unit has one usable chiplet (the flow has no choice), else None."""
    usable = np.isfinite(ready_ms)
    if (usable.sum(axis=1)[units] == 1).all():
        return np.argmax(usable, axis=1)[units]
    return None


def min_cost_flow(
    rt: Runtime,
    layer: int,
    units: np.ndarray,
    ready_ms: np.ndarray,
    unit_ms: np.ndarray,
    resident: np.ndarray,
) -> np.ndarray:
    """The units' chiplets by the min-cost flow of `comoe_opt.mapping` (minimum makespan)."""
    ticks_per_ms = 1e-3 / TICK_S
    ready = np.where(np.isfinite(ready_ms), np.ceil(ready_ms * ticks_per_ms), NEVER).astype(np.int64)
    hop = np.rint(rt.speeds.hop_ms * ticks_per_ms).astype(np.int64)
    token_time = np.maximum(np.rint(unit_ms * ticks_per_ms).astype(np.int64), 1)
    costs = shared_costs(ready, hop, token_time, resident)
    result = solve_min_cost_flow(MappingProblem(units, costs))
    if not result.status.has_solution or result.solution is None:
        raise RuntimeError(f"min-cost flow failed at layer {layer}: {result.status.value}")
    return result.solution


COSTS_KEPT = 64  # distinct LayerCosts kept: more than a window's layers x readiness variants, each
# with its flow skeleton and arc sets (tens of kB for 32 experts x 8 chiplets)
_COSTS: OrderedDict[tuple, LayerCosts] = OrderedDict()


def shared_costs(
    ready: np.ndarray, hop: np.ndarray, token_time: np.ndarray, resident: np.ndarray
) -> LayerCosts:
    """The `LayerCosts` of these arrays, the same object for equal contents.

    A layer's readiness changes only when its placement or buffers do, so most micro-batches meet
    costs seen before; the flow's skeleton and arc sets are cached on the costs object
    (`comoe_opt.mapping.network.costs_graph`), and sharing it skips rebuilding them. Every part of
    them is a function of these arrays alone, so the flows are the same as with fresh costs.
    """
    key = tuple((a.shape, a.dtype.str, a.tobytes()) for a in (ready, hop, token_time, resident))
    costs = _COSTS.get(key)
    if costs is not None:
        _COSTS.move_to_end(key)
        return costs
    costs = LayerCosts(ready=ready, start=hop, token_time=token_time, finish=hop, resident=resident.copy())
    _COSTS[key] = costs
    if len(_COSTS) > COSTS_KEPT:
        _COSTS.popitem(last=False)
    return costs
