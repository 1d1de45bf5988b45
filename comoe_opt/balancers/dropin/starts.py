"""The `even` search's covariance-aware start (`risk_pack`): EPLB's replicas packed again so that
experts that burst together end up apart, which EPLB, seeing only sums, cannot do."""

from __future__ import annotations

import numpy as np

from comoe_opt.balancers.dropin.objective import Moments
from comoe_opt.best_split.even import expert_replicas


def risk_pack(
    eplb_map: np.ndarray,
    moments: Moments,
    gpus: int,
    nodes: int,
    risk: float,
    prev: np.ndarray | None = None,
    stay: float = 0.0,
) -> np.ndarray:
    """[layers, slots] EPLB's replicas (its counts, its nodes) packed again, heaviest per replica
    first, each onto the GPU with a free slot (on the expert's node) whose load after taking it
    has the least mean + `risk` standard deviations, covariances between experts included."""
    layers, slots = eplb_map.shape
    experts = moments.mean.shape[1]
    per_gpu, per_node = slots // gpus, gpus // nodes
    count = expert_replicas(eplb_map, experts)
    share = 1.0 / np.maximum(count, 1)
    items = np.sort(eplb_map, axis=1)  # every replica once; the order below sorts them
    heavy = np.take_along_axis(moments.mean * share, items, axis=1)
    items = np.take_along_axis(items, np.argsort(-heavy, axis=1, kind="stable"), axis=1)
    node_of = np.zeros((layers, experts), dtype=np.int64)  # EPLB's node of each expert
    node_of[np.arange(layers)[:, None], eplb_map] = (np.arange(slots) // (slots // nodes))[None, :]
    gpu_node = np.arange(gpus) // per_node
    mu = np.zeros((layers, gpus))
    var = np.zeros((layers, gpus))
    centred = np.zeros((layers, gpus, moments.dev.shape[2]))  # each GPU's load deviation per step
    free = np.full((layers, gpus), per_gpu)
    out = np.empty_like(eplb_map)
    rows = np.arange(layers)
    steps = max(moments.dev.shape[2], 1)
    held = None if prev is None else prev.copy()  # replicas of `prev` not yet kept
    for t in range(slots):
        e = items[:, t]
        s = share[rows, e]
        dev_e = moments.dev[rows, e]  # [L, S]
        new_var = var + (s**2 * moments.var_w[rows, e])[:, None]
        new_var += 2 * s[:, None] * np.einsum("lgs,ls->lg", centred, dev_e) / steps
        score = mu + (s * moments.mean[rows, e])[:, None] + risk * np.sqrt(np.maximum(new_var, 0.0))
        if held is not None:
            score += stay * (held[rows, e] == 0)
        score[(free == 0) | (gpu_node[None, :] != node_of[rows, e][:, None])] = np.inf
        g = score.argmin(axis=1)
        if held is not None:
            held[rows, e, g] = np.maximum(held[rows, e, g] - 1, 0)
        mu[rows, g] += s * moments.mean[rows, e]
        var[rows, g] = new_var[rows, g]
        centred[rows, g] += s[:, None] * dev_e
        out[rows, g * per_gpu + per_gpu - free[rows, g]] = e
        free[rows, g] -= 1
    return out
