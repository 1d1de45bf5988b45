"""The experts' pairwise covariances Cov(w_e, w_f) of a layer's steps, which the `even` search
needs to score a swap: computed per layer when first asked for and held in a ring of at most
`cross_bytes` (the oldest layer not asked for now makes room; all layers fit at the shapes
engines use). A search that scores only a few moves (a half of the steps' check) holds none and
computes the pairs it is asked for."""

from __future__ import annotations

import numpy as np


class PairCovariances:
    def __init__(self, dev: np.ndarray, cross_bytes: int, hold: bool):
        """`dev` [layers, E, S]: the experts' scaled deviations (objective.Moments.dev)."""
        self.dev = dev
        layers, experts, self.steps = dev.shape
        rooms = min(layers, max(1, cross_bytes // (8 * experts**2)))
        self.cross = np.zeros((rooms, experts, experts)) if hold else None
        self.cross_at = np.full(layers, -1, dtype=np.int64)  # each layer's room, -1: none
        self.held_by = np.full(rooms, -1, dtype=np.int64)
        self.next_room = 0  # the next room to reuse, round the ring

    def layers_held(self, layers: int) -> int:
        """Layers whose covariances are held at once (a batch of layers must not exceed it)."""
        return layers if self.cross is None else self.cross.shape[0]

    def missing(self, layers: np.ndarray) -> int:
        """How many of `layers` would have their pairs computed afresh."""
        if self.cross is None:
            return 0
        return int((self.cross_at[np.unique(layers)] < 0).sum())

    def __call__(self, layers: np.ndarray, e: np.ndarray, f: np.ndarray) -> np.ndarray:
        """Cov(w_e, w_f) (broadcast indices)."""
        if self.cross is not None:
            self._hold(np.unique(layers))
            return np.asarray(self.cross[self.cross_at[layers], e, f])
        return np.asarray((self.dev[layers, e] * self.dev[layers, f]).mean(axis=-1))

    def _hold(self, need: np.ndarray) -> None:
        assert self.cross is not None
        for layer in need[self.cross_at[need] < 0].tolist():
            while True:  # the next room round the ring whose layer is not needed now
                at = self.next_room
                self.next_room = (self.next_room + 1) % self.cross.shape[0]
                old = int(self.held_by[at])
                if old < 0 or old not in need:
                    break
            if old >= 0:
                self.cross_at[old] = -1
            self.cross[at] = np.einsum("es,fs->ef", self.dev[layer], self.dev[layer]) / max(self.steps, 1)
            self.cross_at[layer], self.held_by[at] = at, layer
