"""Expert residency: which chiplets hold a replica of which logical expert.

`Placement.resident[l, e, c]` is True when chiplet `c` holds the page of
logical expert `(l, e)`. At most one copy per chiplet is structural (a
boolean cannot be 2). A logical expert with no replica is served by
on-demand loading.

`Placement.slot_map[l, c]` (optional) lists the experts in chiplet `c`'s
physical slots when the method planned the engine's slot map itself: DeepSeek's
EPLB may give one device two slots of one expert (one page in `resident`, the
second slot wasted), and an engine that accepts that (SGLang) is given the map
as planned (formats/engines.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from comoe_opt.best_split.even import slot_replicas
from comoe_opt.errors import InputError


@dataclass(frozen=True, eq=False)
class Placement:
    resident: np.ndarray  # [layers, experts, chiplets] bool
    slot_map: np.ndarray | None = None  # [layers, chiplets, slots] int: the planned engine map

    def __post_init__(self) -> None:
        r = self.resident
        if not isinstance(r, np.ndarray) or r.ndim != 3:
            raise InputError(
                None,
                "placement",
                f"must be a [layers, experts, chiplets] array, got {getattr(r, 'shape', None)}",
            )
        if r.dtype != np.bool_:
            object.__setattr__(self, "resident", r.astype(bool))
        self.resident.flags.writeable = False
        if self.slot_map is not None:
            object.__setattr__(self, "slot_map", _checked_slot_map(self.slot_map, self.resident))

    @classmethod
    def empty(cls, layers: int, experts: int, chiplets: int) -> Placement:
        return cls(np.zeros((layers, experts, chiplets), dtype=bool))

    @property
    def layers(self) -> int:
        return self.resident.shape[0]

    @property
    def experts(self) -> int:
        return self.resident.shape[1]

    @property
    def chiplets(self) -> int:
        return self.resident.shape[2]

    def replicas(self) -> np.ndarray:
        """Replica count per logical expert: [layers, experts] int."""
        return self.resident.sum(axis=2)

    def slots(self) -> np.ndarray:
        """[layers, experts, chiplets] engine slots each chiplet holds of each expert: the planned
        slot map's where there is one (two slots of one expert on a chiplet take two shares of an
        even split), else one per resident page."""
        if self.slot_map is None:
            return self.resident.astype(np.int64)
        layers, chiplets, per = self.slot_map.shape
        return slot_replicas(self.slot_map.reshape(layers, chiplets * per), self.experts, chiplets)

    def pages_per_chiplet(self) -> np.ndarray:
        return self.resident.sum(axis=(0, 1))

    @property
    def pages(self) -> int:
        return int(self.resident.sum())

    @property
    def distinct(self) -> int:
        """Logical experts with at least one replica."""
        return int((self.replicas() > 0).sum())

    def replica_factor(self) -> float:
        """Resident pages / distinct resident experts (1.0 = no duplication)."""
        return self.pages / self.distinct if self.distinct else 0.0

    def extra_replica_ratio(self) -> float:
        """Extra pages / distinct resident experts (the paper's 'replica factor' reading)."""
        return (self.pages - self.distinct) / self.distinct if self.distinct else 0.0

    def pages_moved_from(self, previous: Placement | None) -> int:
        """Pages copied to reach this placement from `previous` (new (l, e, c) residents)."""
        if previous is None:
            return self.pages
        return int((self.resident & ~previous.resident).sum())

    def most_copied_into_one(self, previous: Placement) -> int:
        """The most pages copied onto any one chiplet to reach this placement from `previous`: each
        chiplet receives its own at once, so this one sets a re-plan's stall."""
        return int((self.resident & ~previous.resident).sum(axis=(0, 1)).max(initial=0))


def _checked_slot_map(slot_map: np.ndarray, resident: np.ndarray) -> np.ndarray:
    """A read-only int64 copy of `slot_map`, which must hold on each chiplet exactly the experts
    `resident` places there."""
    layers, experts, chiplets = resident.shape
    slots = np.array(slot_map, dtype=np.int64)
    if slots.ndim != 3 or slots.shape[:2] != (layers, chiplets) or slots.shape[2] == 0:
        problem = f"must be [{layers}, {chiplets}, slots], got shape {slots.shape}"
        raise InputError(None, "placement.slot_map", problem)
    if slots.min() < 0 or slots.max() >= experts:
        raise InputError(None, "placement.slot_map", f"expert ids must be in 0..{experts - 1}")
    held = np.zeros_like(resident)
    held[np.arange(layers)[:, None, None], slots, np.arange(chiplets)[None, :, None]] = True
    if not np.array_equal(held, resident):
        raise InputError(None, "placement.slot_map", "does not hold the experts resident on each chiplet")
    slots.flags.writeable = False
    return slots
