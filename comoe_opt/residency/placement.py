"""Expert residency: which chiplets hold a replica of which logical expert.

`Placement.resident[l, e, c]` is True when chiplet `c` holds the page of
logical expert `(l, e)`. At most one copy per chiplet is structural (a
boolean cannot be 2). A logical expert with no replica is served by
on-demand loading.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from comoe_opt.errors import InputError


@dataclass(frozen=True, eq=False)
class Placement:
    resident: np.ndarray  # [layers, experts, chiplets] bool

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
