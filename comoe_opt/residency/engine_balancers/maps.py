"""The EPLB-style maps every engine port returns, and the checks their arguments share."""

from __future__ import annotations

import numpy as np


def maps_of(
    phy2log: np.ndarray, experts: int, width: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(phy2log, log2phy, logcnt) from `phy2log` [layers, slots]: each expert's slots in slot
    order, -1 padded to `width` (default: the most replicas any expert has)."""
    phy2log = np.asarray(phy2log, dtype=np.int64)
    layers = phy2log.shape[0]
    logcnt = np.zeros((layers, experts), dtype=np.int64)
    for layer in range(layers):
        logcnt[layer] = np.bincount(phy2log[layer], minlength=experts)
    width = int(logcnt.max()) if width is None else width
    log2phy = np.full((layers, experts, width), -1, dtype=np.int64)
    for layer in range(layers):
        seen = np.zeros(experts, dtype=np.int64)
        for slot, e in enumerate(phy2log[layer]):
            log2phy[layer, e, seen[e]] = slot
            seen[e] += 1
    return phy2log, log2phy, logcnt


def check_slots(experts: int, num_replicas: int, num_gpus: int) -> None:
    """What every engine asserts: whole slots per GPU and room for every expert."""
    if num_gpus < 1 or num_replicas % num_gpus:
        raise ValueError(f"num_replicas ({num_replicas}) must be a multiple of num_gpus ({num_gpus})")
    if num_replicas < experts:
        raise ValueError(f"num_replicas ({num_replicas}) must be at least the experts ({experts})")


def initial_layout(layers: int, experts: int, num_replicas: int) -> np.ndarray:
    """[layers, num_replicas] the layout an engine loads before its first re-plan: every expert in
    id order, then redundant copies of experts 0, 1, ... (vLLM's checkpoint layout, which
    vLLM-Ascend's `generate_global_placement` keeps when there is no shared expert)."""
    row = np.concatenate([np.arange(experts), np.arange(num_replicas - experts) % experts])
    return np.tile(row, (layers, 1))


def map_in_service(
    old_phy2log: np.ndarray | None, layers: int, experts: int, num_replicas: int
) -> np.ndarray:
    """The map an engine has in service, [layers, num_replicas] (default: its initial layout),
    checked for shape."""
    if old_phy2log is None:
        return initial_layout(layers, experts, num_replicas)
    old = np.asarray(old_phy2log, np.int64)
    if old.shape != (layers, num_replicas):
        raise ValueError(
            f"old_phy2log must be [layers, num_replicas] = {(layers, num_replicas)}, got {old.shape}"
        )
    return old
