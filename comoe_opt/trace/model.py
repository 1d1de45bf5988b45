"""In-memory routing traces: per-token (`Trace`) and aggregate (`AggregateTrace`).

Both are immutable and validated on construction, so every consumer can trust
shapes, dtypes and id ranges. Validation errors name the source file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from comoe_opt.errors import InputError


@dataclass(frozen=True, eq=False)
class Trace:
    """Per-token routing: for every token and layer, the k chosen expert ids.

    `topk[t, l, r]` is the expert chosen at router rank `r` (0 = highest
    score) by token `t` at logged layer `l`. `layer_ids[l]` is the model's
    layer number of logged layer `l` (sources may skip layers). `seq_id`
    groups tokens into sequences (tokens of one sequence are consecutive);
    without it every token is its own sequence.
    """

    topk: np.ndarray
    num_experts: int
    probs: np.ndarray | None = None
    seq_id: np.ndarray | None = None
    pos: np.ndarray | None = None
    layer_ids: np.ndarray = None  # type: ignore[assignment]  # None: 0..layers-1, set in __post_init__
    meta: dict[str, Any] = field(default_factory=dict)
    source: str | None = None

    def __post_init__(self) -> None:
        validate_per_token(self)
        if self.layer_ids is None:
            object.__setattr__(self, "layer_ids", np.arange(self.layers, dtype=np.int64))
        for name in ("topk", "probs", "seq_id", "pos", "layer_ids"):
            value = getattr(self, name)
            if value is not None:
                value.flags.writeable = False

    @property
    def tokens(self) -> int:
        return self.topk.shape[0]

    @property
    def layers(self) -> int:
        return self.topk.shape[1]

    @property
    def top_k(self) -> int:
        return self.topk.shape[2]

    def counts(self) -> np.ndarray:
        """Selections per expert, all ranks: [layers, experts] int64."""
        return selection_counts(self.topk, self.num_experts)


@dataclass(frozen=True, eq=False)
class AggregateTrace:
    """Aggregate routing statistics without per-token ids.

    `counts[l, e]` selections of expert `e` at logged layer `l`;
    `transitions[p, i, j]` rank-1 → rank-1 joint counts between logged layers
    `p` and `p + 1` (which need not be adjacent model layers: see
    `layer_ids`); `transitions_kxk` all k × k pairs and `counts_top1` rank-1 selections
    where the source has them.
    `domains` holds the same arrays per data domain where available.
    """

    counts: np.ndarray
    layer_ids: np.ndarray
    transitions: np.ndarray | None = None
    transitions_kxk: np.ndarray | None = None
    counts_top1: np.ndarray | None = None
    domains: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    source: str | None = None

    def __post_init__(self) -> None:
        validate_aggregate(self)

    @property
    def layers(self) -> int:
        return self.counts.shape[0]

    @property
    def num_experts(self) -> int:
        return self.counts.shape[1]


def selection_counts(topk: np.ndarray, num_experts: int) -> np.ndarray:
    """[layers, experts] selection counts of a [tokens, layers, k] id array."""
    layers = topk.shape[1]
    offsets = (np.arange(layers, dtype=np.int64) * num_experts)[None, :, None]
    flat = (topk.astype(np.int64) + offsets).ravel()
    return np.bincount(flat, minlength=layers * num_experts).reshape(layers, num_experts)


def validate_per_token(trace: Trace) -> None:
    """Check shapes, dtypes, id ranges, distinct top-k ids and finite gates."""
    src = trace.source
    topk = trace.topk
    if not isinstance(topk, np.ndarray) or topk.ndim != 3:
        shape = getattr(topk, "shape", None)
        raise InputError(src, "topk", f"must be a 3-D array [tokens, layers, k], got shape {shape}")
    if not np.issubdtype(topk.dtype, np.integer):
        raise InputError(src, "topk", f"must hold integer expert ids, got dtype {topk.dtype}")
    if topk.shape[0] == 0:
        raise InputError(src, "topk", "empty trace: no tokens")
    if topk.shape[1] == 0 or topk.shape[2] == 0:
        raise InputError(src, "topk", f"needs at least one layer and one choice, got shape {topk.shape}")
    experts = trace.num_experts
    if not isinstance(experts, (int, np.integer)) or experts < 2:
        raise InputError(src, "num_experts", f"must be an integer >= 2, got {experts!r}")
    if topk.shape[2] > experts:
        raise InputError(src, "topk", f"k = {topk.shape[2]} exceeds the {experts} experts per layer")
    _check_id_range(topk, experts, src)
    _check_distinct(topk, src)
    tokens = topk.shape[0]
    if trace.probs is not None:
        _check_probs(trace.probs, topk.shape, src)
    for name in ("seq_id", "pos"):
        value = getattr(trace, name)
        if value is not None:
            _check_vector(value, tokens, name, src)
    if trace.seq_id is not None:
        _check_consecutive(trace.seq_id, src)
    if trace.layer_ids is not None:
        _check_layer_ids(trace.layer_ids, topk.shape[1], src)


def validate_aggregate(agg: AggregateTrace) -> None:
    src = agg.source
    counts = agg.counts
    if not isinstance(counts, np.ndarray) or counts.ndim != 2:
        raise InputError(
            src, "counts", f"must be a 2-D array [layers, experts], got {getattr(counts, 'shape', None)}"
        )
    if counts.shape[0] == 0 or counts.shape[1] < 2:
        raise InputError(src, "counts", f"empty or too few experts: shape {counts.shape}")
    if not np.issubdtype(counts.dtype, np.integer) and not np.issubdtype(counts.dtype, np.floating):
        raise InputError(src, "counts", f"must be numeric, got dtype {counts.dtype}")
    if not np.all(np.isfinite(counts)) or np.any(counts < 0):
        raise InputError(src, "counts", "must be finite and non-negative")
    if counts.sum() == 0:
        raise InputError(src, "counts", "empty trace: all counts are zero")
    empty = np.flatnonzero(counts.sum(axis=1) == 0)
    if empty.size:
        raise InputError(src, "counts", f"layer {int(empty[0])} has no selections")
    _check_layer_ids(agg.layer_ids, counts.shape[0], src)
    experts = counts.shape[1]
    pairs = counts.shape[0] - 1
    shapes = {
        "transitions": (pairs, experts, experts),
        "transitions_kxk": (pairs, experts, experts),
        "counts_top1": counts.shape,
    }
    for name, shape in shapes.items():
        _check_count_array(getattr(agg, name), name, shape, src)
    for domain, arrays in agg.domains.items():
        for what, value in arrays.items():
            _check_count_array(value, f"{domain}_{what}", shapes.get(what, counts.shape), src)


def _check_count_array(value: Any, name: str, shape: tuple[int, ...], src: str | None) -> None:
    if value is None:
        return
    if not isinstance(value, np.ndarray) or not (
        np.issubdtype(value.dtype, np.integer) or np.issubdtype(value.dtype, np.floating)
    ):
        raise InputError(src, name, f"must be a numeric array, got dtype {getattr(value, 'dtype', None)}")
    if value.shape != shape:
        raise InputError(src, name, f"must have shape {shape}, got {value.shape}")
    if not np.all(np.isfinite(value)) or np.any(value < 0):
        raise InputError(src, name, "must be finite and non-negative")


def _check_id_range(topk: np.ndarray, experts: int, src: str | None) -> None:
    bad = (topk < 0) | (topk >= experts)
    if bad.any():
        t, layer, r = np.argwhere(bad)[0]
        raise InputError(
            src,
            "topk",
            f"expert id {int(topk[t, layer, r])} out of range 0..{experts - 1} "
            f"(token {t}, layer {layer}, rank {r}; {int(bad.sum())} bad ids)",
        )


def _check_distinct(topk: np.ndarray, src: str | None) -> None:
    if topk.shape[2] < 2:
        return
    ordered = np.sort(topk, axis=2)
    dup = (ordered[:, :, 1:] == ordered[:, :, :-1]).any(axis=2)
    if dup.any():
        t, layer = np.argwhere(dup)[0]
        ids = topk[t, layer].tolist()
        raise InputError(
            src, "topk", f"duplicate expert ids {ids} in one token's top-k (token {t}, layer {layer})"
        )


def _check_probs(probs: Any, shape: tuple[int, ...], src: str | None) -> None:
    if not isinstance(probs, np.ndarray) or probs.shape != shape:
        raise InputError(
            src, "probs", f"must have the shape of topk {shape}, got {getattr(probs, 'shape', None)}"
        )
    if not np.issubdtype(probs.dtype, np.floating):
        raise InputError(src, "probs", f"must be floating point, got dtype {probs.dtype}")
    finite = np.isfinite(probs)
    if not finite.all():
        t, layer, r = np.argwhere(~finite)[0]
        raise InputError(src, "probs", f"NaN or infinite gate weight (token {t}, layer {layer}, rank {r})")


def _check_vector(value: Any, tokens: int, name: str, src: str | None) -> None:
    if not isinstance(value, np.ndarray) or value.shape != (tokens,):
        raise InputError(
            src, name, f"must be a 1-D array of {tokens} entries, got shape {getattr(value, 'shape', None)}"
        )
    if not np.issubdtype(value.dtype, np.integer):
        raise InputError(src, name, f"must be integer, got dtype {value.dtype}")


def _check_consecutive(seq_id: np.ndarray, src: str | None) -> None:
    starts = np.flatnonzero(np.diff(seq_id) != 0) + 1
    run_ids = seq_id[np.concatenate(([0], starts))]
    if np.unique(run_ids).size != run_ids.size:
        raise InputError(src, "seq_id", "tokens of one sequence must be consecutive")


def _check_layer_ids(layer_ids: Any, layers: int, src: str | None) -> None:
    if not isinstance(layer_ids, np.ndarray) or layer_ids.shape != (layers,):
        raise InputError(
            src, "layers", f"must list {layers} layer numbers, got shape {getattr(layer_ids, 'shape', None)}"
        )
    if (
        not np.issubdtype(layer_ids.dtype, np.integer)
        or np.any(np.diff(layer_ids) <= 0)
        or np.any(layer_ids < 0)
    ):
        raise InputError(src, "layers", "must be strictly increasing non-negative integers")
