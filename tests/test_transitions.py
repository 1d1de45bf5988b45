"""Transition graph: counts, smoothed probabilities, truncation to top-s, entropy, state size."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from comoe_opt.stats.transitions import BYTES_PER_EDGE, TransitionGraph, transition_counts
from comoe_opt.trace import Trace


def row_entropy(p: np.ndarray) -> np.ndarray:
    return -(np.where(p > 0, p * np.log2(np.where(p > 0, p, 1.0)), 0.0)).sum(axis=-1)


# ------------------------------------------------------------------- counts


def test_transition_counts_hand_example() -> None:
    # token 0: layer 0 [0, 1] -> layer 1 [2, 3]; token 1: [1, 0] -> [2, 0]
    topk = np.array([[[0, 1], [2, 3]], [[1, 0], [2, 0]]])
    kxk = transition_counts(topk, 4, "kxk")
    expected = np.zeros((1, 4, 4), dtype=np.int64)
    for i, j in [(0, 2), (0, 3), (1, 2), (1, 3), (1, 2), (1, 0), (0, 2), (0, 0)]:
        expected[0, i, j] += 1
    assert np.array_equal(kxk, expected)
    top1 = transition_counts(topk, 4, "top1")
    assert top1.shape == (1, 4, 4)
    assert top1[0, 0, 2] == 1 and top1[0, 1, 2] == 1 and top1.sum() == 2


def test_transition_counts_shapes() -> None:
    topk = np.zeros((5, 1, 2), dtype=np.int16) + np.array([0, 1])
    assert transition_counts(topk, 3).shape == (0, 3, 3)
    topk = np.random.default_rng(0).integers(0, 5, size=(7, 4, 1))
    counts = transition_counts(topk, 5, "top1")
    assert counts.shape == (3, 5, 5) and (counts.sum(axis=(1, 2)) == 7).all()
    # marginals: row sums are the current layer's counts, column sums the next layer's
    for p in range(3):
        assert np.array_equal(counts[p].sum(axis=1), np.bincount(topk[:, p, 0], minlength=5))
        assert np.array_equal(counts[p].sum(axis=0), np.bincount(topk[:, p + 1, 0], minlength=5))


# ------------------------------------------------------------------- graph

HAND = np.array([[[4, 0, 0], [1, 1, 0], [0, 0, 0]]])


def test_graph_hand_full_rows() -> None:
    g = TransitionGraph.from_counts(HAND, eps=0.5, top_s=3)
    assert g.pairs == 1 and g.top_s == 3 and g.num_experts == 3 and g.eps == 0.5
    assert g.successors[0].tolist() == [[0, 1, 2], [0, 1, 2], [0, 1, 2]]
    assert np.allclose(g.prob[0, 0], np.array([4.5, 0.5, 0.5]) / 5.5)
    assert np.allclose(g.prob[0, 1], np.array([1.5, 1.5, 0.5]) / 3.5)
    assert np.allclose(g.prob[0, 2], 1 / 3)  # no data: uniform
    assert g.support[0].tolist() == [4, 2, 0]
    assert g.entropy_bits[0, 2] == pytest.approx(math.log2(3))
    assert np.allclose(g.confidence()[0], [4.5 / 5.5, 1.5 / 3.5, 1 / 3])
    assert np.allclose(g.dense(0), (HAND[0] + 0.5) / (HAND[0].sum(axis=1, keepdims=True) + 1.5))


def test_graph_hand_truncated_rows() -> None:
    g = TransitionGraph.from_counts(HAND, eps=0.5, top_s=1)
    assert g.successors[0, :, 0].tolist() == [0, 0, 0]
    assert np.allclose(g.prob[0, :, 0], [4.5 / 5.5, 1.5 / 3.5, 1 / 3])
    dense = g.dense(0)
    # the rest of a row is spread evenly over the experts not kept
    assert np.allclose(dense[1], [1.5 / 3.5, 1 / 3.5, 1 / 3.5])
    assert np.allclose(dense[0], np.array([4.5, 0.5, 0.5]) / 5.5)
    assert np.allclose(dense.sum(axis=1), 1.0)
    assert np.allclose(g.entropy_bits[0], row_entropy(dense))


def test_graph_successor_order() -> None:
    counts = np.array([[[1, 9, 3, 0], [0, 0, 0, 5], [2, 2, 7, 2], [0, 0, 0, 0]]])
    g = TransitionGraph.from_counts(counts, eps=0.1, top_s=2)
    assert g.successors[0].tolist() == [[1, 2], [3, 0], [2, 0], [0, 1]]  # ties: lower id first
    assert (np.diff(g.prob, axis=2) <= 0).all()


counts_arrays = st.integers(2, 9).flatmap(
    lambda e: hnp.arrays(
        np.int64, st.tuples(st.integers(1, 3), st.just(e), st.just(e)), elements=st.integers(0, 50)
    )
)


@given(counts=counts_arrays, eps=st.floats(0.01, 5.0), top_s=st.integers(1, 10))
def test_graph_properties(counts: np.ndarray, eps: float, top_s: int) -> None:
    g = TransitionGraph.from_counts(counts, eps=eps, top_s=top_s)
    pairs, e, _ = counts.shape
    s = min(top_s, e)
    assert g.successors.shape == g.prob.shape == (pairs, e, s)
    formula = (counts + eps) / (counts.sum(axis=2, keepdims=True) + e * eps)
    # kept edges carry the smoothed probability of their (i, j)
    assert np.allclose(g.prob, np.take_along_axis(formula, g.successors, axis=2))
    # kept successors are the most frequent ones
    kept = np.take_along_axis(counts, g.successors, axis=2)
    assert (kept.min(axis=2) >= np.sort(counts, axis=2)[:, :, e - s]).all()
    for p in range(pairs):
        dense = g.dense(p)
        assert np.allclose(dense.sum(axis=1), 1.0)
        assert (dense > 0).all()
        assert np.allclose(g.entropy_bits[p], row_entropy(dense))
        assert np.allclose(g.confidence()[p], dense.max(axis=1))
        if s == e:
            assert np.allclose(dense, formula[p])
    assert np.array_equal(g.support, counts.sum(axis=2))
    assert (g.entropy_bits <= np.log2(e) + 1e-9).all()


def test_more_data_lowers_entropy_and_raises_confidence() -> None:
    little = TransitionGraph.from_counts(np.array([[[2, 0], [0, 2]]]), eps=0.5)
    much = TransitionGraph.from_counts(np.array([[[200, 0], [0, 200]]]), eps=0.5)
    assert (much.entropy_bits < little.entropy_bits).all()
    assert (much.confidence() > little.confidence()).all()


def test_state_bytes() -> None:
    assert BYTES_PER_EDGE == 4
    # the paper: 32 x 64 experts, top-8, 4 B per edge = 64 KiB
    paper = TransitionGraph.from_counts(np.zeros((32, 64, 64), dtype=np.int64), top_s=8)
    assert paper.state_bytes() == 32 * 64 * 8 * 4 == 65536
    between_layers = TransitionGraph.from_counts(np.zeros((31, 64, 64), dtype=np.int64), top_s=8)
    assert between_layers.state_bytes() == 31 * 64 * 8 * 4
    assert TransitionGraph.from_counts(np.zeros((2, 4, 4)), top_s=8).state_bytes() == 2 * 4 * 4 * 4


def test_from_trace() -> None:
    rng = np.random.default_rng(3)
    topk = np.argsort(rng.random((50, 3, 6)), axis=2)[:, :, :2].astype(np.int16)
    trace = Trace(topk=topk, num_experts=6)
    for pairs in ("kxk", "top1"):
        g = TransitionGraph.from_trace(trace, eps=0.2, top_s=4, pairs=pairs)
        ref = TransitionGraph.from_counts(transition_counts(topk, 6, pairs), eps=0.2, top_s=4)
        assert np.array_equal(g.successors, ref.successors)
        assert np.array_equal(g.prob, ref.prob)
    assert TransitionGraph.from_trace(trace).support.sum() == 50 * 2 * 4  # k x k pairs per token and pair
