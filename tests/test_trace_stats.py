"""Trace statistics: Zipf fit, conditional entropy, held-out predictability."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from comoe_opt.errors import InputError
from comoe_opt.stats import aggregate_stats, fit_zipf_alpha, trace_stats
from comoe_opt.stats.trace_stats import conditional_entropy_bits, successor_accuracy, window_alpha
from comoe_opt.trace import AggregateTrace, Trace


def expected_counts(alpha: float, experts: int, total: float = 1e9) -> np.ndarray:
    w = np.arange(1, experts + 1, dtype=np.float64) ** -alpha
    return total * w / w.sum()


# ------------------------------------------------------------------ Zipf fit


@pytest.mark.parametrize("alpha", [0.1, 0.6, 1.1, 2.0, 4.0])
def test_fit_zipf_alpha_exact_counts(alpha: float) -> None:
    assert fit_zipf_alpha(expected_counts(alpha, 64)) == pytest.approx(alpha, abs=1e-3)


@given(alpha=st.floats(0.0, 5.0), experts=st.integers(2, 128), seed=st.integers(0, 2**32))
def test_fit_zipf_alpha_property(alpha: float, experts: int, seed: int) -> None:
    counts = expected_counts(alpha, experts)
    fitted = fit_zipf_alpha(counts)
    assert abs(fitted - alpha) <= 1e-3
    shuffled = np.random.default_rng(seed).permutation(counts)
    assert fit_zipf_alpha(shuffled) == fitted


def test_fit_zipf_alpha_integer_counts_and_edge_cases() -> None:
    counts = np.round(expected_counts(1.1, 32, 1e8)).astype(np.int64)
    assert fit_zipf_alpha(counts) == pytest.approx(1.1, abs=1e-3)
    assert fit_zipf_alpha(np.full(8, 100)) == pytest.approx(0.0, abs=1e-3)  # uniform
    assert math.isnan(fit_zipf_alpha(np.zeros(8)))
    # skew grows with concentration
    assert fit_zipf_alpha([10, 5, 3, 2]) < fit_zipf_alpha([50, 5, 3, 2])


# ------------------------------------------------------ conditional entropy


@pytest.mark.parametrize("experts", [2, 3, 8, 64])
def test_conditional_entropy_identity_and_uniform(experts: int) -> None:
    assert conditional_entropy_bits(7 * np.eye(experts)) == 0.0
    assert conditional_entropy_bits(np.ones((experts, experts))) == pytest.approx(math.log2(experts))
    # a permutation is as predictable as the identity
    perm = np.eye(experts)[np.random.default_rng(experts).permutation(experts)]
    assert conditional_entropy_bits(perm) == 0.0


def test_conditional_entropy_hand_examples() -> None:
    # row 0: 1 bit of uncertainty, half the mass; row 1: certain -> 0.5 bit
    assert conditional_entropy_bits(np.array([[1, 1], [0, 2]])) == pytest.approx(0.5)
    # an empty row does not count
    assert conditional_entropy_bits(np.array([[2, 2], [0, 0]])) == pytest.approx(1.0)
    # rows weighted by their mass: 3/4 of the tokens are certain
    assert conditional_entropy_bits(np.array([[6, 0, 0], [0, 1, 1]])) == pytest.approx(0.25)
    assert math.isnan(conditional_entropy_bits(np.zeros((3, 3))))


def test_successor_accuracy_hand_example() -> None:
    train = np.array([[5, 1], [2, 3]])  # predicts 0 -> 0, 1 -> 1; most popular next: 0
    test = np.array([[2, 2], [1, 3]])
    accuracy, popularity = successor_accuracy(train, test)
    assert accuracy == pytest.approx((2 + 3) / 8)
    assert popularity == pytest.approx((2 + 1) / 8)
    assert all(math.isnan(v) for v in successor_accuracy(train, np.zeros((2, 2))))


# ------------------------------------------------------------- trace_stats


def _two_layer_trace(layer0: list[int], layer1: list[int], experts: int = 4, **kw) -> Trace:
    topk = np.stack([layer0, layer1], axis=1).astype(np.int16)[:, :, None]
    return Trace(topk=topk, num_experts=experts, **kw)


def test_trace_stats_hand_example_tokens() -> None:
    # next = current + 2; tokens 4 and 9 are held out (every 5th token)
    layer0 = [t % 2 for t in range(10)]
    stats = trace_stats(_two_layer_trace(layer0, [e + 2 for e in layer0]))
    row = stats.layers.iloc[0]
    assert stats.kind == "per-token"
    assert row["layer"] == 0 and row["next_layer"] == 1
    assert row["entropy_bits"] == 0.0
    assert row["predictability"] == 1.0
    # training next-layer counts tie (4 x expert 2, 4 x expert 3): guess expert 2, right for token 4 only
    assert row["popularity_guess"] == 0.5
    assert row["hottest_share"] == 0.5
    s = stats.summary
    assert s["tokens"] == 10 and s["sequences"] is None and s["top_k"] == 1
    assert s["layers"] == 2 and s["experts"] == 4 and s["entropy_max_bits"] == 2.0
    assert s["predictability_mean"] == 1.0
    assert "token" in s["predictability_method"]
    assert math.isnan(stats.layers.iloc[1]["predictability"])


def test_trace_stats_holds_out_whole_sequences() -> None:
    # 10 sequences of 2 tokens; sequences 4 and 9 (tokens 8, 9, 18, 19) are held out and
    # follow the opposite successor map, so held-out predictability is exactly 0.
    layer0 = [t % 2 for t in range(20)]
    held = {8, 9, 18, 19}
    layer1 = [(3 - e) if t in held else (e + 2) for t, e in enumerate(layer0)]
    seq_id = np.repeat(np.arange(10, dtype=np.int32) * 3, 2)
    stats = trace_stats(_two_layer_trace(layer0, layer1, seq_id=seq_id))
    assert stats.layers.iloc[0]["predictability"] == 0.0
    assert stats.summary["sequences"] == 10
    assert "sequence" in stats.summary["predictability_method"]
    # the same tokens without sequences: tokens 4, 9, 14, 19 held out instead
    no_seq = trace_stats(_two_layer_trace(layer0, layer1))
    assert no_seq.layers.iloc[0]["predictability"] == pytest.approx(2 / 4)


def test_trace_stats_alpha_columns() -> None:
    """alpha fits all ranks; alpha_top1 only rank-1 choices."""
    rng = np.random.default_rng(0)
    first = rng.choice(8, size=4000, p=expected_counts(1.5, 8, 1.0))
    second = (first + 1 + rng.integers(0, 7, size=4000)) % 8
    topk = np.stack([first, second], axis=1)[:, None, :].astype(np.int16)
    stats = trace_stats(Trace(topk=topk, num_experts=8))
    row = stats.layers.iloc[0]
    top1 = np.bincount(first, minlength=8)
    both = top1 + np.bincount(second, minlength=8)
    assert row["alpha_top1"] == pytest.approx(fit_zipf_alpha(top1))
    assert row["alpha"] == pytest.approx(fit_zipf_alpha(both))
    assert row["hottest_share"] == pytest.approx(both.max() / both.sum())
    assert row["alpha"] < row["alpha_top1"]


def test_to_dict_is_json_ready() -> None:
    layer0 = [t % 2 for t in range(10)]
    d = trace_stats(_two_layer_trace(layer0, layer0)).to_dict()
    text = json.dumps(d, allow_nan=False)  # NaN of the last layer became None
    back = json.loads(text)
    assert back["layers"][1]["predictability"] is None
    assert back["layers"][1]["next_layer"] is None
    assert back["kind"] == "per-token"


# --------------------------------------------------------- aggregate stats


def test_aggregate_leave_one_domain_out() -> None:
    a = np.array([[[3, 1], [0, 2]]])
    b = np.array([[[0, 2], [2, 0]]])
    agg = AggregateTrace(
        counts=np.array([[8, 2], [7, 3]]),
        layer_ids=np.array([0, 7]),
        transitions=a + b,
        domains={"a": {"transitions": a}, "b": {"transitions": b}},
    )
    stats = aggregate_stats(agg)
    row = stats.layers.iloc[0]
    # test a, train b: predicts 0->1, 1->0: 1 hit of 6; popular (tie) 0: 3 of 6
    # test b, train a: predicts 0->0, 1->1: 0 of 4;  popular (tie) 0: 2 of 4
    assert row["predictability"] == pytest.approx(1 / 10)
    assert row["popularity_guess"] == pytest.approx(5 / 10)
    assert row["layer"] == 0 and row["next_layer"] == 7
    assert row["entropy_bits"] == pytest.approx(conditional_entropy_bits(a[0] + b[0]))
    assert stats.kind == "aggregate"
    assert "2 domains" in stats.summary["predictability_method"]
    assert stats.summary["alpha_top1_mean"] is None  # no counts_top1


def test_aggregate_in_sample_and_counts_only() -> None:
    trans = np.array([[[3, 1], [0, 2]]])
    stats = aggregate_stats(
        AggregateTrace(counts=np.array([[4, 2], [3, 3]]), layer_ids=np.array([1, 3]), transitions=trans)
    )
    assert stats.layers.iloc[0]["predictability"] == pytest.approx(5 / 6)
    assert "in-sample" in stats.summary["predictability_method"]
    counts_only = aggregate_stats(
        AggregateTrace(counts=np.array([[4, 2], [3, 3]]), layer_ids=np.array([1, 3]))
    )
    assert counts_only.summary["predictability_mean"] is None
    assert counts_only.summary["entropy_bits_mean"] is None
    assert counts_only.summary["alpha_mean"] == pytest.approx(
        np.mean([fit_zipf_alpha([4, 2]), fit_zipf_alpha([3, 3])])
    )


# ------------------------------------------------------------ window alpha


def test_window_alpha_matches_direct_fit() -> None:
    rng = np.random.default_rng(1)
    experts = rng.integers(0, 6, size=(6, 5, 2, 1)).astype(np.int16)  # [batches, slots, layers, k]
    result = window_alpha(experts, 6, 3)
    fits = [
        fit_zipf_alpha(np.bincount(experts[w : w + 3, :, layer, 0].ravel(), minlength=6))
        for w in (0, 3)
        for layer in range(2)
    ]
    assert result["alpha_window_mean"] == pytest.approx(np.mean(fits))
    assert result["alpha_top1_window_mean"] == pytest.approx(np.mean(fits))
    assert window_alpha(experts, 6, 7) == {"alpha_window_mean": None, "alpha_top1_window_mean": None}


def test_to_dict_next_layer_is_an_integer() -> None:
    layer0 = [t % 2 for t in range(10)]
    rows = trace_stats(_two_layer_trace(layer0, layer0)).to_dict()["layers"]
    assert rows[0]["next_layer"] == 1
    assert isinstance(rows[0]["next_layer"], int)


def test_aggregate_layer_without_selections_is_rejected() -> None:
    with pytest.raises(InputError, match="layer 1 has no selections"):
        AggregateTrace(counts=np.array([[1, 2, 3, 4], [0, 0, 0, 0]]), layer_ids=np.array([0, 1]))
