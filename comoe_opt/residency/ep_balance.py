"""A drop-in for DeepSeek EPLB's `rebalance_experts`, planning on per-step loads.

`rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_gpus, method=..., history=...)`
has EPLB's signature and return values (`phy2log`, `log2phy`, `logcnt`, see eplb.py), so an
engine can call it where it calls EPLB. It needs no instance file: devices, slots and loads are
all it takes.

* `method="eplb"`: DeepSeek's algorithm as published (eplb.py).
* `method="comoe"` (default): EPLB's plan, then a local search per layer on what the engine
  will see. Engines split an expert's tokens evenly over its replicas, so a plan is scored
  as the largest GPU load with an even split, Σ over a GPU's slots of load / replicas. With
  `history` ([steps, layers, experts], e.g. SGLang's recorder dump) the score is its mean over
  the steps (each step's largest GPU), which is where a placement can do better than one
  planned on the sum: a replica that only helps the steps where an expert bursts. Without
  `history` it is the planned balance on `weight` itself.

The search keeps EPLB's shape: every expert at least once, `num_replicas / num_gpus` slots per
GPU, and in hierarchical mode every replica in the node EPLB packed its group onto. Its moves:
swap the experts of two slots on different GPUs, or give a slot of an expert with a spare
replica to another expert. A move is kept only when it lowers the score (then, on ties, the
score on `weight`), so the result is never worse than EPLB's on the score it reports. Moves
are drawn from a seeded generator: the same input gives the same plan.
"""

from __future__ import annotations

import operator
from typing import Any, Literal

import numpy as np

from comoe_opt.errors import ComoeError, first_line
from comoe_opt.instance import MAX_PLACEMENT_CELLS
from comoe_opt.residency.eplb import _check_shape
from comoe_opt.residency.eplb import rebalance_experts as eplb_rebalance

METHODS = ("comoe", "eplb")
MAX_HISTORY_STEPS = 64  # steps scored per layer (spread evenly): the search's cost grows with them
MOVES_PER_LAYER = 4000
MAX_MOVES = 1_000_000  # per layer: about an hour per layer on one core, far past any use
MAX_LOAD = 1e15  # the load-count files' limit (formats.counts.MAX_COUNT; residency cannot import formats)


class ArgumentError(ComoeError, ValueError):
    """A bad argument of `rebalance_experts`: a `ValueError`, as EPLB's callers expect, and a
    `ComoeError`, as every user error of comoe-opt; its message names the argument."""


def rebalance_experts(
    weight: Any,
    num_replicas: int,
    num_groups: int,
    num_nodes: int,
    num_gpus: int,
    *,
    method: Literal["comoe", "eplb"] = "comoe",
    history: Any = None,
    moves: int = MOVES_PER_LAYER,
    seed: int = 0,
) -> tuple[Any, Any, Any]:
    """(phy2log, log2phy, logcnt) as DeepSeek EPLB returns them, for loads `weight` [layers,
    experts] (numpy arrays, or torch tensors when given tensors).

    `history` [steps, layers, experts] (optional) are per-step loads to plan on; `weight` is
    still what EPLB's part plans on and what ties are broken by. Loads may be of any real dtype,
    bf16 and fp16 included (planned on as the same values in float32, as upstream does). A bad
    argument raises `ArgumentError` (a `ValueError`) naming it.
    """
    if method not in METHODS:
        raise ArgumentError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    num_replicas = _count("num_replicas", num_replicas)
    num_groups = _count("num_groups", num_groups)
    num_nodes = _count("num_nodes", num_nodes)
    num_gpus = _count("num_gpus", num_gpus)
    moves = _count("moves", moves, low=0, high=MAX_MOVES)
    seed = _count("seed", seed, low=0)
    as_torch = _is_torch(weight)
    load = _loads(weight, "weight")
    if load.ndim != 2 or 0 in load.shape:
        raise ArgumentError(f"weight must be [layers, experts], got shape {load.shape}")
    _check_sizes(load.shape, num_replicas, num_groups, num_nodes, num_gpus)
    steps = _history(history, load.shape)
    phy2log, log2phy, logcnt = eplb_rebalance(load, num_replicas, num_groups, num_nodes, num_gpus)
    if method == "comoe":
        hierarchical = num_groups % num_nodes == 0 and num_nodes > 1
        nodes = num_nodes if hierarchical else 1
        rng = np.random.default_rng(seed)
        for layer in range(load.shape[0]):
            scenarios = load[layer][None] if steps is None else steps[:, layer]
            phy2log[layer] = improve_layer(
                phy2log[layer], load[layer], scenarios, num_gpus, nodes, moves, rng
            )
        logcnt = np.stack([np.bincount(row, minlength=load.shape[1]) for row in phy2log])
        log2phy = _log2phy(phy2log, logcnt)
    if as_torch:
        import torch

        a, b, c = (torch.from_numpy(np.ascontiguousarray(x)) for x in (phy2log, log2phy, logcnt))
        return a, b, c
    return phy2log, log2phy, logcnt


def gpu_loads(phy2log: np.ndarray, load: np.ndarray, gpus: int) -> np.ndarray:
    """[..., gpus] load of every GPU when each expert's load is split evenly over its replicas
    (`phy2log` [slots], `load` [..., experts])."""
    counts = np.bincount(phy2log, minlength=load.shape[-1]).astype(np.float64)
    share = np.divide(load, counts, out=np.zeros_like(load, dtype=np.float64), where=counts > 0)
    per_slot = share[..., phy2log]
    return per_slot.reshape(*per_slot.shape[:-1], gpus, -1).sum(axis=-1)


def planned_score(phy2log: np.ndarray, scenarios: np.ndarray, gpus: int) -> float:
    """Mean over scenarios [S, experts] of the largest GPU load (even split)."""
    return float(gpu_loads(phy2log, scenarios, gpus).max(axis=-1).mean())


def improve_layer(
    slots: np.ndarray,
    weight: np.ndarray,
    scenarios: np.ndarray,
    gpus: int,
    nodes: int,
    moves: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """One layer's slots after the local search (module docstring); never scores worse."""
    slots = slots.copy()
    per_gpu = slots.size // gpus
    per_node = slots.size // nodes
    experts = weight.size
    best = (planned_score(slots, scenarios, gpus), planned_score(slots, weight[None], gpus))
    for _ in range(moves):
        i = int(rng.integers(slots.size))
        node = i // per_node
        j = node * per_node + int(rng.integers(per_node))  # same node: EPLB's node packing holds
        trial = slots.copy()
        if rng.random() < 0.5:
            if i // per_gpu == j // per_gpu or slots[i] == slots[j]:
                continue
            trial[i], trial[j] = slots[j], slots[i]
        else:
            counts = np.bincount(slots, minlength=experts)
            if counts[slots[i]] < 2:
                continue
            node_experts = np.unique(slots[node * per_node : (node + 1) * per_node])
            target = int(node_experts[rng.integers(node_experts.size)])
            gpu = i // per_gpu
            if target == slots[i] or target in slots[gpu * per_gpu : (gpu + 1) * per_gpu]:
                continue
            trial[i] = target
        primary = planned_score(trial, scenarios, gpus)
        if primary > best[0]:
            continue
        score = (primary, planned_score(trial, weight[None], gpus))  # ties: the load it was given
        if score < best:
            slots, best = trial, score
    return slots


def _history(history: Any, shape: tuple[int, ...]) -> np.ndarray | None:
    if history is None:
        return None
    steps = _loads(history, "history")
    if steps.ndim != 3 or steps.shape[1:] != shape:
        raise ArgumentError(f"history must be [steps, {shape[0]}, {shape[1]}], got shape {steps.shape}")
    steps = steps[steps.reshape(steps.shape[0], -1).any(axis=1)]  # unused recorder rows are zero
    if steps.shape[0] == 0:
        raise ArgumentError("history holds no step with any load")
    if steps.shape[0] > MAX_HISTORY_STEPS:
        pick = np.floor((np.arange(MAX_HISTORY_STEPS) + 0.5) * steps.shape[0] / MAX_HISTORY_STEPS)
        steps = steps[pick.astype(np.int64)]
    return steps


def _log2phy(phy2log: np.ndarray, logcnt: np.ndarray) -> np.ndarray:
    """Each expert's slots in ascending order, −1 padded to the most replicas of any expert."""
    layers, experts = logcnt.shape
    out = np.full((layers, experts, int(logcnt.max())), -1, dtype=np.int64)
    for layer in range(layers):
        order = np.argsort(phy2log[layer], kind="stable")
        ranks = np.arange(order.size) - np.repeat(np.cumsum(logcnt[layer]) - logcnt[layer], logcnt[layer])
        out[layer, phy2log[layer][order], ranks] = order
    return out


def _is_torch(value: Any) -> bool:
    return type(value).__module__.startswith("torch")


def _count(name: str, value: Any, low: int = 1, high: int | None = None) -> int:
    """`value` as an int in [low, high]; floats (even 4.0) and bools are refused, as upstream's
    integer arithmetic would misuse them."""
    try:
        if isinstance(value, (bool, np.bool_)):
            raise TypeError
        number = operator.index(value)
    except TypeError:
        raise ArgumentError(f"{name} must be an integer, got {_shown(value)}") from None
    if number < low:
        raise ArgumentError(f"{name} must be at least {low}, got {number}")
    if high is not None and number > high:
        raise ArgumentError(f"{name} must be at most {high:,}, got {number:,}")
    return number


def _check_sizes(shape: tuple[int, ...], replicas: int, groups: int, nodes: int, gpus: int) -> None:
    """Upstream's divisibility rules, then the project's size limit on the arrays the plan needs
    (phy2log per GPU for the packing, log2phy at its widest)."""
    layers, experts = shape
    try:
        _check_shape(experts, replicas, groups, nodes, gpus)
    except ValueError as exc:
        raise ArgumentError(str(exc)) from None
    for what, cells in (
        ("layers x num_replicas x num_gpus", layers * replicas * gpus),
        ("layers x experts x (num_replicas - experts + 1)", layers * experts * (replicas - experts + 1)),
    ):
        if cells > MAX_PLACEMENT_CELLS:
            raise ArgumentError(f"{what} = {cells:,} exceeds {MAX_PLACEMENT_CELLS:,}")


def _loads(value: Any, name: str) -> np.ndarray:
    """Loads as float64, from numpy or torch of any real dtype (bf16 and fp16 widen exactly);
    each finite, non-negative and at most `MAX_LOAD`."""
    if _is_torch(value):
        value = _torch_numpy(value, name)
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as exc:  # ragged nested lists
        raise ArgumentError(f"{name} must be a numeric array: {first_line(exc)}") from None
    if array.dtype.kind not in "iuf":
        raise ArgumentError(f"{name} must hold real numbers, got dtype {array.dtype}")
    array = array.astype(np.float64)
    bad = ~np.isfinite(array) | (array < 0) | (array > MAX_LOAD)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        index = "".join(f"[{i}]" for i in where)
        problem = f"must be finite, non-negative and at most {MAX_LOAD:g}"
        raise ArgumentError(f"{name}{index} {problem}, got {float(array[where])!r}")
    return array


def _torch_numpy(tensor: Any, name: str) -> np.ndarray:
    """A tensor's values in numpy; bf16 (which numpy lacks) and fp16 widen to float32 exactly."""
    tensor = tensor.detach().cpu()
    if tensor.dtype.is_complex or str(tensor.dtype) == "torch.bool":
        raise ArgumentError(f"{name} must hold real numbers, got dtype {tensor.dtype}")
    if tensor.dtype.is_floating_point and tensor.element_size() < 4:
        tensor = tensor.float()
    return tensor.numpy()


def _shown(value: Any) -> str:
    text = first_line(ValueError(repr(value)))
    return text if len(text) <= 60 else text[:57] + "..."
