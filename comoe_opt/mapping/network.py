"""The static skeleton of a layer's flow network and the lower bound on its makespan.

Experts whose rows of first usable slots are identical are interchangeable,
so they share one *group* node (at most one per distinct replica set, plus
one for all experts loaded on demand). Each chiplet has one *level* node per
distinct first usable slot among the groups it can serve; a token entering
level `k` may use slot `level.slot[k]` or any later one, which the free chain
arcs `k -> k+1` express (formulations/mapping.md §3). All of it depends on
the placement only, so it is built once per layer and reused for every
micro-batch; `per_token_graph` builds it with one group per selection instead.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field

import numpy as np

from comoe_opt.mapping.problem import NEVER, LayerCosts

FAR = np.int64(1) << 40  # beyond any slot index
WINDOW_SLOTS = 2  # first window above the lower bound, in slots of the slowest chiplet


@dataclass(frozen=True, eq=False)
class Levels:
    """Level nodes, sorted by (chiplet, first slot); arrays of length NL."""

    chiplet: np.ndarray
    slot: np.ndarray  # first slot of the level
    last: np.ndarray  # last slot before the chiplet's next level (FAR if none)
    end: np.ndarray  # index of the first level of the next chiplet
    first_done: np.ndarray  # completion time of slot 0 of the level's chiplet
    tau: np.ndarray  # token time of the level's chiplet
    last_node: np.ndarray  # int32 node of each chiplet's last level (chiplets with levels only)

    @property
    def size(self) -> int:
        return self.slot.size


@dataclass(frozen=True, eq=False)
class Bound:
    """Static data of the makespan lower bound (see `lower_bound`).

    Each row is a set of groups (`members`) whose tokens can only run on the
    chiplets, and from the starts, that the row's `num`/`den` describe: its
    water level over the m+1 earliest of those chiplets is
    (volume + num[r, m]) / den[r, m].
    """

    members: np.ndarray  # [R, G] float 0/1
    num: np.ndarray  # [R, C]
    den: np.ndarray  # [R, C]
    single: np.ndarray  # [G] earliest completion of one token of each group


@dataclass(frozen=True, eq=False)
class LayerGraph:
    """Group nodes 0..G-1, level nodes G..G+NL-1, the sink G+NL, and the arcs between them."""

    group_of: np.ndarray  # [rows] group of each expert (or selection)
    sort_key: np.ndarray  # [rows] rank of each row in (group, row) order
    slots: np.ndarray  # [G, C] first usable slot, NEVER where the group cannot go
    levels: Levels
    bound: Bound | None  # None for the per-token graph: bound the problem with the layer's graph
    arc_chiplet: np.ndarray  # [A] chiplet of each group arc (arcs sorted by group, chiplet)
    arc_level: np.ndarray  # [A] level index of each group arc
    static_tails: np.ndarray  # [A + chain] int32: group arcs, then chain arcs
    static_heads: np.ndarray  # [A + chain] int32
    level_nodes: np.ndarray  # [NL] int32 node ids of the levels
    stranded: np.ndarray  # groups that no chiplet can serve
    window: int  # first window above the lower bound priced slot by slot, in ticks
    done_first: np.ndarray  # [C] completion time of slot 0 of each chiplet (for snapping bounds)
    tau: np.ndarray  # [C] token times
    cache: dict = field(default_factory=dict)  # arc sets by (lower, window), filled by `flow`

    @property
    def groups(self) -> int:
        return self.slots.shape[0]

    @property
    def group_arcs(self) -> int:
        return self.arc_level.size

    @property
    def sink(self) -> int:
        return self.groups + self.levels.size


_SKELETONS: weakref.WeakKeyDictionary[LayerCosts, LayerGraph] = weakref.WeakKeyDictionary()


def costs_graph(costs: LayerCosts) -> LayerGraph:
    """The static part of the flow network of `costs`, built once per layer and placement
    (kept while the costs object lives)."""
    graph = _SKELETONS.get(costs)
    if graph is None:
        graph = _SKELETONS[costs] = layer_graph(costs)
    return graph


def layer_graph(costs: LayerCosts) -> LayerGraph:
    """Skeleton with experts grouped by identical rows of first usable slots."""
    rows, group_of = unique_rows(costs.slots)
    rank = np.empty(group_of.size, dtype=np.int64)
    rank[np.lexsort((np.arange(group_of.size), group_of))] = np.arange(group_of.size)
    # int16 keys let numpy's stable argsort use radix sort in the disaggregation
    key_type = np.int16 if group_of.size < np.iinfo(np.int16).max else np.int64
    return build_graph(costs, rows, group_of, rank.astype(key_type), with_bound=True)


def per_token_graph(costs: LayerCosts, experts: np.ndarray) -> LayerGraph:
    """Skeleton with one group per (token, expert) selection: the unaggregated network."""
    flat = experts.ravel()
    index = np.arange(flat.size)
    return build_graph(costs, costs.slots[flat], index, index, with_bound=False)


def build_graph(
    costs: LayerCosts, slots: np.ndarray, group_of: np.ndarray, sort_key: np.ndarray, *, with_bound: bool
) -> LayerGraph:
    groups, chiplets = slots.shape
    allowed = slots != NEVER
    key = np.arange(chiplets, dtype=np.int64) * FAR + slots  # ordered by (chiplet, slot)
    level_key = np.unique(key[allowed])
    levels = _levels(costs, level_key // FAR, level_key % FAR, groups)
    arc_group, arc_chiplet = np.nonzero(allowed)  # row-major: sorted by (group, chiplet)
    arc_level = np.searchsorted(level_key, key[arc_group, arc_chiplet])
    chain = np.flatnonzero(levels.last < FAR)  # level k -> k + 1 on the same chiplet
    return LayerGraph(
        group_of=group_of,
        sort_key=sort_key,
        slots=slots,
        levels=levels,
        bound=_bound(costs, slots, allowed) if with_bound else None,
        arc_chiplet=arc_chiplet,
        arc_level=arc_level,
        static_tails=np.concatenate((arc_group, groups + chain)).astype(np.int32),
        static_heads=np.concatenate((groups + arc_level, groups + chain + 1)).astype(np.int32),
        level_nodes=(groups + np.arange(levels.size)).astype(np.int32),
        stranded=np.flatnonzero(~allowed.any(axis=1)),
        window=WINDOW_SLOTS * int(costs.token_time.max()),
        done_first=costs.base + costs.token_time,
        tau=costs.token_time,
    )


def _levels(costs: LayerCosts, chiplet: np.ndarray, slot: np.ndarray, groups: int) -> Levels:
    same_next = np.append(chiplet[1:] == chiplet[:-1], False)
    last = np.where(same_next, np.append(slot[1:], 0) - 1, FAR)
    starts = np.flatnonzero(np.append(True, chiplet[1:] != chiplet[:-1])) if chiplet.size else chiplet
    ends = np.append(starts[1:], chiplet.size).astype(np.int64) if chiplet.size else chiplet
    return Levels(
        chiplet=chiplet,
        slot=slot,
        last=last,
        end=np.repeat(ends, ends - starts),
        first_done=(costs.base + costs.token_time)[chiplet],
        tau=costs.token_time[chiplet],
        last_node=(groups + ends - 1).astype(np.int32),
    )


def _bound(costs: LayerCosts, slots: np.ndarray, allowed: np.ndarray) -> Bound:
    tau = costs.token_time.astype(np.float64)
    earliest = np.where(allowed, costs.base + slots * tau, np.inf)  # earliest start per (group, chiplet)
    members, _ = unique_rows(np.vstack((_later_starters(earliest), _contained(allowed))))
    starts = _member_min(members, earliest)
    by_start = np.argsort(starts, axis=1, kind="stable")
    inv = 1.0 / tau[by_start]  # > 0, so inf starts never meet inf - inf
    num = np.cumsum(np.take_along_axis(starts, by_start, axis=1) * inv, axis=1)
    single = (earliest + tau).min(axis=1, initial=np.inf)
    return Bound(members.astype(np.float64), num, np.cumsum(inv, axis=1), single)


def unique_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`np.unique(rows, axis=0, return_inverse=True)` (distinct rows in lexicographic order, and
    each row's index among them) by one lexsort: several times faster on the small integer
    matrices of a layer, which the evaluator's oracle rebuilds every micro-batch."""
    order = np.lexsort(rows.T[::-1])  # the first column the most significant
    ordered = rows[order]
    new = np.ones(len(rows), dtype=bool)
    new[1:] = (ordered[1:] != ordered[:-1]).any(axis=1)
    inverse = np.empty(len(rows), dtype=np.int64)
    inverse[order] = np.cumsum(new) - 1
    return ordered[new], inverse


MEMBER_CHUNK = 1 << 20  # elements of the [rows, groups, chiplets] block `_member_min` takes at once (8 MiB)


def _member_min(members: np.ndarray, earliest: np.ndarray) -> np.ndarray:
    """[R, C] the earliest start on each chiplet over each row's member groups."""
    groups, chiplets = earliest.shape
    step = max(1, MEMBER_CHUNK // max(groups * chiplets, 1))
    chunks = [
        np.where(members[i : i + step, :, None] > 0, earliest[None], np.inf).min(axis=1)
        for i in range(0, len(members), step)
    ]
    return np.concatenate(chunks) if chunks else np.zeros((0, chiplets))


def _later_starters(earliest: np.ndarray) -> np.ndarray:
    """Rows: the r groups with the latest earliest start, r = 1..G (pages that arrive late)."""
    rank = np.argsort(np.argsort(-earliest.min(axis=1, initial=np.inf), kind="stable"))
    return (rank[None, :] <= np.arange(rank.size)[:, None]).astype(np.int8)


def _contained(allowed: np.ndarray) -> np.ndarray:
    """Row g: the groups whose chiplets are all chiplets of g (replica sets nested in g's)."""
    outside = allowed.astype(np.int64) @ (~allowed).T.astype(np.int64)  # [h, g] chiplets of h not in g
    return (outside.T == 0).astype(np.int8)


def lower_bound(graph: LayerGraph, demand: np.ndarray) -> int:
    """A lower bound on the minimum makespan, in ticks (formulations/mapping.md §5).

    The larger of: the earliest completion of one token of every demanded
    group; and, for each row of groups (the groups that start latest; the
    groups whose replicas all lie within one group's chiplets), the least T
    with sum_c (T - start_c)^+ / token_time_c >= their tokens (water filling:
    the smallest of the levels over the number of chiplets that share).
    Snapped down to the latest slot completion time at or below it, so that
    micro-batches share the same bounds (and arc sets).
    """
    b = graph.bound
    assert b is not None, "lower bounds come from the layer's aggregated graph"
    volume = b.members @ demand
    level = ((volume[:, None] + b.num) / b.den).min(axis=1)
    best = max(float(b.single[demand > 0].max()), float(level[volume > 0].max()))
    bound = math.ceil(best - 1e-6)  # float noise must not lift a bound past an integer optimum
    # the makespan is some slot's completion time: snap down to the latest one <= bound
    done = graph.done_first + (bound - graph.done_first) // graph.tau * graph.tau
    return int(done.max())
