"""Device sets of any size, as bits packed in 64-bit words: row [W] holds device c in bit c % 64
of word c // 64 (W = ⌈devices / 64⌉). The cut condition's sets (best_split/cut_condition.py), an
expert's replica set and a step's bottleneck set are all such rows, so that nothing breaks past
the 62 devices an int64 bit mask holds. Where a scalar is handier (the slow loop's moves), a set
is a Python int (`as_int`, `from_ints`): unbounded, the same bits.

Rows compare and sort as their words do, most significant word first (`union`), which for one
word is the order of the integers they stand for.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

WORD = 64


def words(devices: int) -> int:
    """Words per set of `devices` devices."""
    return max(1, -(-devices // WORD))


def pack(resident: np.ndarray) -> np.ndarray:
    """[..., W] uint64 sets from membership [..., devices] (bool or 0/1)."""
    member = np.asarray(resident).astype(bool)
    devices = member.shape[-1]
    width = words(devices)
    padded = np.zeros((*member.shape[:-1], width * WORD), dtype=bool)
    padded[..., :devices] = member
    bits = padded.reshape(*member.shape[:-1], width, WORD).astype(np.uint64)
    return (bits << np.arange(WORD, dtype=np.uint64)).sum(axis=-1, dtype=np.uint64)


def unpack(sets: np.ndarray, devices: int) -> np.ndarray:
    """[..., devices] bool membership of sets [..., W] (`pack`'s inverse)."""
    sets = np.asarray(sets, dtype=np.uint64)
    bits = (sets[..., None] >> np.arange(WORD, dtype=np.uint64)) & np.uint64(1)
    return bits.reshape(*sets.shape[:-1], sets.shape[-1] * WORD)[..., :devices].astype(bool)


def everything(devices: int) -> np.ndarray:
    """[W] the set of all devices."""
    return pack(np.ones(devices, dtype=bool))


def singletons(devices: int) -> np.ndarray:
    """[devices, W] each device alone."""
    return pack(np.eye(devices, dtype=bool))


def sizes(sets: np.ndarray) -> np.ndarray:
    """[...] devices in each set [..., W]."""
    return np.bitwise_count(np.asarray(sets, dtype=np.uint64)).sum(axis=-1, dtype=np.int64)


def inside(masks: np.ndarray, sets: np.ndarray, dtype: type = np.float64) -> np.ndarray:
    """[..., P] 1 where replica set `masks` [..., W] lies inside set `sets` [P, W], in `dtype`."""
    outside = masks[..., None, :] & ~sets  # [..., P, W]
    return (outside == 0).all(axis=-1).astype(dtype)


def union(pool: np.ndarray, more: np.ndarray) -> np.ndarray:
    """[Q, W] the distinct sets of both, sorted (most significant word first)."""
    rows = np.concatenate([pool, np.asarray(more, dtype=np.uint64).reshape(-1, pool.shape[-1])])
    keys = rows[:, ::-1]  # np.unique sorts rows by their first column first
    return np.unique(keys, axis=0)[:, ::-1].copy()


def as_int(row: np.ndarray) -> int:
    """The set [W] as one Python int (bit c for device c)."""
    return int.from_bytes(np.asarray(row, dtype="<u8").tobytes(), "little")


def as_ints(sets: np.ndarray) -> list[int]:
    """Each set [N, W] as a Python int."""
    return [as_int(row) for row in np.asarray(sets, dtype=np.uint64).reshape(-1, sets.shape[-1])]


def from_ints(masks: Iterable[int], width: int) -> np.ndarray:
    """[N, width] sets of Python-int masks (`width` words each: `words(devices)`)."""
    data = b"".join(int(m).to_bytes(8 * width, "little") for m in masks)
    return np.frombuffer(data, dtype="<u8").astype(np.uint64).reshape(-1, width)
