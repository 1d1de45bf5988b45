"""Micro-batches: continuous-batching decode steps, token order, windows."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from comoe_opt.errors import InputError
from comoe_opt.trace import Trace, make_batches, windows
from comoe_opt.trace.batching import decode_step_index, token_order_index


def trace_of(lengths: list[int], seq_ids: list[int] | None = None, experts: int = 4) -> Trace:
    """One layer, top-1; token t routes to expert t % experts; sequences of the given lengths."""
    tokens = sum(lengths)
    topk = (np.arange(tokens) % experts).astype(np.int16).reshape(tokens, 1, 1)
    ids = seq_ids if seq_ids is not None else list(range(len(lengths)))
    seq = np.repeat(np.array(ids, dtype=np.int32), lengths)
    return Trace(topk=topk, num_experts=experts, seq_id=seq)


# ---------------------------------------------------------- hand examples


def test_decode_hand_example_all_full() -> None:
    # sequences A = tokens 0,1,2; B = 3; C = 4,5. B = 2 slots.
    # step 0: A0 (slot 0), B0 (slot 1); B ends, C takes slot 1 at step 1.
    grid = decode_step_index(trace_of([3, 1, 2]), 2)
    assert grid.tolist() == [[0, 3], [1, 4], [2, 5]]


def test_decode_hand_example_drain_dropped() -> None:
    # A = 0,1,2; B = 3; C = 4. Step 2 holds only A2: not full, dropped.
    grid = decode_step_index(trace_of([3, 1, 1]), 2)
    assert grid.tolist() == [[0, 3], [1, 4]]
    batches = make_batches(trace_of([3, 1, 1]), 2)
    assert batches.dropped_tokens == 1
    assert batches.token_index.tolist() == [[0, 3], [1, 4]]


def test_decode_lowest_free_slot_first() -> None:
    # A = 0,1 (slot 0); B = 2,3,4,5 (slot 1); C = 6 (slot 0 at step 2); D = 7,8 (slot 0 at step 3).
    grid = decode_step_index(trace_of([2, 4, 1, 2]), 2)
    assert grid.tolist() == [[0, 2], [1, 3], [6, 4], [7, 5]]


def test_decode_three_slots() -> None:
    # A = 0..3 (slot 0), B = 4 (slot 1), C = 5,6 (slot 2) start at step 0.
    # B ends after step 0: D = 7 takes slot 1 at step 1. D ends after step 1 and C too:
    # E = 8,9,10 takes slot 1 (lowest) at step 2; slot 2 stays empty -> steps 2.. are drain.
    grid = decode_step_index(trace_of([4, 1, 2, 1, 3]), 3)
    assert grid.tolist() == [[0, 4, 5], [1, 7, 6]]


def test_decode_ignores_seq_id_values_only_runs() -> None:
    """Sequence ids need not be sorted or dense: a run of equal ids is one sequence."""
    grid = decode_step_index(trace_of([3, 1, 2], seq_ids=[90, 5, 17]), 2)
    assert grid.tolist() == [[0, 3], [1, 4], [2, 5]]


def test_experts_follow_token_index() -> None:
    trace = trace_of([3, 1, 2])
    batches = make_batches(trace, 2)
    assert batches.experts.shape == (3, 2, 1, 1)
    assert np.array_equal(batches.experts[..., 0, 0], np.asarray(trace.topk)[batches.token_index, 0, 0])
    assert batches.batches == 3 and batches.tokens_per_batch == 2
    assert batches.layers == 1 and batches.top_k == 1 and batches.num_experts == 4


def test_without_seq_id_decode_is_token_order() -> None:
    trace = Trace(topk=(np.arange(11) % 3).astype(np.int16).reshape(11, 1, 1), num_experts=3)
    assert np.array_equal(decode_step_index(trace, 4), token_order_index(11, 4))
    assert token_order_index(11, 4).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    decode = make_batches(trace, 4, "decode")
    order = make_batches(trace, 4, "token-order")
    assert np.array_equal(decode.token_index, order.token_index)
    assert decode.dropped_tokens == order.dropped_tokens == 3


def test_token_order_ignores_sequences() -> None:
    batches = make_batches(trace_of([3, 1, 2]), 2, "token-order")
    assert batches.token_index.tolist() == [[0, 1], [2, 3], [4, 5]]


def test_limit_keeps_first_batches() -> None:
    trace = trace_of([3, 1, 2])
    batches = make_batches(trace, 2, limit=2)
    assert batches.token_index.tolist() == [[0, 3], [1, 4]]
    assert batches.dropped_tokens == 2


@pytest.mark.parametrize(
    ("lengths", "slots", "batching"),
    [([2, 3], 8, "token-order"), ([2, 3], 3, "decode"), ([1, 1, 1], 4, "decode")],
)
def test_too_few_tokens(lengths: list[int], slots: int, batching: str) -> None:
    with pytest.raises(InputError, match="do not fill one micro-batch") as info:
        make_batches(trace_of(lengths), slots, batching)
    assert info.value.field == "tokens_per_batch"


def test_unknown_batching() -> None:
    with pytest.raises(InputError, match="'decode' or 'token-order'"):
        make_batches(trace_of([3, 1, 2]), 2, "prefill")


def test_window_and_windows() -> None:
    batches = make_batches(trace_of([3, 1, 2]), 2)
    part = batches.window(1, 3)
    assert part.token_index.tolist() == [[1, 4], [2, 5]]
    assert part.batches == 2 and part.dropped_tokens == 0
    assert windows(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert windows(8, 4) == [(0, 4), (4, 8)]
    assert windows(0, 4) == []
    with pytest.raises(InputError, match="window_batches"):
        windows(10, 0)


# --------------------------------------------------------------- properties


def check_decode_grid(seq_id: np.ndarray, grid: np.ndarray, slots: int) -> None:
    tokens = seq_id.size
    assert grid.ndim == 2 and grid.shape[1] == slots
    flat = grid.ravel()
    assert (flat >= 0).all() and (flat < tokens).all()  # only full steps
    assert np.unique(flat).size == flat.size  # every token at most once
    for row in seq_id[grid]:  # a step holds tokens of distinct sequences
        assert np.unique(row).size == row.size
    starts = np.concatenate(([0], np.flatnonzero(np.diff(seq_id)) + 1))
    ends = np.concatenate((starts[1:], [tokens]))
    where = {int(t): divmod(i, slots) for i, t in enumerate(flat)}  # token -> (step, slot)
    for start, end in zip(starts, ends, strict=True):
        kept = [t for t in range(start, end) if t in where]
        # a prefix of the sequence, at consecutive steps, in one slot
        assert kept == list(range(start, start + len(kept)))
        if kept:
            steps = [where[t][0] for t in kept]
            assert steps == list(range(steps[0], steps[0] + len(kept)))
            assert len({where[t][1] for t in kept}) == 1


def reference_decode(lengths: list[int], slots: int) -> list[list[int]]:
    """Step-by-step continuous batching: free slots take waiting sequences, lowest slot first."""
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1])).tolist()
    waiting = list(range(len(lengths)))
    active: list[list[int] | None] = [None] * slots  # [sequence, next offset]
    steps = []
    while True:
        for s in range(slots):
            if active[s] is None and waiting:
                active[s] = [waiting.pop(0), 0]
        if all(a is None for a in active):
            break
        steps.append([-1 if a is None else starts[a[0]] + a[1] for a in active])
        for s, a in enumerate(active):
            if a is not None:
                a[1] += 1
                if a[1] == lengths[a[0]]:
                    active[s] = None
    return [row for row in steps if min(row) >= 0]


@given(
    lengths=st.lists(st.integers(1, 6), min_size=1, max_size=25),
    slots=st.integers(1, 6),
)
def test_decode_grid_properties(lengths: list[int], slots: int) -> None:
    trace = trace_of(lengths)
    grid = decode_step_index(trace, slots)
    check_decode_grid(np.asarray(trace.seq_id), grid, slots)
    if grid.shape[0]:
        batches = make_batches(trace, slots)
        assert batches.dropped_tokens == trace.tokens - grid.size
    if slots == 1:  # one slot: plain token order
        assert np.array_equal(grid.ravel(), np.arange(trace.tokens))
    assert grid.tolist() == reference_decode(lengths, slots)


def test_gptoss_decode_steps(gptoss_trace) -> None:
    batches = make_batches(gptoss_trace, 64, "decode")
    grid = batches.token_index
    seq_id = np.asarray(gptoss_trace.seq_id)
    assert grid.shape[1] == 64 and grid.shape[0] > 1000
    assert (grid >= 0).all()
    assert np.unique(grid).size == grid.size
    seqs = np.sort(seq_id[grid], axis=1)
    assert not (seqs[:, 1:] == seqs[:, :-1]).any()  # no sequence twice in a step
    # consecutive steps in a slot advance a sequence by one token, or start a new one at its first token
    same = seq_id[grid[1:]] == seq_id[grid[:-1]]
    assert (grid[1:][same] == grid[:-1][same] + 1).all()
    is_start = np.concatenate(([True], seq_id[1:] != seq_id[:-1]))
    assert is_start[grid[1:][~same]].all()
    assert is_start[grid[0]].all()
    assert batches.dropped_tokens == gptoss_trace.tokens - grid.size
    assert batches.dropped_tokens < gptoss_trace.tokens // 10
    assert np.array_equal(batches.experts, np.asarray(gptoss_trace.topk)[grid])


@given(st.integers(1, 40), st.integers(4, 300), st.integers(0, 2**16))
def test_step_counts_in_chunks_are_the_whole_trace_counts(chunk, tokens, seed) -> None:
    """Counting a few steps at a time (COUNT_CHUNK_ROUTES) gives every step's counts exactly."""
    import comoe_opt.trace.batching as batching

    rng = np.random.default_rng(seed)
    layers, experts, top_k = 3, 6, 2
    topk = np.stack([rng.permutation(experts)[:top_k] for _ in range(tokens * layers)])
    trace = Trace(topk=topk.reshape(tokens, layers, top_k).astype(np.int16), num_experts=experts)
    batches = make_batches(trace, 4, "token-order")
    whole = batches.experts.reshape(batches.batches, -1, layers, top_k)
    expected = np.stack(
        [
            [np.bincount(whole[s, :, layer].ravel(), minlength=experts) for layer in range(layers)]
            for s in range(batches.batches)
        ]
    )
    saved = batching.COUNT_CHUNK_ROUTES
    try:
        batching.COUNT_CHUNK_ROUTES = chunk
        assert np.array_equal(batching.step_counts(batches), expected)
    finally:
        batching.COUNT_CHUNK_ROUTES = saved
