"""The even split engines dispatch with, and the slot map it splits over (formulations/mapping.md,
"The even split").

What the engines do: vLLM sends the selection at (token, rank) position `p` of a batch to replica
`p mod r` of its expert (`eplb_map_to_physical_and_record`, replicas in slot order); SGLang's
`dynamic` dispatch picks a replica at random per selection and `static` a fixed replica per source
rank; vLLM-Ascend follows vLLM. All split an expert's whole tokens over its *slots* (two slots of
one expert on one GPU take two shares), each slot getting c / r of the expert's c selections on
average, the remainder landing on replicas that vary from step to step.

The rule here, the one every part of the project scores an even split with: an expert's
selections are dealt to its slots in turn, vLLM's modulo rule with the step's selections taken in
expert order, so that expert e's first selection sits at position P_e = (selections of experts
before e). Slot j of an expert with c selections and r slots then gets floor(c / r) + 1 if
(j - P_e) mod r < c mod r, else floor(c / r): whole tokens, the remainders spread over the slots as
the other experts' counts fall, and a function of the step's counts alone (so the per-replica
counts are the same whether a step is given as counts or as routed tokens: `slot_of_selection`).
"""

from __future__ import annotations

import numpy as np


def slot_replicas(phy2log: np.ndarray, experts: int, devices: int) -> np.ndarray:
    """[L, E, C] slots each device holds of each expert, from a slot map `phy2log` [L, slots]
    whose slots are split evenly over the devices in order (device d: slots d·s .. d·s + s - 1)."""
    phy2log = np.asarray(phy2log, dtype=np.int64)
    layers, slots = phy2log.shape
    device = np.arange(slots) // (slots // devices)
    cell = (np.arange(layers)[:, None] * experts + phy2log) * devices + device[None, :]
    return np.bincount(cell.ravel(), minlength=layers * experts * devices).reshape(layers, experts, devices)


def expert_replicas(phy2log: np.ndarray, experts: int) -> np.ndarray:
    """[L, E] slots of each expert in a slot map `phy2log` [L, slots]."""
    layers = phy2log.shape[0]
    cell = np.arange(layers)[:, None] * experts + phy2log
    return np.bincount(cell.ravel(), minlength=layers * experts).reshape(layers, experts)


def even_loads(counts: np.ndarray, replicas: np.ndarray) -> np.ndarray:
    """[n, L, C] tokens each device serves under the even split.

    Parameters: `counts` [n, L, E] whole selections per step, layer and expert; `replicas`
    [L, E, C] slots per device (a device may hold several slots of one expert), an expert's slots
    in device order. An expert with selections and no slot is served by no device (its tokens
    are left out: every planner here keeps every expert resident).
    Returns: per step, layer and device, the selections its slots take.
    """
    return even_split(counts, replicas, active=False)[0]


def even_split(
    counts: np.ndarray, replicas: np.ndarray, active: bool = True
) -> tuple[np.ndarray, np.ndarray | None]:
    """`even_loads`'s tokens per device [n, L, C] and, with `active`, the slots of each device
    that take at least one selection [n, L, C] (whose weights the step reads), else None."""
    counts = np.asarray(counts, dtype=np.int64)
    n, layers, experts = counts.shape
    devices = replicas.shape[2]
    slots = replicas.sum(axis=2)  # [L, E]
    offset = np.cumsum(counts, axis=2) - counts  # [n, L, E] P_e: selections of experts before e
    r = np.maximum(slots, 1)[None]  # [1, L, E]
    whole, rest = counts // r, counts % r
    # slot j of each expert, in device order: the device of an expert's j-th slot
    order = np.argsort(-np.minimum(replicas, 1), axis=2, kind="stable")  # devices holding it first
    out = np.zeros((n, layers, devices))
    busy = np.zeros((n, layers, devices)) if active else None
    for j in range(int(slots.max(initial=0))):
        tokens = whole + ((j - offset) % r < rest)  # [n, L, E]
        tokens = np.where(j < slots[None], tokens, 0)
        device = _device_of_slot(replicas, order, j)  # [L, E], -1 past an expert's slots
        for layer in range(layers):
            live = device[layer] >= 0
            onto = np.zeros((experts, devices))
            onto[np.flatnonzero(live), device[layer, live]] = 1.0
            out[:, layer] += tokens[:, layer] @ onto
            if busy is not None:
                busy[:, layer] += (tokens[:, layer] > 0) @ onto
    return out, busy


def _device_of_slot(replicas: np.ndarray, order: np.ndarray, j: int) -> np.ndarray:
    """[L, E] the device of each expert's slot j (slots in device order, a device's own slots
    together), -1 where the expert has j or fewer slots."""
    cumulative = np.cumsum(np.take_along_axis(replicas, order, axis=2), axis=2)  # [L, E, C]
    position = (cumulative <= j).sum(axis=2)  # [L, E]: the ordered device whose slots reach j
    inside = position < replicas.shape[2]
    device = np.take_along_axis(order, np.minimum(position, replicas.shape[2] - 1)[..., None], axis=2)[..., 0]
    return np.where(inside, device, -1)


def slot_of_selection(experts: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """The slot (0..r-1) each selection of a routed step takes under the rule above.

    Parameters: `experts` [m] the step's selections (expert ids, in token and rank order);
    `slots` [E] slots per expert. Returns [m]: selection i of expert e (in token order) takes
    slot (P_e + i) mod r_e, P_e the selections of experts before e; its per-slot counts are
    `even_loads`'s."""
    experts = np.asarray(experts, dtype=np.int64)
    count = np.bincount(experts, minlength=slots.size)
    offset = np.cumsum(count) - count
    order = np.argsort(experts, kind="stable")
    rank = np.empty(experts.size, dtype=np.int64)
    rank[order] = np.arange(experts.size) - offset[experts[order]]
    r = np.maximum(slots[experts], 1)
    return (offset[experts] + rank) % r
