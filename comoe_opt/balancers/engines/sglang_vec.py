"""SGLang's `deepseek_vec` and `deepseek_vec_hierarchical` EPLB algorithms, in numpy.

Written from SGLang's published source (`python/sglang/srt/eplb/eplb_algorithms/deepseek_vec.py`
and the dispatch in `__init__.py`, sglang 0.5.23 from the package registry, Apache-2.0); no
code is copied. Unlike DeepSeek's EPLB, which plans on a window's summed loads, these plan on
per-step counts `[steps, layers, experts]`:

1. *Replicas.* Each expert keeps one slot; every redundant slot goes, per layer (and per node
   in hierarchical mode), to the expert whose extra replica lowers most the *sum over steps of
   each step's largest load per replica*. For one step the largest load changes only if the
   replica goes to that step's most loaded expert, so an expert's score is the step maxima
   summed, with its own steps' maxima lowered to what its extra replica leaves. The step loads
   carry `1e-4 × expert id` so that no two are equal; the smallest score wins (first on ties).
2. *GPUs.* With more than one slot per GPU, the slots are sorted by their summed load per
   replica, heaviest first, and dealt to the GPUs in a snake (0, 1, …, G−1, G−1, …, 0, 0, …).
   Two replicas of one expert may land on one GPU.
3. *Hierarchical* (`deepseek_vec_hierarchical`): expert groups are first packed onto nodes,
   each node the same number of groups, heaviest group to the lightest node with room; steps
   1–2 then run per node on the node's slots.

Upstream computes in float32 (the step counts as given, the hierarchical mode after
`.float()`); so does this port. Upstream's sorts are torch's; where two slots or groups carry
exactly the same load their order may differ here, which changes no GPU's load. Checked
against upstream's own outputs (tests/test_engine_balancers.py, tests/data/sglang/).
"""

from __future__ import annotations

import numpy as np

from comoe_opt.balancers.eplb import balanced_packing, check_slots, inverse, log2phy_of, slot_ranks

TIE_BREAK = np.float32(1e-4)  # upstream's per-expert offset, so that no two step loads are equal


def sglang_vec(
    weight_or_steps: np.ndarray, num_replicas: int, num_groups: int, num_nodes: int, num_gpus: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(phy2log, log2phy, logcnt) of SGLang's `deepseek_vec` (plain mode: groups and nodes are
    not used, as upstream) on per-step counts [steps, layers, experts] or one step [layers, experts]."""
    del num_groups, num_nodes  # the plain mode plans over every slot at once
    steps = _steps(weight_or_steps)
    check_slots(steps.shape[2], num_replicas, num_gpus)
    return _chunkwise(steps, num_replicas, num_replicas // num_gpus, num_replicas)


def sglang_vec_hierarchical(
    weight_or_steps: np.ndarray, num_replicas: int, num_groups: int, num_nodes: int, num_gpus: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(phy2log, log2phy, logcnt) of SGLang's `deepseek_vec_hierarchical`: groups packed onto
    nodes, then `deepseek_vec` within each node."""
    steps = _steps(weight_or_steps).astype(np.float32)
    _, layers, experts = steps.shape
    check_slots(experts, num_replicas, num_gpus)
    if num_groups < 1 or experts % num_groups or num_groups % num_nodes:
        raise ValueError(
            f"the experts ({experts}) must split into num_groups ({num_groups}), "
            f"and the groups over num_nodes ({num_nodes})"
        )
    if num_replicas % num_nodes or experts % num_nodes or (num_replicas - experts) % num_nodes:
        raise ValueError(f"experts and slots must split evenly over num_nodes ({num_nodes})")
    size = experts // num_groups
    group_load = steps.sum(axis=0).reshape(layers, num_groups, size).sum(axis=2)
    position = pack_groups(group_load, num_nodes)  # [layers, groups]: the group's place, node-major
    to_node_major = (position[:, :, None] * size + np.arange(size)).reshape(layers, experts)
    from_node_major = inverse(to_node_major)
    node_major = np.take_along_axis(steps, from_node_major[None], axis=2)
    phy2nm, nm2phy, nm_count = _chunkwise(
        node_major, num_replicas, num_replicas // num_gpus, num_replicas // num_nodes
    )
    phy2log = np.take_along_axis(from_node_major, phy2nm, axis=1)
    log2phy = np.take_along_axis(nm2phy, to_node_major[:, :, None], axis=1)
    logcnt = np.take_along_axis(nm_count, to_node_major, axis=1)
    return phy2log, log2phy, logcnt


def pack_groups(group_load: np.ndarray, nodes: int) -> np.ndarray:
    """[layers, groups] place of each group in node-major order: heaviest group first, to the
    node with room and the least load (first on ties), as EPLB's balanced packing, except that
    with one group a node the heaviest goes to node 0 (EPLB's packing keeps them in place)."""
    groups = group_load.shape[1]
    if groups == nodes:
        return inverse(np.argsort(-group_load, axis=1, kind="stable"))
    node, rank = balanced_packing(group_load.astype(np.float32), nodes)
    return node * (groups // nodes) + rank


def _steps(weight_or_steps: np.ndarray) -> np.ndarray:
    steps = np.asarray(weight_or_steps)
    if steps.ndim == 2:
        steps = steps[None]
    if steps.ndim != 3:
        raise ValueError(
            f"counts must be [steps, layers, experts] or [layers, experts], got shape {steps.shape}"
        )
    return steps


def _chunkwise(
    steps: np.ndarray, replicas: int, per_gpu: int, per_chunk: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Upstream's `make_redundant_experts_chunkwise`: slots in chunks of `per_chunk` (one per
    node; the plain mode has one chunk), each chunk's experts replicated on its slots."""
    _, layers, experts = steps.shape
    chunks = replicas // per_chunk
    if replicas % per_chunk or experts % chunks or (replicas - experts) % chunks or per_chunk % per_gpu:
        raise ValueError("slots, experts and redundant slots must split evenly over the nodes' GPUs")
    own = experts // chunks  # logical experts per chunk
    load = steps.astype(np.float32)
    distinct = load + np.arange(experts, dtype=np.float32) * TIE_BREAK
    count = np.ones((layers, experts), dtype=np.int64)
    # slots: each chunk's own experts first, then its redundant slots in the order they are chosen
    phy2log = np.empty((layers, chunks, per_chunk), dtype=np.int64)
    phy2log[:, :, :own] = np.arange(experts).reshape(chunks, own)
    for extra in range((replicas - experts) // chunks):
        chosen = _next_replica(load, distinct, count, chunks, own)  # [layers, chunks] within chunk
        phy2log[:, :, own + extra] = chosen + np.arange(chunks) * own
        np.add.at(count, (np.arange(layers)[:, None], chosen + np.arange(chunks) * own), 1)
    created = phy2log.reshape(layers, replicas)  # each expert's replicas in the order they were made
    order = np.broadcast_to(np.arange(replicas), (layers, replicas))
    if per_gpu > 1:
        order = _snake(_summed(steps), created, count, chunks, per_chunk, per_gpu)
    # each expert's new slots listed in the order its replicas were created (upstream's log2phy)
    rank = np.take_along_axis(slot_ranks(created), order, axis=1)
    phy2log = np.take_along_axis(created, order, axis=1)
    return phy2log, log2phy_of(phy2log, rank, experts, replicas - experts + 1), count


def _summed(steps: np.ndarray) -> np.ndarray:
    """The counts summed over steps as upstream: exactly for integers, in float32 otherwise."""
    if np.issubdtype(steps.dtype, np.integer):
        return steps.sum(axis=0).astype(np.float32)
    return np.add.reduce(steps.astype(np.float32), axis=0, dtype=np.float32)


def _next_replica(
    load: np.ndarray, distinct: np.ndarray, count: np.ndarray, chunks: int, own: int
) -> np.ndarray:
    """[layers, chunks] the expert (index within its chunk) whose extra replica lowers the sum
    over steps of each step's largest load per replica the most."""
    steps, layers, _ = load.shape
    score = (distinct / count.astype(np.float32)).reshape(steps, layers, chunks, own)
    if_added = (load / (count + 1).astype(np.float32)).reshape(steps, layers, chunks, own)
    top = score.argmax(axis=3)[..., None]  # each step's most loaded expert (first on ties)
    peak = np.take_along_axis(score, top, axis=3)
    lowered = score.copy()
    np.put_along_axis(lowered, top, np.take_along_axis(if_added, top, axis=3), axis=3)
    values = np.broadcast_to(peak, score.shape).copy()
    np.put_along_axis(values, top, lowered.max(axis=3, keepdims=True), axis=3)
    total = np.add.reduce(values, axis=0, dtype=np.float32)  # [layers, chunks, own]
    return total.argmin(axis=2)


def _snake(
    summed: np.ndarray, phy2log: np.ndarray, count: np.ndarray, chunks: int, per_chunk: int, per_gpu: int
) -> np.ndarray:
    """[layers, slots] the old slot each new slot takes: per chunk, slots by load per replica,
    heaviest first, dealt to the chunk's GPUs in a snake."""
    layers = phy2log.shape[0]
    per_replica = np.take_along_axis(summed, phy2log, axis=1) / np.take_along_axis(
        count, phy2log, axis=1
    ).astype(np.float32)
    ranked = np.argsort(-per_replica.reshape(layers, chunks, per_chunk), axis=2, kind="stable")
    ranked = ranked + (np.arange(chunks) * per_chunk)[None, :, None]
    gpus = per_chunk // per_gpu
    rows = ranked.reshape(layers, chunks, per_gpu, gpus).copy()  # row r holds ranks r*G .. r*G+G-1
    rows[:, :, 1::2, :] = rows[:, :, 1::2, ::-1]
    return rows.transpose(0, 1, 3, 2).reshape(layers, chunks * per_chunk)
