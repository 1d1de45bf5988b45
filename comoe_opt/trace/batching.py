"""Micro-batches and windows from a per-token trace.

A serving engine in decode does not batch 64 consecutive tokens of one
sequence: it runs B sequences in flight, each contributing its next token to
the step, and a finished sequence's slot takes the next waiting sequence
(continuous batching). `decode_steps` forms micro-batches that way from the
trace's sequence ids. `token_order` slices consecutive tokens (prefill-like);
for traces without sequence ids (synthetic) the two coincide.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from comoe_opt.errors import ComoeError, InputError
from comoe_opt.trace.model import Trace


@dataclass(frozen=True, eq=False)
class MicroBatches:
    """Routed micro-batches: `experts[b, s, l, r]`, slot `s` of micro-batch `b`.

    `token_index[b, s]` is the trace token in that slot. Only full
    micro-batches are kept, so every slot holds a token.
    """

    experts: np.ndarray  # [batches, tokens_per_batch, layers, k] int16
    token_index: np.ndarray  # [batches, tokens_per_batch] int64
    num_experts: int
    layer_ids: np.ndarray
    dropped_tokens: int  # tokens of the trace in no kept micro-batch

    @property
    def batches(self) -> int:
        return self.experts.shape[0]

    @property
    def tokens_per_batch(self) -> int:
        return self.experts.shape[1]

    @property
    def layers(self) -> int:
        return self.experts.shape[2]

    @property
    def top_k(self) -> int:
        return self.experts.shape[3]

    def window(self, start: int, stop: int) -> MicroBatches:
        """Micro-batches `start..stop-1` as their own `MicroBatches`."""
        return MicroBatches(
            self.experts[start:stop], self.token_index[start:stop], self.num_experts, self.layer_ids, 0
        )

    def planning_window(self, index: int, size: int, name: str = "window") -> MicroBatches:
        """Window `index` of windows of `size` micro-batches (the last may be shorter); `name`
        is the option or key that chose it, for the error when it is past the trace."""
        count = -(-self.batches // size)
        if not 0 <= index < count:
            raise ComoeError(f"{name} {index} is outside the trace's {count} windows")
        start = index * size
        return self.window(start, min(start + size, self.batches))


def make_batches(
    trace: Trace, tokens_per_batch: int, batching: str = "decode", limit: int = 0
) -> MicroBatches:
    """Micro-batches by `batching` ('decode' or 'token-order'), at most `limit` (0 = all)."""
    if batching == "decode":
        index = decode_step_index(trace, tokens_per_batch)
    elif batching == "token-order":
        index = token_order_index(trace.tokens, tokens_per_batch)
    else:
        raise InputError(None, "batching", f"must be 'decode' or 'token-order', got {batching!r}")
    if limit:
        index = index[:limit]
    if index.shape[0] == 0:
        raise InputError(
            trace.source,
            "tokens_per_batch",
            f"{trace.tokens} tokens do not fill one micro-batch of {tokens_per_batch}",
        )
    used = index.size
    return MicroBatches(
        experts=trace.topk[index],
        token_index=index,
        num_experts=trace.num_experts,
        layer_ids=trace.layer_ids,
        dropped_tokens=trace.tokens - used,
    )


def token_order_index(tokens: int, tokens_per_batch: int) -> np.ndarray:
    """Consecutive tokens, `tokens_per_batch` at a time; a partial tail is dropped."""
    full = tokens // tokens_per_batch
    return np.arange(full * tokens_per_batch, dtype=np.int64).reshape(full, tokens_per_batch)


def decode_step_index(trace: Trace, sequences_in_flight: int) -> np.ndarray:
    """Token index [steps, B] of continuous-batching decode steps.

    Sequences enter in trace order; each slot runs one sequence a token per
    step and, when it finishes, takes the next waiting sequence at the next
    step. Steps that are not full (the drain at the end, when no sequence is
    waiting for a free slot) are dropped.
    """
    if trace.seq_id is None:
        return token_order_index(trace.tokens, sequences_in_flight)
    starts, lengths = _sequence_runs(trace.seq_id)
    first_step, slot = _schedule(lengths, sequences_in_flight)
    steps = int((first_step + lengths).max())
    grid = np.full((steps, sequences_in_flight), -1, dtype=np.int64)
    seq_of_token = np.repeat(np.arange(lengths.size), lengths)
    offset = np.arange(trace.tokens) - np.repeat(starts, lengths)
    grid[first_step[seq_of_token] + offset, slot[seq_of_token]] = starts[seq_of_token] + offset
    full = (grid >= 0).all(axis=1)
    return grid[full]


def _sequence_runs(seq_id: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    starts = np.concatenate(([0], np.flatnonzero(np.diff(seq_id) != 0) + 1))
    lengths = np.diff(np.concatenate((starts, [seq_id.size])))
    return starts.astype(np.int64), lengths.astype(np.int64)


def _schedule(lengths: np.ndarray, slots: int) -> tuple[np.ndarray, np.ndarray]:
    """First step and slot of each sequence: the earliest free slot, lowest index first."""
    free = [(0, s) for s in range(slots)]  # (step the slot is free, slot)
    heapq.heapify(free)
    first_step = np.empty(lengths.size, dtype=np.int64)
    slot = np.empty(lengths.size, dtype=np.int64)
    for i, length in enumerate(lengths.tolist()):  # one iteration per sequence, not per token
        step, s = heapq.heappop(free)
        first_step[i], slot[i] = step, s
        heapq.heappush(free, (step + length, s))
    return first_step, slot


def windows(batches: int, window: int) -> list[tuple[int, int]]:
    """(start, stop) of consecutive windows of `window` micro-batches; the last may be shorter."""
    if window < 1:
        raise InputError(None, "window_batches", f"must be >= 1, got {window}")
    return [(start, min(start + window, batches)) for start in range(0, batches, window)]


def history_span(spans: list[tuple[int, int]], w: int, count: int) -> tuple[int, int]:
    """Micro-batches a plan for window `w` is made from: the `count` windows before it.

    The first window has no history and profiles itself.
    """
    if w == 0:
        return spans[0]
    return spans[max(0, w - count)][0], spans[w - 1][1]


COUNT_CHUNK_ROUTES = 2**23  # routes counted at once: bounds step_counts' int64 temporaries (~64 MB each)


def step_counts(batches: MicroBatches) -> np.ndarray:
    """[steps, layers, experts] selections of each expert in each micro-batch (decode step),
    counted a chunk of steps at a time (`COUNT_CHUNK_ROUTES`): a long trace is not widened to
    int64 all at once."""
    n, layers, experts = batches.batches, batches.layers, batches.num_experts
    routes = batches.experts.reshape(n, -1, layers, batches.top_k)
    out = np.empty((n, layers, experts), dtype=np.int64)
    chunk = max(1, COUNT_CHUNK_ROUTES // max(1, routes[0].size))
    cells = (np.arange(layers) * experts)[None, None, :, None]
    for first in range(0, n, chunk):
        part = routes[first : first + chunk]
        keys = (np.arange(part.shape[0])[:, None, None, None] * (layers * experts) + cells) + part
        out[first : first + part.shape[0]] = np.bincount(
            keys.ravel(), minlength=part.shape[0] * layers * experts
        ).reshape(-1, layers, experts)
    return out
