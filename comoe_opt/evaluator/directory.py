"""Versioned expert directory: prepare → publish → reclaim (paper §2.2, §6.2).

Every replica of a logical expert (l, e) on chiplet c is an entry with a
weight version and a state:

* PREPARING — the copy is in flight; it becomes usable only once it has fully
  arrived *and* its checksum verified (`publish_due`); a failed verification
  rolls the entry back (the copy is dropped, nothing else changes);
* PUBLISHED — usable by tokens;
* RETIRING — no longer in the plan; reclaimed only when no token in flight
  still reads it (`release` drops the count to zero).

`read` is the only way tokens reach pages and raises if an entry is not
PUBLISHED, so a violation of the invariant cannot pass silently. State is
kept in [L, E, C] arrays so the runtime can ask for a layer's published
replicas at every step without walking a dictionary.
"""

from __future__ import annotations

import numpy as np

NONE, PREPARING, PUBLISHED, RETIRING = 0, 1, 2, 3
STATE_NAMES = {NONE: "absent", PREPARING: "preparing", PUBLISHED: "published", RETIRING: "retiring"}


class DirectoryError(RuntimeError):
    """An invariant of the directory was about to be broken (a bug, not a user error)."""


class ExpertDirectory:
    def __init__(self, layers: int, experts: int, chiplets: int, version: int = 1):
        shape = (layers, experts, chiplets)
        self.version = version
        self.state = np.zeros(shape, dtype=np.int8)
        self.entry_version = np.zeros(shape, dtype=np.int32)
        self.ready_at = np.full(shape, np.inf)
        self.verified = np.zeros(shape, dtype=bool)
        self.readers = np.zeros(shape, dtype=np.int32)
        self.rolled_back = 0
        self.reclaimed = 0
        self.landed = 0  # copies published (a copy counts when it lands)
        self.cancelled = 0  # copies dropped in flight by a newer plan

    # ------------------------------------------------------------ queries

    def published(self, layer: int | None = None) -> np.ndarray:
        """Bool [E, C] (one layer) or [L, E, C] of replicas tokens may use now."""
        state = self.state if layer is None else self.state[layer]
        return np.asarray(state == PUBLISHED)

    def held(self) -> np.ndarray:
        """Bool [L, E, C] of pages occupying memory (any state)."""
        return self.state != NONE

    # --------------------------------------------------------- transitions

    def install(self, resident: np.ndarray) -> None:
        """Initial placement, loaded before serving starts: published at once."""
        if np.any(self.state[resident] != NONE):
            raise DirectoryError("install over existing entries")
        self.state[resident] = PUBLISHED
        self.entry_version[resident] = self.version
        self.verified[resident] = True
        self.ready_at[resident] = 0.0

    def prepare(self, key: tuple[int, int, int], ready_at: float, verified: bool = True) -> None:
        """Start copying a new replica; it is not usable until published."""
        if self.state[key] in (PREPARING, PUBLISHED):
            raise DirectoryError(f"replica {key} already present")
        if self.state[key] == RETIRING and self.readers[key]:
            raise DirectoryError(f"replica {key} is still being read")
        self.state[key] = PREPARING
        self.entry_version[key] = self.version
        self.ready_at[key] = ready_at
        self.verified[key] = verified

    def publish_due(self, now: float) -> int:
        """Publish copies that arrived and verified by `now`; roll back failed ones."""
        due = (self.state == PREPARING) & (self.ready_at <= now)
        good = due & self.verified
        bad = due & ~self.verified
        self.state[good] = PUBLISHED
        self.state[bad] = NONE
        self.ready_at[bad] = np.inf
        self.rolled_back += int(bad.sum())
        self.landed += int(good.sum())
        return int(good.sum())

    def retire(self, key: tuple[int, int, int]) -> None:
        """Take a replica out of the plan; it is reclaimed once no token reads it."""
        state = self.state[key]
        if state == PREPARING:  # cancel a copy nobody can be reading
            self.state[key] = NONE
            self.ready_at[key] = np.inf
            self.cancelled += 1
        elif state == PUBLISHED:
            self.state[key] = RETIRING
            if self.readers[key] == 0:
                self._reclaim(key)

    def read(self, layer: int, pairs: np.ndarray) -> None:
        """Tokens start reading the replicas `pairs[e, c]` of a layer: all must be published."""
        states = self.state[layer][pairs]
        if np.any(states != PUBLISHED):
            e, c = np.argwhere(pairs & (self.state[layer] != PUBLISHED))[0]
            state = STATE_NAMES[int(self.state[layer, e, c])]
            raise DirectoryError(f"token read replica {(layer, int(e), int(c))} in state {state}")
        self.readers[layer][pairs] += 1

    def release(self, layer: int, pairs: np.ndarray) -> None:
        """Tokens finished reading the replicas `pairs[e, c]` of a layer."""
        if np.any(self.readers[layer][pairs] <= 0):
            raise DirectoryError(f"release without a reader at layer {layer}")
        self.readers[layer][pairs] -= 1
        if not (self.state[layer][pairs] == RETIRING).any():  # the common case: nothing to reclaim
            return
        idle = pairs & (self.state[layer] == RETIRING) & (self.readers[layer] == 0)
        for e, c in np.argwhere(idle):
            self._reclaim((layer, int(e), int(c)))

    def _reclaim(self, key: tuple[int, int, int]) -> None:
        self.state[key] = NONE
        self.ready_at[key] = np.inf
        self.reclaimed += 1
