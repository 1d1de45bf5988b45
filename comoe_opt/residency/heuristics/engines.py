"""The balancers serving engines ship today, ported from their published sources.

Each port is a plain function in EPLB's style, `(weight_or_steps, num_replicas, num_groups,
num_nodes, num_gpus, ...) -> (phy2log, log2phy, logcnt)` (`ENGINE_BALANCERS`), and a slow-loop
heuristic registered under a name that says whose it is (`ENGINES`, the one list of them):

* `sglang-vec`, `sglang-vec-hier` — SGLang's `deepseek_vec` and `deepseek_vec_hierarchical`, on the
  window's per-step counts (sglang_vec.py);
* `vllm-default` — vLLM's default policy: DeepSeek's EPLB, keeping experts that stay on a GPU in
  their slots (vllm_default.py);
* `ascend-swift` — vLLM-Ascend's SwiftBalancer, which re-deals the redundant slots of the map in
  service and swaps experts between GPUs (ascend_swift.py);
* `ascend-flashlb` — vLLM-Ascend's FlashLB, a tree search over replica numbers on stages of
  per-step counts with risk-aware placement (ascend_flashlb.py).

As upstream, all plan every layer on the same slots per device (`eplb_slots`, as `eplb`), may
put two replicas of one expert on one device (SGLang, vLLM), and keep no leases; the heuristics
keep the engine's slot map (`Placement.slot_map`), which the next window's incremental planners
(vLLM, vLLM-Ascend) start from. Where upstream's requirements do not hold (fewer slots than
experts, leases, tenant quotas, a replica limit below the devices) they plan as `eplb-distinct`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from comoe_opt.balancers.engines.ascend_flashlb import ascend_flashlb
from comoe_opt.balancers.engines.ascend_swift import ascend_swift
from comoe_opt.balancers.engines.sglang_vec import sglang_vec, sglang_vec_hierarchical
from comoe_opt.balancers.engines.vllm_default import vllm_default
from comoe_opt.residency.heuristics import eplb_distinct, eplb_slots, heuristic
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.problem import ResidencyProblem

Maps = tuple[np.ndarray, np.ndarray, np.ndarray]


@dataclass(frozen=True)
class Engine:
    """One engine's balancer: the port, and the words every table and `--help` use for it."""

    plan: Callable[..., Maps]
    label: str  # its row in tables
    whose: str  # whose policy, in descriptions
    description: str  # what it does, for `--method`'s help
    incremental: bool  # starts from the map in service
    per_step: bool  # plans on per-step counts, not the window's sum


# the one list of engines: strategies, `compare`'s peers and the CLI's choices read it
ENGINES: dict[str, Engine] = {
    "sglang-vec": Engine(
        sglang_vec,
        "SGLang deepseek_vec",
        "SGLang's deepseek_vec",
        "SGLang's deepseek_vec: replicas by the sum over steps of each step's peak",
        incremental=False,
        per_step=True,
    ),
    "sglang-vec-hier": Engine(
        sglang_vec_hierarchical,
        "SGLang deepseek_vec_hierarchical",
        "SGLang's deepseek_vec_hierarchical",
        "SGLang's deepseek_vec_hierarchical: groups onto nodes, then deepseek_vec",
        incremental=False,
        per_step=True,
    ),
    "vllm-default": Engine(
        vllm_default,
        "vLLM default",
        "vLLM's default policy",
        "vLLM's default policy: EPLB keeping experts in place within a GPU",
        incremental=True,
        per_step=False,
    ),
    "ascend-swift": Engine(
        ascend_swift,
        "vLLM-Ascend SwiftBalancer",
        "vLLM-Ascend's SwiftBalancer",
        "vLLM-Ascend's SwiftBalancer: redundant slots re-dealt, then swaps",
        incremental=True,
        per_step=False,
    ),
    "ascend-flashlb": Engine(
        ascend_flashlb,
        "vLLM-Ascend FlashLB",
        "vLLM-Ascend's FlashLB",
        "vLLM-Ascend's FlashLB: tree search over replicas on per-step stages",
        incremental=True,
        per_step=True,
    ),
}
ENGINE_BALANCERS: dict[str, Callable[..., Maps]] = {name: e.plan for name, e in ENGINES.items()}
INCREMENTAL = frozenset(name for name, e in ENGINES.items() if e.incremental)
PER_STEP = frozenset(name for name, e in ENGINES.items() if e.per_step)

__all__ = [
    "ENGINES",
    "ENGINE_BALANCERS",
    "Engine",
    "ascend_flashlb",
    "ascend_swift",
    "sglang_vec",
    "sglang_vec_hierarchical",
    "vllm_default",
]


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
    device = np.arange(per_layer) // (per_layer // devices)
    resident = np.zeros((problem.layers, problem.experts, devices), dtype=bool)
    resident[np.arange(problem.layers)[:, None], phy2log, device[None, :]] = True
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
