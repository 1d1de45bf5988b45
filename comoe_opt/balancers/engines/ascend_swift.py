"""vLLM-Ascend's SwiftBalancer (`eplb_policy_type = 2`, "dynamic EPLB policy V2"), in numpy.

Written from vLLM-Ascend's published source (`vllm_ascend/eplb/core/policy/policy_swift_balancer.py`
at commit 182b75e, Apache-2.0); no code is copied. Unlike DeepSeek's EPLB it starts from the map
in service and changes only part of it, per layer:

1. A layer whose imbalance (largest GPU load over the mean, each expert's load split evenly
   over its replicas) is below 1.01 is left as it is.
2. *Redundant slots.* A slot is redundant if its expert already sits in an earlier slot
   (scanning slot position by position, GPU by GPU). The redundant slots are re-dealt: each
   goes to the expert with the largest current weight (ties: the later expert in the scan)
   that has fewer replicas than GPUs; that expert's weight is then scaled by (r+1)/(r+2), where
   r is its redundant replicas so far — a rule of upstream's, which makes the first extra
   replica leave 2/3 of the load, not 1/2. Extra replicas are placed heaviest first on the
   lightest GPU with a redundant slot free, not holding the expert, and not yet sending to or
   receiving from its home GPU; slots left empty are filled with the heaviest experts by
   load per replica.
3. *Swaps.* Up to 100 times, the most loaded GPU swaps one expert with a lighter GPU it has not
   exchanged with yet (lightest first), the pair lowering the larger of the two loads most,
   if it lowers it by at least 1% of the mean GPU load. Experts just moved do not move again.
4. The result is kept if its largest GPU load over the mean is below the layer's imbalance
   (upstream takes the mean of the first layer for every layer; so does this port). Experts
   that stay on a GPU keep their slots.

Deviations: upstream reads the devices per host from the NPU runtime (`torch.npu.device_count()`),
used only with `is_node_redundant`; this port plans as upstream's default (`is_node_redundant =
False`: one node). Upstream iterates Python sets of expert ids; the port builds its sets in
the same order, so that its ties fall the same way on CPython. Checked against upstream's own
outputs (tests/test_engine_balancers.py, tests/data/ascend/).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from comoe_opt.balancers.eplb import check_slots
from comoe_opt.balancers.maps import map_in_service, maps_of

IMBALANCE_THRESHOLD = 1.01  # layers more balanced than this are left alone
SWAP_SHARE = 0.01  # a swap must lower the largest load by this share of the mean GPU load
MAX_SWAPS = 100
MAX_EXCHANGES = 1  # swaps or copies between any two GPUs per re-plan


def ascend_swift(
    weight_or_steps: np.ndarray,
    num_replicas: int,
    num_groups: int,
    num_nodes: int,
    num_gpus: int,
    old_phy2log: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(phy2log, log2phy, logcnt) of SwiftBalancer from the map in service `old_phy2log`
    [layers, num_replicas] (default: the engine's initial layout) and loads [layers, experts]
    (per-step counts are summed). Groups and nodes are not used, as upstream's default."""
    del num_groups, num_nodes
    weight = np.asarray(weight_or_steps)
    weight = weight.sum(axis=0) if weight.ndim == 3 else weight
    if weight.ndim != 2:
        raise ValueError(f"weight must be [layers, experts], got shape {weight.shape}")
    weight = weight.astype(np.float64)
    layers, experts = weight.shape
    check_slots(experts, num_replicas, num_gpus)
    old = map_in_service(old_phy2log, layers, experts, num_replicas)
    table = old.reshape(layers, num_gpus, -1)
    for layer in range(layers):
        if np.unique(table[layer]).size != experts:
            raise ValueError(f"old_phy2log must hold every expert in layer {layer}")
    new = _rebalance(table, weight)
    return maps_of(new.reshape(layers, num_replicas), experts)


def _rebalance(table: np.ndarray, weight: np.ndarray) -> np.ndarray:
    layers, gpus, _ = table.shape
    mean = weight[0].sum() / gpus  # upstream: the first layer's mean GPU load, for every layer
    threshold = mean * SWAP_SHARE
    new = table.copy()
    for layer in range(layers):
        before = imbalance(table[layer], weight[layer])
        if before < IMBALANCE_THRESHOLD:
            continue
        planned, largest = _plan_layer(table[layer], weight[layer], threshold)
        if largest / mean < before:
            new[layer] = planned
    return np.stack([_keep_positions(table[l], new[l]) for l in range(layers)])


def imbalance(table: np.ndarray, weight: np.ndarray) -> float:
    """Largest GPU load over the mean, each expert's load split evenly over its replicas."""
    copies = np.zeros(weight.shape, dtype=np.float64)
    for row in table:
        for e in row:
            copies[e] += 1
    largest, total = 0.0, 0.0
    for row in table:
        load = 0.0
        for e in row:
            share = weight[e] / copies[e]
            load += share
            total += share
        largest = max(largest, load)
    mean = total / table.shape[0]
    return 1.0 if abs(mean) < 1e-9 else largest / mean


def _plan_layer(table: np.ndarray, weight: np.ndarray, threshold: float) -> tuple[np.ndarray, float]:
    gpus, per_gpu = table.shape
    free, home, present = _scan(table)
    initial = [(e, weight[e]) for e in present]
    extra_list, per_replica = _extra_replicas(initial, sum(len(f) for f in free), gpus, weight.size)
    slots = np.full((gpus, per_gpu), -1, dtype=np.int64)
    loads = np.zeros(gpus, dtype=np.float32)
    for g in range(gpus):
        for i, e in enumerate(table[g]):
            if i not in free[g]:
                slots[g, i] = e
                loads[g] += per_replica[e]
    links = np.zeros((gpus, gpus), dtype=np.int64)
    moved: defaultdict[int, set[int]] = defaultdict(set)
    for e, w in extra_list:
        target = -1
        for g in range(gpus):
            if not free[g] or e in slots[g] or links[home[e], g] >= MAX_EXCHANGES:
                continue
            if target == -1 or loads[g] < loads[target]:
                target = g
        if target != -1:
            slots[target, free[target].pop()] = e
            loads[target] += w
            links[home[e], target] += 1
            moved[target].add(e)
    if any(free):
        per_replica, loads = _fill(initial, slots, free, links, moved, home)
    return _swap(slots, loads, links, moved, per_replica, threshold)


def _scan(table: np.ndarray) -> tuple[list[list[int]], np.ndarray, set[int]]:
    """(redundant slot positions per GPU, home GPU of each expert, the experts present as a
    set built in scan order): slot position by position, GPU by GPU."""
    gpus, per_gpu = table.shape
    free: list[list[int]] = [[] for _ in range(gpus)]
    home = np.zeros(int(table.max()) + 1, dtype=np.int64)
    present: set[int] = set()
    for i in range(per_gpu):
        for g in range(gpus):
            e = int(table[g, i])
            if e in present:
                free[g].append(i)
            else:
                present.add(e)
                home[e] = g
    return free, home, present


def _extra_replicas(
    initial: list[tuple[int, float]], extra: int, gpus: int, experts: int
) -> tuple[list[tuple[int, float]], np.ndarray]:
    current = list(initial)
    added = np.zeros(experts, dtype=np.int64)
    for _ in range(extra):
        order = np.argsort([w for _, w in current], kind="stable")[::-1]
        for index in order:
            e, w = current[index]
            replicas = added[e] + 1
            if replicas < gpus:
                added[e] += 1
                current[index] = (e, w * (replicas + 1) / (replicas + 2))
                break
    per_replica = np.zeros(experts, dtype=np.float32)
    for e, w in current:
        per_replica[e] = w
    listed = [(e, float(per_replica[e])) for e in range(experts) for _ in range(added[e])] if extra else []
    listed.sort(key=lambda item: item[1], reverse=True)
    return listed, per_replica


def _fill(
    initial: list[tuple[int, float]],
    slots: np.ndarray,
    free: list[list[int]],
    links: np.ndarray,
    moved: defaultdict[int, set[int]],
    home: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Redundant slots no extra replica took: the heaviest expert by load per replica that the
    GPU lacks (no exchange limit here, as upstream)."""
    experts = len(initial)
    held = np.zeros(experts, dtype=np.int64)
    for row in slots:
        for e in row:
            if e != -1:
                held[e] += 1
    per_replica = np.full(experts, -1, dtype=np.float32)
    for e, w in initial:
        per_replica[e] = w / held[e]
    for g in [g for g in range(len(free)) if free[g]]:
        for position in free[g]:
            for e in np.argsort(per_replica, kind="stable")[::-1]:
                if e in slots[g]:
                    continue
                slots[g, position] = e
                links[home[e], g] += 1
                moved[g].add(int(e))
                per_replica[e] *= held[e] / (held[e] + 1)
                held[e] += 1
                break
    loads = np.zeros(len(slots), dtype=np.float32)
    for g, row in enumerate(slots):
        for e in row:
            loads[g] += per_replica[e]
    return per_replica, loads


def _swap(
    slots: np.ndarray,
    loads: np.ndarray,
    links: np.ndarray,
    moved: defaultdict[int, set[int]],
    per_replica: np.ndarray,
    threshold: float,
) -> tuple[np.ndarray, float]:
    """The most loaded GPU swaps one expert with a lighter one, at most MAX_SWAPS times."""
    held = [set(row) for row in slots.tolist()]
    largest = 0.0
    swapped = True
    for _ in range(MAX_SWAPS):
        order = np.argsort(loads, kind="stable")
        top = int(order[-1])
        largest = float(loads[top])
        if not swapped:
            break
        swapped = False
        for other in order[:-1]:
            if links[other, top] >= MAX_EXCHANGES or links[top, other] >= MAX_EXCHANGES:
                continue
            give, take, after = _best_pair(
                held[top], held[other], moved[top], moved[other], per_replica, largest, loads[other]
            )
            if largest - after < threshold or give == -1:
                continue
            held[top].remove(give)
            held[other].remove(take)
            held[top].add(take)
            held[other].add(give)
            loads[top] += per_replica[take] - per_replica[give]
            loads[other] += per_replica[give] - per_replica[take]
            moved[top].add(take)
            moved[other].add(give)
            links[other, top] += 1
            links[top, other] += 1
            swapped = True
            break
    return np.array([list(s) for s in held], dtype=np.int64), largest


def _best_pair(
    top: set[int],
    other: set[int],
    top_moved: set[int],
    other_moved: set[int],
    per_replica: np.ndarray,
    top_load: float,
    other_load: np.float32,
) -> tuple[int, int, float | np.floating]:
    """(expert leaving the top GPU, expert coming, larger load after) of the swap that lowers the
    larger of the two loads most; (-1, -1, top_load) if none does. The lighter GPU's load stays
    a float32 in the arithmetic, as upstream's."""
    give, take = -1, -1
    best: float | np.floating = top_load
    for a in top:
        if a in other or a in top_moved:
            continue
        wa = float(per_replica[a])
        for b in other:
            if b in top or b in other_moved:
                continue
            wb = float(per_replica[b])
            mine, theirs = top_load - wa + wb, other_load - wb + wa
            after = theirs if theirs > mine else mine  # Python's max: the first on ties
            if after < best:
                give, take, best = a, b, after
    return give, take, best


def _keep_positions(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Per GPU, experts that stay keep their slot; the others fill the freed slots in order."""
    out = np.empty_like(new)
    for g in range(new.shape[0]):
        before, after = [int(x) for x in old[g]], [int(x) for x in new[g]]
        result: list[int | None] = [None] * len(after)
        rest = []
        for e in after:
            j = next((j for j, x in enumerate(before) if x == e and result[j] is None), None)
            if j is None:
                rest.append(e)
            else:
                result[j] = e
        fill = iter(rest)
        out[g] = [x if x is not None else next(fill) for x in result]
    return out
