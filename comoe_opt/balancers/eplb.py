"""DeepSeek's EPLB (expert-parallel load balancer), written from its published algorithm, in numpy.

`deepseek_eplb(weight, num_replicas, num_groups, num_nodes, num_gpus)` (upstream's
`rebalance_experts`: the package keeps that name for its drop-in, balancers/dropin/)
takes per-layer expert loads and returns, like upstream:

* `phy2log` [layers, num_replicas] — the logical expert of each physical
  slot; slots `g·R/P … (g+1)·R/P − 1` are GPU g;
* `log2phy` [layers, experts, num_replicas − experts + 1] — each expert's
  slots, −1 padded;
* `logcnt` [layers, experts] — replicas per expert.

The algorithm (DeepSeek's EPLB README and paper):

1. *Hierarchical* (used when `num_groups % num_nodes == 0`): expert groups
   are packed onto nodes, each node receiving the same number of groups,
   heaviest group first to the lightest node with room (balanced packing);
   each node's experts are then replicated on the node's slots, and its
   replicas packed onto its GPUs the same way.
2. *Global* (otherwise): one group, one node — replicate over every slot,
   then pack replicas onto all GPUs.
3. Replication: every expert gets one replica; each further slot goes to the
   expert with the largest load per replica (first on ties).
4. Balanced packing: items sorted by load, heaviest first; each goes to the
   lightest pack that still has room (first on ties), every pack receiving
   the same number of items. Two replicas of one expert may share a GPU.

Upstream computes in float32 (`weight.float()`), which decides ties and
orders; so does this port. `num_replicas` must be a multiple of `num_gpus`,
`num_gpus` of `num_nodes`, and the experts of `num_groups`: upstream asserts
these, this port raises `ValueError`. Checked against upstream's own outputs
(tests/test_eplb_reference.py).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

SortKind = Literal["stable", "quicksort"]  # how items of equal load are ordered


def deepseek_eplb(
    weight: np.ndarray, num_replicas: int, num_groups: int, num_nodes: int, num_gpus: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(phy2log, log2phy, logcnt) of DeepSeek's EPLB for loads `weight` [layers, experts]."""
    load = np.asarray(weight, dtype=np.float32)
    check_weight(load)
    experts = load.shape[1]
    check_shape(experts, num_replicas, num_groups, num_nodes, num_gpus)
    if num_groups % num_nodes == 0:
        phy2log, rank, logcnt = hierarchical(load, num_replicas, num_groups, num_nodes, num_gpus)
    else:
        phy2log, rank, logcnt = hierarchical(load, num_replicas, 1, 1, num_gpus)
    return phy2log, log2phy_of(phy2log, rank, experts), logcnt


def log2phy_of(phy2log: np.ndarray, rank: np.ndarray, experts: int, width: int | None = None) -> np.ndarray:
    """[layers, experts, width] each expert's slots, the slot holding its replica r at place r,
    −1 padded to `width` (default, as upstream: the most replicas any expert has)."""
    layers, slots = phy2log.shape
    width = int(rank.max()) + 1 if width is None else width
    log2phy = np.full((layers, experts, width), -1, dtype=np.int64)
    rows = np.repeat(np.arange(layers), slots)
    log2phy[rows, phy2log.ravel(), rank.ravel()] = np.tile(np.arange(slots), layers)
    return log2phy


def slot_ranks(phy2log: np.ndarray) -> np.ndarray:
    """[layers, slots] each slot's place among its expert's slots, in slot order."""
    layers, slots = phy2log.shape
    order = np.argsort(phy2log, axis=1, kind="stable")  # each expert's slots together, ascending
    held = np.take_along_axis(phy2log, order, axis=1)
    starts = np.ones((layers, slots), dtype=bool)
    starts[:, 1:] = held[:, 1:] != held[:, :-1]
    first = np.maximum.accumulate(np.where(starts, np.arange(slots), 0), axis=1)
    ranks = np.empty((layers, slots), dtype=np.int64)
    np.put_along_axis(ranks, order, np.arange(slots) - first, axis=1)
    return ranks


def check_weight(load: np.ndarray) -> None:
    """Loads [layers, experts], every one finite (a NaN would make the packing's choices depend
    on how each engine compares it)."""
    if load.ndim != 2:
        raise ValueError(f"weight must be [layers, experts], got shape {load.shape}")
    if not np.isfinite(load).all():
        raise ValueError("weight must be finite in float32 (it holds NaN, infinity or a value above 3.4e38)")


def check_shape(experts: int, replicas: int, groups: int, nodes: int, gpus: int) -> None:
    """EPLB's arguments: at least one replica, group and node, the slot check, and the
    hierarchical mode's even splits where it applies."""
    for name, value in (("num_replicas", replicas), ("num_groups", groups), ("num_nodes", nodes)):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    check_slots(experts, replicas, gpus)
    if groups % nodes == 0:
        if experts % groups:
            raise ValueError(f"the experts ({experts}) must split evenly into num_groups ({groups})")
        if gpus % nodes:
            raise ValueError(f"num_gpus ({gpus}) must be a multiple of num_nodes ({nodes})")


def check_slots(experts: int, num_replicas: int, num_gpus: int) -> None:
    """What every engine asserts: whole slots per GPU and room for every expert."""
    if num_gpus < 1 or num_replicas % num_gpus:
        raise ValueError(f"num_replicas ({num_replicas}) must be a multiple of num_gpus ({num_gpus})")
    if num_replicas < experts:
        raise ValueError(f"num_replicas ({num_replicas}) must be at least the experts ({experts})")


def hierarchical(
    load: np.ndarray,
    replicas: int,
    groups: int,
    nodes: int,
    gpus: int,
    dtype: type = np.float32,
    kind: SortKind = "stable",
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(phy2log, replica rank of each slot, logcnt): groups onto nodes, replicas within each node,
    replicas onto the node's GPUs; loads per replica in `dtype`, items ordered by sort `kind`."""
    layers, experts = load.shape
    group_size = experts // groups
    per_node = experts // nodes  # logical experts per node
    # 1. groups onto nodes; "node-major" order lists each node's experts together
    group_load = load.reshape(layers, groups, group_size).sum(axis=2)
    node_of, rank_in_node = balanced_packing(group_load, nodes, dtype, kind)
    first = (node_of * (groups // nodes) + rank_in_node) * group_size  # [layers, groups]
    to_node_major = (first[:, :, None] + np.arange(group_size)).reshape(layers, experts)
    from_node_major = inverse(to_node_major)
    # 2. replicas within each node
    node_load = np.take_along_axis(load, from_node_major, axis=1).reshape(layers * nodes, per_node)
    phy2nm, phy_rank, nm_count = replicate(node_load, replicas // nodes, dtype)
    # 3. each node's replicas onto its GPUs
    replica_load = np.take_along_axis(node_load.astype(dtype) / nm_count.astype(dtype), phy2nm, axis=1)
    gpu_of, rank_on_gpu = balanced_packing(replica_load, gpus // nodes, dtype, kind)
    slot_of = gpu_of * (replicas // gpus) + rank_on_gpu
    phy_of_slot = inverse(slot_of)
    slot2nm = np.take_along_axis(phy2nm, phy_of_slot, axis=1).reshape(layers, nodes, -1)
    slot2nm = (slot2nm + (np.arange(nodes) * per_node)[None, :, None]).reshape(layers, -1)
    phy2log = np.take_along_axis(from_node_major, slot2nm, axis=1)
    slot_rank = np.take_along_axis(phy_rank, phy_of_slot, axis=1).reshape(layers, -1)
    logcnt = np.take_along_axis(nm_count.reshape(layers, -1), to_node_major, axis=1)
    return phy2log, slot_rank, logcnt


def balanced_packing(
    load: np.ndarray, packs: int, dtype: type = np.float32, kind: SortKind = "stable"
) -> tuple[np.ndarray, np.ndarray]:
    """(pack, rank in pack) of every item of each row [rows, items]; every pack gets items/packs items.

    Items go heaviest first (`kind`: the sort, which orders equal loads) to the lightest pack
    that is not full (first on ties); pack loads are summed in `dtype`. DeepSeek's EPLB sums in
    float32 with a stable sort; vLLM's sums in float64 with numpy's default sort."""
    rows, items = load.shape
    per_pack = items // packs
    if per_pack == 1:
        return np.tile(np.arange(items), (rows, 1)), np.zeros((rows, items), dtype=np.int64)
    pack = np.zeros((rows, items), dtype=np.int64)
    rank = np.zeros((rows, items), dtype=np.int64)
    full = dtype(np.inf)  # a full pack's load: never the lightest
    for r, order in enumerate(np.argsort(-load, axis=-1, kind=kind)):
        row = load[r]
        sums = [dtype(0.0)] * packs  # scalars, not an array: the loop runs once per item
        held = [0] * packs
        for item in order.tolist():
            chosen = sums.index(min(sums))  # the first lightest
            pack[r, item], rank[r, item] = chosen, held[chosen]
            held[chosen] += 1
            sums[chosen] = full if held[chosen] == per_pack else dtype(sums[chosen] + row[item])
    return pack, rank


def replicate(
    load: np.ndarray, slots: int, dtype: type = np.float32
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(phy2log, rank of each replica, replicas per expert): one replica each, then every further
    slot to the largest load per replica, computed in `dtype` (first on ties)."""
    rows, experts = load.shape
    phy2log = np.zeros((rows, slots), dtype=np.int64)
    rank = np.zeros((rows, slots), dtype=np.int64)
    count = np.ones((rows, experts), dtype=np.int64)
    phy2log[:, :experts] = np.arange(experts)
    everyone = np.arange(rows)
    wide: np.ndarray = load.astype(dtype)
    for slot in range(experts, slots):
        chosen = (wide / count.astype(dtype)).argmax(axis=1)
        phy2log[:, slot] = chosen
        rank[:, slot] = count[everyone, chosen]
        count[everyone, chosen] += 1
    return phy2log, rank, count


def inverse(permutation: np.ndarray) -> np.ndarray:
    """The inverse of each row's permutation [rows, n]."""
    out = np.empty_like(permutation)
    np.put_along_axis(out, permutation, np.arange(permutation.shape[1])[None, :], axis=1)
    return out
