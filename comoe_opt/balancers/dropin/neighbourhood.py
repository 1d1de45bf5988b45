"""Every move of a layer, as the `even` search's steepest descent scores them: each swap of two
slots on different GPUs of a node, and each slot of an expert with a spare replica given to any
other slot's expert of its node. Where a node has more slots than a pass can score at once
(`max_neighbourhood`), a layer scores the moves off its hottest GPUs only."""

from __future__ import annotations

import numpy as np


def gift_weight(gpus: int) -> float:
    """What scoring a spare slot's gift costs, in swaps: it touches every GPU (a swap two), and
    the costs were measured at 8 GPUs."""
    return max(1.0, gpus / 8)


def scoring_units(swap: np.ndarray, gpus: int) -> float:
    """The moves `swap` marks (True: a swap, False: a gift), each gift weighted by `gift_weight`."""
    gifts = int((~swap).sum())
    return swap.size - gifts + gifts * gift_weight(gpus)


def swaps_per_layer(per_node: int, gpus: int) -> float:
    """About how many moves one layer's neighbourhood holds, in swaps (`scoring_units`)."""
    return 3 * per_node * per_node // 2 * gift_weight(gpus)


def slot_pairs(
    slots_n: int, per_gpu: int, per_node: int, gpus: int, gpu_means: np.ndarray | None, max_neighbourhood: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(slot i, slot j) of every swap of two slots on different GPUs of a node, and None; given
    `gpu_means` (one layer's [G] mean GPU loads) and a node with too many slots for that
    (`max_neighbourhood`), the swaps that take a slot off one of its hottest GPUs (by mean load,
    ties to the lower GPU), the only GPUs whose peak a swap can lower, and those GPUs as a mask."""
    if gpu_means is None or swaps_per_layer(per_node, gpus) <= max_neighbourhood:
        i, j = np.divmod(np.arange(slots_n * per_node), per_node)
        j += i // per_node * per_node  # j runs over i's node only
        keep = i // per_gpu < j // per_gpu
        return i[keep], j[keep], None
    count = max(1, int(max_neighbourhood // (per_gpu * per_node * gift_weight(gpus))))
    hot = np.zeros(gpus, dtype=bool)
    hot[np.argsort(-gpu_means, kind="stable")[:count]] = True
    i = np.flatnonzero(hot[np.arange(slots_n) // per_gpu])
    j = (i // per_node * per_node)[:, None] + np.arange(per_node)[None, :]
    i = np.broadcast_to(i[:, None], j.shape)
    gi, gj = i // per_gpu, j // per_gpu
    keep = (gi != gj) & (~hot[gj] | (gi < gj))  # a pair of two hot GPUs once
    return i[keep], j[keep], hot


def neighbourhood(
    slots: np.ndarray,
    spare: np.ndarray,
    pairs: tuple[np.ndarray, np.ndarray, np.ndarray | None],
    per_gpu: int,
    per_node: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(i, j, swap, found) [B, K] of every move of B layers' `slots` [B, slots]: the swaps of
    `pairs` (`slot_pairs`), then each slot whose expert has a spare replica (`spare` [B, slots])
    given to each slot of its node (only the hot GPUs' spare slots, when `pairs` names them)."""
    si, sj, hot = pairs
    b, slots_n = slots.shape
    if hot is not None:
        spare = spare & hot[np.arange(slots_n) // per_gpu][None, :]
    width = max(1, int(spare.sum(axis=1).max()))
    ri = np.argsort(~spare, axis=1, kind="stable")[:, :width]  # spare slots first
    has = np.take_along_axis(spare, ri, axis=1)
    rj = (ri // per_node * per_node)[..., None] + np.arange(per_node)[None, None, :]  # [B, width, per_node]
    i = np.concatenate([np.tile(si, (b, 1)), np.repeat(ri, per_node, axis=1)], axis=1)
    j = np.concatenate([np.tile(sj, (b, 1)), rj.reshape(b, -1)], axis=1)
    swap = np.zeros(i.shape, dtype=bool)
    swap[:, : si.size] = True
    found = np.ones(i.shape, dtype=bool)
    found[:, si.size :] = np.repeat(has, per_node, axis=1)
    return i, j, swap, found
