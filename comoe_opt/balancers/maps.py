"""The EPLB-style maps every engine port returns, and the layout an engine starts from.

The slot check every engine shares (`check_slots`) and the log2phy scatter live in
`balancers/eplb.py`, which this module builds on (eplb cannot import this package: the package
imports the vLLM port, which imports eplb)."""

from __future__ import annotations

import numpy as np

from comoe_opt.balancers.eplb import log2phy_of, slot_ranks


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
    return phy2log, log2phy_of(phy2log, slot_ranks(phy2log), experts, width), logcnt


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
