"""Slow-loop heuristics: replica counts per logical expert, then `assign_replicas`.

* `static` — one home per expert, the most used experts first until the pages
  run out; no replicas; homes in contiguous blocks of expert ids (the default
  layout of expert-parallel engines).
* `hot` — hot replication: residency by window frequency, and one extra
  replica each for the hottest experts, in spare pages only (at most
  `HOT_REPLICA_SHARE` of the pages): it never evicts an expert to make room
  for a replica, as an engineer running it would not; same block layout,
  extra replicas on the next chiplets. With no spare pages it is `static`.
* `hot-evict` — the same, but the replicas' share of the pages is taken
  whether or not every expert fits: the coldest experts are evicted to make
  room (the variant that loses to static when capacity is short).
* `eplb` — DeepSeek's EPLB as published (eplb.py): per layer, each device
  gives the layer the same slots; hierarchical packing of expert groups onto
  nodes when the model has groups and the devices form nodes, else global;
  every expert gets one replica, each further slot the largest load per
  replica; replicas are packed heaviest first onto the lightest device with a
  free slot. As upstream, two copies of one expert may share a device (the
  second is then a wasted slot; the placement keeps EPLB's slot map, which
  SGLang's export writes as planned). It plans on the window's unscaled load
  counts, as an engine would pass them, so that it is
  `comoe_opt.rebalance_experts(counts, ..., method="eplb")` on the same slots.
  Where upstream's requirements do not hold — fewer slots than experts, a
  replica limit below the devices, leases or quotas, which upstream does not
  know — it plans as `eplb-distinct`.
* `eplb-distinct` — the same replicate-then-pack, but a device never holds
  two copies of one expert, and leased replicas stay where they are.
* `greedy` — transition-aware marginal greedy on the objective: a page goes
  to the action with the largest gain per page, where a first replica gains
  the expected on-demand load time it removes (already discounted for what
  prefetch hides: the transition graph's coupling) minus its copy time, and
  an extra replica gains the balance it buys; pages left over then hold
  flexible replicas of the experts with the largest peak load (fill.py).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from comoe_opt.balancers.eplb import deepseek_eplb
from comoe_opt.best_split.even import slot_replicas
from comoe_opt.residency.heuristics.assign import assign_replicas
from comoe_opt.residency.heuristics.fill import fill_spare
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.problem import ResidencyProblem

HOT_REPLICA_SHARE = 0.2  # share of the pages `hot` spends on extra replicas


@dataclass(frozen=True)
class Heuristic:
    """A slow-loop heuristic, declared where it is defined (`@heuristic`)."""

    name: str
    plan: Callable[[ResidencyProblem], Placement]
    description: str  # one line for `--help`
    leases: bool = True  # False: re-plans from scratch every window, keeping no leases (EPLB as published)
    warm_start: bool = True  # cheap enough to run before every MILP as a warm start candidate

    def __call__(self, problem: ResidencyProblem) -> Placement:
        return self.plan(problem)


HEURISTICS: dict[str, Heuristic] = {}  # name -> heuristic, in declaration order


def heuristic(
    name: str, description: str, *, leases: bool = True, warm_start: bool = True
) -> Callable[[Callable[[ResidencyProblem], Placement]], Callable[[ResidencyProblem], Placement]]:
    """Register the decorated function as the heuristic `name` (the name `--method` takes)."""

    def register(plan: Callable[[ResidencyProblem], Placement]) -> Callable[[ResidencyProblem], Placement]:
        if name in HEURISTICS:
            raise ValueError(f"heuristic {name!r} is registered twice")
        HEURISTICS[name] = Heuristic(name, plan, description, leases, warm_start)
        return plan

    return register


def warm_starts() -> list[str]:
    """The heuristics every MILP solve runs first, in order."""
    return [name for name, h in HEURISTICS.items() if h.warm_start]


@heuristic("static", "each expert once, most used first, block layout, no replicas")
def static(problem: ResidencyProblem) -> Placement:
    counts = np.zeros((problem.layers, problem.experts), dtype=np.int64)
    _fill_first_replicas(problem, counts, _popularity(problem), problem.page_limit)
    return block_placement(problem, counts)


@heuristic("hot", "replicas of the hottest experts by window frequency, in spare pages only")
def hot(problem: ResidencyProblem) -> Placement:
    """Hot replication in spare pages only."""
    return _hot(problem, evict=False)


@heuristic("hot-evict", "hot, evicting the coldest experts to make room for its replicas")
def hot_evict(problem: ResidencyProblem) -> Placement:
    """Hot replication that evicts the coldest experts for its replicas' share of the pages."""
    return _hot(problem, evict=True)


def _hot(problem: ResidencyProblem, evict: bool) -> Placement:
    limit = problem.page_limit
    extra = int(HOT_REPLICA_SHARE * limit) if problem.max_replicas > 1 else 0
    if not evict:  # every expert worth a page first; replicas only in what is left
        extra = 0
    counts = np.zeros((problem.layers, problem.experts), dtype=np.int64)
    order = _popularity(problem)
    _fill_first_replicas(problem, counts, order, limit - extra)
    if not evict:
        extra = min(int(HOT_REPLICA_SHARE * limit), limit - int(counts.sum()))
        extra = extra if problem.max_replicas > 1 else 0
    extra = min(extra, limit - int(counts.sum()))  # leased replicas may already use some of it
    quota = _QuotaTracker(problem, counts)
    for flat in order:
        if extra == 0:
            break
        layer, e = divmod(int(flat), problem.experts)
        if counts[layer, e] == 1 and quota.allows(layer, e):
            counts[layer, e] = 2
            quota.add(layer, e)
            extra -= 1
    return block_placement(problem, counts)


@heuristic("eplb", "DeepSeek's EPLB as published (hierarchical when groups divide over nodes)", leases=False)
def eplb(problem: ResidencyProblem) -> Placement:
    """Upstream EPLB per layer on the same slots per device (`eplb_slots`), or `eplb_distinct`
    where upstream's requirements do not hold.

    The same map as the drop-in `rebalance_experts(counts, slots, groups, nodes, devices,
    method="eplb")` on the window's summed counts (`problem.load_counts`; λ where there are
    none), kept as `slot_map`. Legitimately different: with leases, tenant quotas, fewer slots
    than experts or a replica limit below the devices (`eplb_distinct`, which upstream has no
    counterpart of), and in the residency objective, where a second slot of an expert on one
    device is no second page."""
    per_layer = eplb_slots(problem)
    if per_layer is None:
        return eplb_distinct(problem)
    groups, nodes = problem.expert_groups, problem.nodes
    if problem.experts % groups or groups % nodes:
        groups = nodes = 1  # upstream's global policy
    # the unscaled counts, as an engine passes them: λ rounds differently in EPLB's float32
    weight = problem.tokens if problem.load_counts is None else problem.load_counts
    phy2log, _, _ = deepseek_eplb(weight, per_layer, groups, nodes, problem.chiplets)
    resident = slot_replicas(phy2log, problem.experts, problem.chiplets) > 0
    # the map as planned: two slots of one expert on a device are one page here, two in the map
    return Placement(resident, slot_map=phy2log.reshape(problem.layers, problem.chiplets, -1))


def eplb_slots(problem: ResidencyProblem) -> int | None:
    """Slots per layer for upstream EPLB: every device gives each layer `capacity // layers`
    (the smallest device's, so that all give the same), within the budget, rounded down to a
    multiple of the devices as upstream requires; None where upstream cannot plan."""
    chiplets = problem.chiplets
    per_device = int(problem.capacity_pages.min()) // problem.layers
    per_device = min(per_device, problem.budget_pages // problem.layers // chiplets)
    leased = problem.leased is not None and problem.leased.any()
    upstream_cannot = per_device * chiplets < problem.experts or problem.max_replicas < chiplets
    if upstream_cannot or leased or problem.tenants:
        return None
    return per_device * chiplets


@heuristic("eplb-distinct", "EPLB with no two replicas of one expert on one device", leases=False)
def eplb_distinct(problem: ResidencyProblem) -> Placement:
    """EPLB's replicate-then-pack, per layer, with distinct devices per expert. Each device gives
    every layer `capacity // layers` slots, as an EP deployment does, and its remaining pages one
    more slot to as many layers, the most loaded first (no page is left unused). Leased replicas
    stay where they are and count against their layer's slots."""
    order = np.argsort(-problem.tokens.sum(axis=1), kind="stable")  # the most loaded layers first
    held = problem.leased.sum(axis=1) if problem.leased is not None else None  # [L, C]
    slots = np.stack(
        [
            _level_fill(int(pages), order, None if held is None else held[:, c])
            for c, pages in enumerate(problem.capacity_pages)
        ],
        axis=1,
    )  # [L, C]
    budget = _level_fill(problem.budget_pages, order, None if held is None else held.sum(axis=1))
    leased = problem.leased_replicas()
    counts = np.zeros((problem.layers, problem.experts), dtype=np.int64)
    for layer in range(problem.layers):
        per_layer = int(min(slots[layer].sum(), budget[layer]))
        counts[layer] = _eplb_replicate(problem.tokens[layer], per_layer, problem.max_replicas, leased[layer])
    counts = _respect_quotas(problem, counts)
    return Placement(
        np.stack([_eplb_pack(problem, layer, counts[layer], slots[layer]) for layer in range(problem.layers)])
    )


def _level_fill(total: int, order: np.ndarray, floor: np.ndarray | None) -> np.ndarray:
    """`total` pages over the layers as evenly as whole pages allow, each layer at least its
    `floor` (leased pages); a page goes to the layer with the fewest, first in `order` on ties."""
    out = np.zeros(order.size, dtype=np.int64) if floor is None else floor.astype(np.int64).copy()
    rank = np.empty(order.size, dtype=np.int64)
    rank[order] = np.arange(order.size)
    for _ in range(max(0, total - int(out.sum()))):
        out[np.lexsort((rank, out))[0]] += 1
    return out


def _eplb_replicate(load: np.ndarray, slots: int, max_replicas: int, floor: np.ndarray) -> np.ndarray:
    """One replica per expert, then one more for the largest load per replica, until the slots are
    used; never fewer than `floor` (leased) replicas."""
    counts = floor.astype(np.int64).copy()
    if slots < load.size:  # not every expert fits: the most loaded ones do
        for e in np.argsort(-load, kind="stable"):
            if counts.sum() >= slots:
                break
            counts[e] = max(counts[e], 1)
        return counts
    counts = np.maximum(counts, 1)
    for _ in range(slots - int(counts.sum())):
        ratio = np.where(counts < max_replicas, load / counts, -1.0)
        best = int(np.argmax(ratio))
        if ratio[best] < 0:
            break  # every expert is at the replica limit
        counts[best] += 1
    return counts


def _eplb_pack(problem: ResidencyProblem, layer: int, counts: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """Balanced packing: leased replicas where they are, then the heaviest replica first onto the
    least loaded device with a free slot."""
    tokens = problem.tokens[layer]
    out = np.zeros((problem.experts, problem.chiplets), dtype=bool)
    if problem.leased is not None:
        out |= problem.leased[layer]
    share = np.where(counts > 0, tokens / np.maximum(counts, 1), 0.0)
    used = out.sum(axis=0)
    load = (out * share[:, None]).sum(axis=0)
    missing = counts - out.sum(axis=1)
    pieces = [(-share[e], e) for e in np.flatnonzero(missing > 0) for _ in range(missing[e])]
    for neg_load, e in sorted(pieces):
        open_ = np.flatnonzero((used < slots) & ~out[e])
        if open_.size == 0:
            continue
        c = open_[np.argmin(load[open_])]
        out[e, c] = True
        used[c] += 1
        load[c] -= neg_load
    return out


@heuristic("greedy", "replicas where the objective falls most, one page at a time")
def greedy(problem: ResidencyProblem) -> Placement:
    counts = np.zeros((problem.layers, problem.experts), dtype=np.int64)
    limit = problem.page_limit
    prev = problem.previous_replicas()
    counts[:] = _floor_replicas(problem)
    quota = _QuotaTracker(problem, counts)
    w = problem.batches
    mean_work = problem.work_ms.min(axis=2).sum(axis=1) / problem.chiplets  # balance floor per layer
    heap: list[tuple[float, int, int]] = []

    def gain(layer: int, e: int) -> float:
        r = counts[layer, e]
        copy = 0.0 if r < prev[layer, e] else problem.copy_ms
        if r >= problem.max_replicas:
            return -np.inf
        if r == 0:
            return w * problem.miss_ms[layer, e] - copy
        piece = problem.work_ms[layer, e].min()
        floor = mean_work[layer]
        return w * (max(floor, piece / r) - max(floor, piece / (r + 1))) - copy

    for layer in range(problem.layers):
        for e in range(problem.experts):
            g = gain(layer, e)
            if g > 0:
                heapq.heappush(heap, (-g, layer, e))
    pages = int(counts.sum())
    while heap and pages < limit:
        neg, layer, e = heapq.heappop(heap)
        g = gain(layer, e)
        if g <= 0:
            continue
        if g < -neg - 1e-12:  # stale entry: re-queue with its current gain
            heapq.heappush(heap, (-g, layer, e))
            continue
        if not quota.allows(layer, e):
            continue
        counts[layer, e] += 1
        quota.add(layer, e)
        pages += 1
        g = gain(layer, e)
        if g > 0:
            heapq.heappush(heap, (-g, layer, e))
    # pages the gains leave unused hold flexible replicas: they never raise the objective (fill.py)
    return fill_spare(problem, assign_replicas(problem, counts))


# ---------------------------------------------------------------- helpers


def _popularity(problem: ResidencyProblem) -> np.ndarray:
    """Flat (l, e) indices, most used first (ties: more tokens, then lower index)."""
    used = problem.miss_ms.ravel() if problem.has("miss") else problem.tokens.ravel()
    return np.lexsort((-problem.tokens.ravel(), -used))


def _fill_first_replicas(
    problem: ResidencyProblem, counts: np.ndarray, order: np.ndarray, limit: int
) -> None:
    counts[:] = np.maximum(counts, _floor_replicas(problem))
    quota = _QuotaTracker(problem, counts)
    pages = int(counts.sum())
    for flat in order:
        if pages >= limit:
            break
        layer, e = divmod(int(flat), problem.experts)
        if counts[layer, e] == 0 and problem.miss_ms[layer, e] > 0 and quota.allows(layer, e):
            counts[layer, e] = 1
            quota.add(layer, e)
            pages += 1


def block_placement(problem: ResidencyProblem, counts: np.ndarray) -> Placement:
    """Vanilla expert-parallel layout: expert e's home is chiplet `e · C // E` (contiguous
    blocks of expert ids, as engines place experts by default), or the next chiplet
    with room; extra replicas go round-robin to the following chiplets."""
    resident = np.zeros((problem.layers, problem.experts, problem.chiplets), dtype=bool)
    if problem.leased is not None:
        resident |= problem.leased
    free = problem.capacity_pages.astype(np.int64) - resident.sum(axis=(0, 1))
    for layer in range(problem.layers):
        for e in range(problem.experts):
            home = e * problem.chiplets // problem.experts
            for step in range(problem.chiplets):
                if resident[layer, e].sum() >= counts[layer, e]:
                    break
                c = (home + step) % problem.chiplets
                if free[c] > 0 and not resident[layer, e, c]:
                    resident[layer, e, c] = True
                    free[c] -= 1
    return Placement(resident)


def _floor_replicas(problem: ResidencyProblem) -> np.ndarray:
    """Replicas every placement must keep: leased ones, and one per expert when all must be resident."""
    floor = problem.leased_replicas()
    if problem.all_resident:
        floor = np.maximum(floor, 1)
    return floor


def _respect_quotas(problem: ResidencyProblem, counts: np.ndarray) -> np.ndarray:
    """Drop the lightest replicas of a tenant over its quota, never below an expert's floor
    (its leased replicas; one replica when every expert must stay resident)."""
    counts = counts.copy()
    floor = _floor_replicas(problem)
    for tenant in problem.tenants:
        while int(counts[tenant.owns].sum()) > tenant.max_pages:
            owned = np.argwhere(tenant.owns & (counts > floor))
            if owned.size == 0:
                break  # the floor alone exceeds the quota: check_feasibility rejects such problems
            per = problem.tokens[owned[:, 0], owned[:, 1]] / counts[owned[:, 0], owned[:, 1]]
            layer, e = owned[np.argmin(per)]
            counts[layer, e] -= 1
    return counts


class _QuotaTracker:
    """Pages per tenant, so heuristics never exceed a tenant's quota."""

    def __init__(self, problem: ResidencyProblem, counts: np.ndarray):
        self.tenants = problem.tenants
        self.used = [int(counts[t.owns].sum()) for t in self.tenants]

    def allows(self, layer: int, e: int) -> bool:
        return all(
            not t.owns[layer, e] or used < t.max_pages
            for t, used in zip(self.tenants, self.used, strict=True)
        )

    def add(self, layer: int, e: int) -> None:
        for i, t in enumerate(self.tenants):
            if t.owns[layer, e]:
                self.used[i] += 1
