"""The engines' balancers (balancers/engines/) as slow-loop heuristics, one per `ENGINES` name.

Each plans a window on what its engine would plan on (`engine_input`), from the map in service
where the engine is incremental (`previous_map`), and keeps the engine's slot map
(`Placement.slot_map`). Where upstream's requirements do not hold (fewer slots than experts,
leases, tenant quotas, a replica limit below the devices) they plan as `eplb-distinct`.
"""

from __future__ import annotations

import functools

import numpy as np

from comoe_opt.balancers.engines import ENGINE_BALANCERS, ENGINES, INCREMENTAL, PER_STEP
from comoe_opt.best_split.even import slot_replicas
from comoe_opt.residency.heuristics import eplb_distinct, eplb_slots, heuristic
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.problem import ResidencyProblem


def engine_placement(problem: ResidencyProblem, name: str) -> Placement:
    """The placement engine `name`'s balancer plans for the window, with its slot map."""
    per_layer = eplb_slots(problem)
    if per_layer is None:
        return eplb_distinct(problem)
    groups, nodes, devices = problem.expert_groups, problem.nodes, problem.chiplets
    if problem.experts % groups or groups % nodes:
        groups = nodes = 1  # the engines' global policy
    args: list[object] = [engine_input(problem, name), per_layer, groups, nodes, devices]
    if name in INCREMENTAL:
        args.append(previous_map(problem, per_layer))
    if name == "sglang-vec-hier" and (nodes == 1 or groups % nodes):
        name = "sglang-vec"  # upstream's hierarchical mode needs groups over several nodes
    phy2log = ENGINE_BALANCERS[name](*args)[0]
    if name.startswith("ascend") and args[-1] is not None:
        phy2log = ascend_worker_check(np.asarray(args[-1]), phy2log, devices)
    resident = slot_replicas(phy2log, problem.experts, devices) > 0
    return Placement(resident, slot_map=phy2log.reshape(problem.layers, devices, -1))


def ascend_worker_check(old: np.ndarray, new: np.ndarray, gpus: int) -> np.ndarray:
    """vLLM-Ascend's worker applies a layer's new map only if it keeps every expert, puts no
    two copies of one expert on a GPU and moves no expert within a GPU; else the layer keeps
    its map (`eplb_worker.check_expert_placement`, commit 182b75e)."""
    out = new.copy()
    for layer in range(new.shape[0]):
        before, after = old[layer].reshape(gpus, -1), new[layer].reshape(gpus, -1)
        lost = np.unique(after).size < np.unique(before).size
        doubled = any(np.unique(row).size < row.size for row in after)
        moved = any(
            not np.array_equal(a[np.isin(a, b)], b[np.isin(a, b)]) for a, b in zip(after, before, strict=True)
        )
        if lost or doubled or moved:
            out[layer] = old[layer]
    return out


def engine_input(problem: ResidencyProblem, name: str) -> np.ndarray:
    """What the engine plans on: per-step counts for the per-step planners, else the window's
    summed counts (λ where there are no counts); counts as integers where they are whole."""
    if name in PER_STEP and problem.step_counts is not None:
        counts = problem.step_counts
    elif problem.load_counts is not None:
        counts = problem.load_counts
    else:
        counts = problem.tokens
    whole = np.all(np.asarray(counts) == np.round(counts))
    return np.asarray(counts).astype(np.int64) if whole else np.asarray(counts, dtype=np.float32)


def previous_map(problem: ResidencyProblem, per_layer: int) -> np.ndarray | None:
    """[layers, slots] the map in service, if the previous plan kept one of these slots."""
    previous = problem.previous
    if previous is None or previous.slot_map is None:
        return None
    slot_map = previous.slot_map.reshape(problem.layers, -1)
    if slot_map.shape[1] != per_layer:
        return None
    every = all(np.unique(row).size == problem.experts for row in slot_map)
    return slot_map if every else None


# each engine's balancer as a slow-loop heuristic: it re-plans from scratch (no leases) and is too
# slow or too different to warm-start every MILP
for _name, _engine in ENGINES.items():
    heuristic(_name, _engine.description, leases=False, warm_start=False)(
        functools.partial(engine_placement, name=_name)
    )
