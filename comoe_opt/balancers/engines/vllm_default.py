"""vLLM's `default` EPLB policy, in numpy.

Written from vLLM's published source (`vllm/distributed/eplb/policy/default.py`, vllm 0.33.0 from
the package registry, Apache-2.0); no code is copied. It is DeepSeek's EPLB (groups packed onto
nodes when `num_groups % num_nodes == 0`, else one group on one node; one replica per expert,
each further slot to the largest load per replica; replicas packed heaviest first onto the
lightest GPU with a free slot), with two differences that show in its outputs:

* vLLM computes the replica and packing loads in float64 (from `weight.float()`), and orders
  items with numpy's default (not stable) sort, which this port calls alike;
* given the old map (`old_phy2log`), it keeps an expert that stays on a GPU in the slot it had
  there: per GPU, each old slot keeps its expert if the new plan still has it on that GPU, and
  the experts new to the GPU fill the other slots in plan order. This saves copies within a GPU,
  not between GPUs.

vLLM plans on a window of summed counts (default 1000 steps, re-arranging every 3000). Checked
against upstream's own outputs (tests/test_engine_balancers.py, tests/data/vllm/).
"""

from __future__ import annotations

import numpy as np

from comoe_opt.balancers.eplb import check_slots, check_weight, hierarchical
from comoe_opt.balancers.maps import maps_of


def vllm_default(
    weight_or_steps: np.ndarray,
    num_replicas: int,
    num_groups: int,
    num_nodes: int,
    num_gpus: int,
    old_phy2log: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(phy2log, log2phy, logcnt) of vLLM's default policy on loads [layers, experts] (per-step
    counts [steps, layers, experts] are summed first, as vLLM's window does)."""
    weight = np.asarray(weight_or_steps)
    if weight.ndim == 3:
        weight = weight.sum(axis=0)
    weight = weight.astype(np.float32)
    check_weight(weight)
    experts = weight.shape[1]
    check_slots(experts, num_replicas, num_gpus)
    if num_groups < 1 or num_nodes < 1:
        raise ValueError("num_groups and num_nodes must be at least 1")
    if num_groups % num_nodes:
        num_groups = num_nodes = 1  # vLLM's global policy
    if experts % num_groups or num_gpus % num_nodes:
        raise ValueError(
            f"the experts ({experts}) must split into num_groups ({num_groups}), the GPUs over the nodes"
        )
    phy2log = hierarchical(weight, num_replicas, num_groups, num_nodes, num_gpus, np.float64, "quicksort")[0]
    if old_phy2log is not None:
        old = np.asarray(old_phy2log, dtype=np.int64)
        if old.shape != phy2log.shape:
            raise ValueError(f"old_phy2log must be [layers, num_replicas] = {phy2log.shape}, got {old.shape}")
        phy2log = keep_slots(phy2log, old, num_gpus)
    return maps_of(phy2log, experts)


def keep_slots(new: np.ndarray, old: np.ndarray, gpus: int) -> np.ndarray:
    """The new map with each GPU's staying experts in their old slots; experts new to the GPU fill
    the other slots in the plan's order."""
    layers, replicas = new.shape
    per_gpu = replicas // gpus
    out = new.copy()
    for layer in range(layers):
        for g in range(gpus):
            span = slice(g * per_gpu, (g + 1) * per_gpu)
            planned, before = list(new[layer, span]), old[layer, span]
            taken = [False] * per_gpu
            kept: list[int | None] = [None] * per_gpu
            for slot, expert in enumerate(before):
                match = next((i for i, e in enumerate(planned) if e == expert and not taken[i]), None)
                if match is not None:
                    taken[match] = True
                    kept[slot] = planned[match]
            rest = iter(e for i, e in enumerate(planned) if not taken[i])
            out[layer, span] = [k if k is not None else next(rest) for k in kept]
    return out
