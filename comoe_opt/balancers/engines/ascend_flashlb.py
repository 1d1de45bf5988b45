"""vLLM-Ascend's FlashLB (`eplb_policy_type = 3`), in numpy.

Written from vLLM-Ascend's published source (`vllm_ascend/eplb/core/policy/policy_flashlb.py` at
commit 182b75e, Apache-2.0); no code is copied. FlashLB plans each layer on several stages of
per-step counts, as a risk (mean + z·std) problem:

1. *Samples.* The stages' logical counts, each plus 1, are summed over consecutive runs into at
   most 64 samples (`sample_size`; the oldest stages that do not fill a run are dropped).
   From them: each expert's mean, variance and covariances.
2. *Replicas* by a tree search: experts sorted by mean + z·std (z = Φ⁻¹(0.75) ≈ 0.674) are cut
   into 4 groups; for each of the first 3, the number of redundant slots it gets is searched
   within ±8 of what a joint min-max allocation would give it, each candidate scored by placing
   every replica (step 3) and measuring the samples' mean of (largest GPU load × GPUs / total);
   within a group, slots go one at a time to the largest risk per replica.
3. *Placement* (largest processing time first): replicas by mean load per replica, heaviest
   first, each to the GPU with a free slot, not holding the expert, whose risk (its mean load +
   z × the standard deviation of its load, covariances included) after adding it is least.
4. The new layout's GPUs are matched to the old ones to keep most experts in place (an
   assignment problem, SciPy's `linear_sum_assignment`), and within a GPU experts that stay keep
   their slots.

Deviations: upstream keeps state between calls (a sliding window of stages, and per layer the
balance it last planned, re-planning a layer only when its balance falls below 0.9× that or
0.85); this port is one call on a fresh policy, which re-plans every layer (upstream's first
call). Upstream compiles its inner loops with numba in fast-math mode (float32 GPU sums, fused
multiply-adds); the port computes the same quantities with numpy, so that on near-ties (a
last-bit difference in a risk or a score) it may choose another of the nearly equal candidates.
Where the tree search tries more replicas of an expert than GPUs can take, upstream's
compiled placement uses its "no GPU" marker (-1) as an index: the last GPU gets the replica
(a second copy) and a load and variance of -1, and once that GPU is full the write falls past
the layout (numba checks no bounds), leaving a slot empty; the port does the same, and a
final layout with an empty slot keeps the current one, as upstream. The replicas' order in the
placement follows numba's quicksort (`compiled_argsort`), which
orders equal loads per replica its own way. Checked against
upstream's own outputs (tests/test_engine_balancers.py, tests/data/ascend/).
"""

from __future__ import annotations

import math

import numpy as np

from comoe_opt.balancers.eplb import check_slots
from comoe_opt.balancers.maps import map_in_service, maps_of

Z_SCORE = 0.6744897501960817  # upstream's stats.norm.ppf(0.75)
DEPTH = 4
WIDTH = 8
SAMPLE_SIZE = 64


def ascend_flashlb(
    weight_or_steps: np.ndarray,
    num_replicas: int,
    num_groups: int,
    num_nodes: int,
    num_gpus: int,
    old_phy2log: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(phy2log, log2phy, logcnt) of FlashLB on per-step counts [stages, layers, experts] (one
    stage [layers, experts] plans on its mean alone), from the map in service `old_phy2log`
    (default: the engine's initial layout). Groups and nodes are not used, as upstream."""
    del num_groups, num_nodes
    stages = np.asarray(weight_or_steps)
    stages = stages[None] if stages.ndim == 2 else stages
    if stages.ndim != 3:
        raise ValueError(f"counts must be [stages, layers, experts], got shape {stages.shape}")
    _, layers, experts = stages.shape
    check_slots(experts, num_replicas, num_gpus)
    old = map_in_service(old_phy2log, layers, experts, num_replicas)
    hot = stages + 1  # upstream's hotness: counts plus one
    out = np.empty((layers, num_gpus, num_replicas // num_gpus), dtype=np.int64)
    for layer in range(layers):
        current = old[layer].reshape(num_gpus, -1)
        planned, _, _ = plan_layer(samples(hot[:, layer]), num_replicas, num_gpus)
        # a layout with an empty slot, or with fewer slots than the map (the tree search left some of
        # the redundant slots unassigned: few experts on many GPUs), is no map: the layer keeps its own
        usable = planned.shape == current.shape and not (planned == -1).any()
        out[layer] = align(current, planned) if usable else current
    return maps_of(out.reshape(layers, num_replicas), experts)


def samples(hot: np.ndarray) -> np.ndarray:
    """[samples, experts]: consecutive stages summed into at most SAMPLE_SIZE samples."""
    length = hot.shape[0]
    size = min(length, SAMPLE_SIZE)
    run = max(length // size, 1)
    return hot[length - run * size :].reshape(-1, run, hot.shape[1]).sum(axis=1)


def statistics(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    t, n = x.shape
    mean = np.mean(x, axis=0)
    if t == 1:
        return mean, np.zeros(n), np.zeros((n, n))
    centred = x - mean
    return mean, np.sum(centred**2, axis=0) / (t - 1), (centred.T @ centred) / (t - 1)


def plan_layer(x: np.ndarray, replicas: int, gpus: int) -> tuple[np.ndarray, np.ndarray, float]:
    """(layout [gpus, slots], replicas per expert, score) of FlashLB's tree search on samples x."""
    mu, var, cov = statistics(x)
    experts = mu.size
    available = replicas - experts
    interval = math.ceil(experts / DEPTH)
    order = np.argsort(-(mu + Z_SCORE * np.sqrt(var)))
    deployed = np.zeros(experts, dtype=np.int64)
    for node in range(DEPTH - 1):
        here, rest = order[node * interval : (node + 1) * interval], order[(node + 1) * interval :]
        joint = min_max_replicas(mu[order[node * interval :]], var[order[node * interval :]], available)[0]
        here_steps = min_max_replicas(mu[here], var[here], available)[1]
        rest_steps = min_max_replicas(mu[rest], var[rest], available)[1]
        pool = available

        def score(mid: int, here=here, rest=rest, hs=here_steps, rs=rest_steps, pool=pool) -> float:
            trial = deployed.copy()
            trial[here] = hs[mid]
            trial[rest] = rs[pool - mid]
            return balance_score(x, trial, lpt(mu, var, cov, trial, gpus))

        best = _neighbour_search(0, available, int((joint[: here.size] - 1).sum()), score)
        deployed[here] = here_steps[best]
        available -= best
        if not available or node == DEPTH - 2:
            deployed[rest] = rest_steps[available]
            break
    layout = lpt(mu, var, cov, deployed, gpus)
    return layout, deployed, balance_score(x, deployed, layout)


def min_max_replicas(mu: np.ndarray, var: np.ndarray, extra: int) -> tuple[np.ndarray, np.ndarray]:
    """(replicas, history [extra+1, n]): one each, then each slot to the largest risk per replica."""
    risk = mu + Z_SCORE * np.sqrt(var)
    count = np.ones(mu.size, dtype=np.int64)
    history = np.ones((extra + 1, mu.size), dtype=np.int64)
    if mu.size == 0:  # a tree node past the last expert (fewer experts than the tree's depth)
        return count, history
    history[0] = count
    value = risk / count
    for r in range(extra):
        best = int(np.argmax(value))  # first of the largest
        count[best] += 1
        value[best] = risk[best] / count[best]
        history[r + 1] = count
    return count, history


def _neighbour_search(low: int, high: int, start: int, score) -> int:  # type: ignore[no-untyped-def]
    """The replica number with the least score, searched outwards from `start` (left first),
    at most WIDTH either side; a later candidate wins only if strictly better."""
    reach = min(max(start - low, high - start), WIDTH)
    best, best_score = start, score(start)
    for r in range(1, reach + 1):
        for candidate in (start - r, start + r):
            if low <= candidate <= high:
                value = score(candidate)
                if value < best_score:
                    best, best_score = candidate, value
    return best


def lpt(mu: np.ndarray, var: np.ndarray, cov: np.ndarray, replicas: np.ndarray, gpus: int) -> np.ndarray:
    """[gpus, slots] layout: replicas heaviest first, each to the GPU of least risk after it
    (the first such GPU). The GPUs are scored at once, each sum in upstream's order."""
    slots = int(replicas.sum()) // gpus
    layout = np.full((gpus, slots), -1, dtype=np.int64)
    gpu_mu = np.zeros(gpus, dtype=np.float32)
    gpu_var = np.zeros(gpus, dtype=np.float32)
    filled = np.zeros(gpus, dtype=np.int64)
    every = np.arange(gpus)
    for e in compiled_argsort(-(mu / replicas)):
        share = mu[e] / replicas[e]
        own_var = var[e] / replicas[e] ** 2
        for _ in range(int(replicas[e])):
            open_ = (filled < slots) & ~(layout == e).any(axis=1)
            new_mu = gpu_mu.astype(np.float64) + share
            new_var = gpu_var.astype(np.float64) + own_var
            width = min(int(filled.max(initial=0)), slots)
            held = np.arange(width)[None, :] < filled[:, None]  # [gpus, width]
            other = np.where(held, layout[:, :width], 0)
            terms = np.where(held, 2 * cov[e, other] / replicas[e] / replicas[other], 0.0)
            # slot by slot in upstream's order (accumulate adds left to right; 0.0 where none is held)
            new_var = np.add.accumulate(np.column_stack([new_var, terms]), axis=1)[:, -1]
            with np.errstate(invalid="ignore"):  # a GPU marked -1 below has no risk (NaN), as upstream
                risk = new_mu + Z_SCORE * np.sqrt(new_var)
                candidates = every[open_ & (risk < 1e30)]
            # no GPU can take the replica: upstream's "none" (-1) indexes the last GPU, which gets
            # the replica (a second copy) while it has a slot, and load and variance -1
            best = int(candidates[np.argmin(risk[candidates])]) if candidates.size else -1
            if best == -1:
                gpu_mu[-1], gpu_var[-1] = -1.0, -1.0
                if filled[-1] < slots:
                    layout[-1, filled[-1]] = e
                filled[-1] += 1
                continue
            gpu_mu[best], gpu_var[best] = new_mu[best], new_var[best]  # stored in float32, as upstream
            layout[best, filled[best]] = e
            filled[best] += 1
    return layout


def balance_score(x: np.ndarray, replicas: np.ndarray, layout: np.ndarray) -> float:
    """Mean over samples of (largest GPU load × GPUs + 0.01) / (total + 0.01), in float32."""
    gpus, slots = layout.shape
    if slots == 0:  # fewer replicas than GPUs (a trial of the tree search): no layout, never chosen
        return math.inf
    share = x[:, layout] / replicas[layout]  # [samples, gpus, slots]
    per_gpu = share[:, :, 0].copy()
    for k in range(1, slots):  # summed slot by slot and GPU by GPU, as upstream's loops
        per_gpu += share[:, :, k]
    total = per_gpu[:, 0].copy()
    for g in range(1, gpus):
        total += per_gpu[:, g]
    scores = ((per_gpu.max(axis=1) * gpus + 1e-2) / (total + 1e-2)).astype(np.float32)
    mean = np.float32(0.0)
    for value in scores:
        mean = np.float32(mean + value)
    return float(mean / np.float32(scores.size))


def align(current: np.ndarray, planned: np.ndarray) -> np.ndarray:
    """`planned`'s GPUs matched to `current`'s to keep the most experts in place (Hungarian),
    then, per GPU, experts that stay keep their slots and the others fill the rest in order."""
    from scipy.optimize import linear_sum_assignment  # SciPy loads where used

    gpus, slots = current.shape
    size = gpus * slots
    have = np.stack([np.bincount(row[row != -1], minlength=size) for row in current])
    want = np.stack([np.bincount(row[row != -1], minlength=size) for row in planned])
    matches = np.minimum(have[:, None, :], want[None, :, :]).sum(axis=2)
    rows, cols = linear_sum_assignment(slots - matches)
    out = np.empty_like(planned)
    for src, dst in zip(rows.tolist(), cols.tolist(), strict=True):
        positions: dict[int, list[int]] = {}
        for pos, e in enumerate(planned[dst].tolist()):
            positions.setdefault(e, []).append(pos)
        row: list[int | None] = [None] * slots
        used: set[int] = set()
        for pos, e in enumerate(current[src].tolist()):
            if positions.get(e):
                used.add(positions[e].pop())
                row[pos] = e
        rest = iter(planned[dst, p] for p in range(slots) if p not in used)
        out[src] = [e if e is not None else next(rest) for e in row]
    return out


SMALL_SORT = 15  # numba's SMALL_QUICKSORT: a run whose bounds are closer is sorted by insertion


def compiled_argsort(keys: np.ndarray) -> np.ndarray:
    """`np.argsort(keys)` as numba 0.68 compiles it (BSD-licensed `numba/misc/quicksort.py`, read
    and rewritten): median-of-three quicksort, the larger part deferred, runs of 15 or fewer
    by insertion. Upstream's placement order on equal keys depends on it."""
    order = list(range(keys.size))
    key = keys.tolist()
    stack = [(0, keys.size - 1)] if keys.size >= 2 else []
    while stack:
        low, high = stack.pop()
        while high - low >= SMALL_SORT:
            pivot = _partition(key, order, low, high)
            if high - pivot > pivot - low:
                if high > pivot:
                    stack.append((pivot + 1, high))
                high = pivot - 1
            else:
                if pivot > low:
                    stack.append((low, pivot - 1))
                low = pivot + 1
        _insertion(key, order, low, high)
    return np.array(order, dtype=np.int64)


def _insertion(key: list[float], order: list[int], low: int, high: int) -> None:
    for i in range(low + 1, high + 1):
        item = order[i]
        j = i
        while j > low and key[item] < key[order[j - 1]]:
            order[j] = order[j - 1]
            j -= 1
        order[j] = item


def _partition(key: list[float], order: list[int], low: int, high: int) -> int:
    mid = (low + high) >> 1
    if key[order[mid]] < key[order[low]]:
        order[low], order[mid] = order[mid], order[low]
    if key[order[high]] < key[order[mid]]:
        order[high], order[mid] = order[mid], order[high]
    if key[order[mid]] < key[order[low]]:
        order[low], order[mid] = order[mid], order[low]
    pivot = key[order[mid]]
    order[high], order[mid] = order[mid], order[high]
    i, j = low, high - 1
    while True:
        while i < high and key[order[i]] < pivot:
            i += 1
        while j >= low and pivot < key[order[j]]:
            j -= 1
        if i >= j:
            break
        order[i], order[j] = order[j], order[i]
        i += 1
        j -= 1
    order[i], order[high] = order[high], order[i]
    return i
