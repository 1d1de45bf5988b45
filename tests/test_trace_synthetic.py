"""Zipf–Markov generator: determinism, valid ids, recovered skew, predictability, successor maps."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import comoe_opt.trace.synthetic as synthetic
from comoe_opt.instance import ModelShape, SyntheticTrace
from comoe_opt.stats import trace_stats
from comoe_opt.trace import Trace, generate
from comoe_opt.trace.synthetic import interval_coupling, successor_matrix, successors_between, zipf_weights


def model(layers: int = 3, experts: int = 8, k: int = 2) -> ModelShape:
    return ModelShape(layers, experts, k, 1.0, 16, 2.0)


def spec(
    alpha: float = 1.1,
    rho: float = 0.65,
    drift_every: int = 1000,
    tokens_per_batch: int = 16,
    micro_batches: int = 10,
    seed: int = 0,
    successor_weight: float = 0.75,
) -> SyntheticTrace:
    return SyntheticTrace(
        "synthetic", alpha, rho, drift_every, tokens_per_batch, micro_batches, seed, successor_weight
    )


# ------------------------------------------------------------- determinism


def test_same_seed_same_trace() -> None:
    a = generate(model(4, 16, 3), spec(drift_every=3, seed=42))
    b = generate(model(4, 16, 3), spec(drift_every=3, seed=42))
    assert np.array_equal(a.topk, b.topk)
    assert a.topk.dtype == b.topk.dtype
    assert a.meta == b.meta


def test_different_seed_different_trace() -> None:
    a = generate(model(4, 16, 3), spec(seed=1))
    b = generate(model(4, 16, 3), spec(seed=2))
    assert a.topk.shape == b.topk.shape
    assert not np.array_equal(a.topk, b.topk)


def test_phase_prefix_is_stable() -> None:
    """Phase p is seeded from (seed, p): a longer trace starts with the shorter one."""
    short = generate(model(), spec(drift_every=4, micro_batches=4))
    long = generate(model(), spec(drift_every=4, micro_batches=10))
    assert np.array_equal(long.topk[: short.tokens], short.topk)


def test_drift_moves_the_hot_set() -> None:
    """With strong skew the hottest rank-1 expert of each layer differs between phases."""
    trace = generate(model(4, 16, 1), spec(alpha=3.0, rho=0.0, drift_every=50, micro_batches=100))
    half = trace.tokens // 2
    hottest = [
        [np.bincount(part[:, layer, 0], minlength=16).argmax() for layer in range(4)]
        for part in (trace.topk[:half], trace.topk[half:])
    ]
    assert hottest[0] != hottest[1]


def test_meta_records_generator_parameters() -> None:
    trace = generate(model(), spec(seed=7, rho=0.3))
    assert trace.meta["generator"] == "zipf-markov"
    assert trace.meta["seed"] == 7 and trace.meta["rho"] == 0.3
    assert trace.seq_id is None and trace.probs is None
    assert np.array_equal(trace.layer_ids, [0, 1, 2])


# ---------------------------------------------------------- valid top-k ids


@st.composite
def generator_cases(draw: st.DrawFn) -> tuple[ModelShape, SyntheticTrace]:
    experts = draw(st.integers(2, 16))
    m = model(draw(st.integers(1, 4)), experts, draw(st.integers(1, min(4, experts))))
    s = spec(
        alpha=draw(st.floats(0, 3)),
        rho=draw(st.one_of(st.just(1.0), st.just(0.0), st.floats(0, 1))),
        drift_every=draw(st.integers(1, 4)),
        tokens_per_batch=draw(st.integers(1, 8)),
        micro_batches=draw(st.integers(1, 6)),
        seed=draw(st.integers(0, 2**32)),
        successor_weight=draw(st.one_of(st.just(1.0), st.floats(0, 1))),
    )
    return m, s


@given(generator_cases())
def test_generated_ids_valid_and_deterministic(case: tuple[ModelShape, SyntheticTrace]) -> None:
    m, s = case
    trace = generate(m, s)
    assert isinstance(trace, Trace)
    assert trace.topk.shape == (s.micro_batches * s.tokens_per_batch, m.layers, m.top_k)
    assert np.issubdtype(trace.topk.dtype, np.integer)
    assert trace.num_experts == m.experts_per_layer
    assert trace.topk.min() >= 0 and trace.topk.max() < m.experts_per_layer
    ordered = np.sort(trace.topk, axis=2)
    assert not (ordered[:, :, 1:] == ordered[:, :, :-1]).any()
    assert np.array_equal(generate(m, s).topk, trace.topk)


def test_top_k_equal_to_experts_is_a_permutation() -> None:
    trace = generate(model(3, 4, 4), spec(rho=1.0, successor_weight=1.0))
    assert (np.sort(trace.topk, axis=2) == np.arange(4)).all()


# ------------------------------------------------------------- statistics


@pytest.mark.parametrize("alpha", [0.5, 1.1, 2.0])
def test_alpha_round_trip(alpha: float) -> None:
    """One phase at the paper's shape: the fitted rank-1 Zipf exponent is the generator's α."""
    trace = generate(
        model(8, 64, 2), spec(alpha=alpha, drift_every=200, tokens_per_batch=64, micro_batches=200)
    )
    fitted = trace_stats(trace).layers["alpha_top1"].mean()
    assert abs(fitted - alpha) <= 0.05, fitted


def test_predictability_increases_with_rho() -> None:
    values = []
    for rho in (0.1, 0.5, 0.9):
        trace = generate(
            model(4, 64, 2), spec(rho=rho, drift_every=100, tokens_per_batch=64, micro_batches=100)
        )
        values.append(trace_stats(trace).summary["predictability_mean"])
    assert values[0] < values[1] < values[2], values


def test_successors_beat_popularity_only_when_rho_positive() -> None:
    m, kw = model(4, 64, 2), {"drift_every": 100, "tokens_per_batch": 64, "micro_batches": 100}
    follow = trace_stats(generate(m, spec(rho=0.9, **kw))).summary
    assert follow["predictability_mean"] > 2 * follow["popularity_guess_mean"]
    independent = trace_stats(generate(m, spec(rho=0.0, **kw))).summary
    assert abs(independent["predictability_mean"] - independent["popularity_guess_mean"]) < 0.05


# --------------------------------------------------------- successor maps


def test_zipf_weights() -> None:
    w = zipf_weights(1.0, 4)
    assert np.allclose(w, np.array([1, 1 / 2, 1 / 3, 1 / 4]) / (25 / 12))
    assert np.allclose(zipf_weights(0.0, 5), 0.2)
    w = zipf_weights(2.0, 10)
    assert w.sum() == pytest.approx(1.0) and w[0] / w[1] == pytest.approx(4.0)


def test_interval_coupling_hand_example() -> None:
    joint = interval_coupling(np.array([0.5, 0.5]), np.array([0.25, 0.75]))
    assert np.allclose(joint, [[0.25, 0.25], [0.0, 0.5]])
    joint = interval_coupling(np.array([0.2, 0.3, 0.5]), np.array([0.5, 0.5]))
    assert np.allclose(joint, [[0.2, 0.0], [0.3, 0.0], [0.0, 0.5]])


masses = st.lists(st.floats(0.01, 10.0), min_size=1, max_size=12).map(lambda v: np.array(v) / sum(v))


@given(masses, masses)
def test_interval_coupling_marginals(a: np.ndarray, b: np.ndarray) -> None:
    joint = interval_coupling(a, b)
    assert joint.shape == (a.size, b.size)
    assert (joint >= 0).all()
    assert np.allclose(joint.sum(axis=1), a, atol=1e-12)
    assert np.allclose(joint.sum(axis=0), b, atol=1e-12)


def _pop(z: np.ndarray, perm: np.ndarray) -> np.ndarray:
    pop = np.empty_like(z)
    pop[perm] = z
    return pop


@given(
    experts=st.integers(2, 32),
    alpha=st.floats(0, 3),
    weight=st.one_of(st.just(0.0), st.just(1.0), st.floats(0, 1)),
    seed=st.integers(0, 2**32),
)
def test_successor_matrix_preserves_popularity(experts: int, alpha: float, weight: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    z = zipf_weights(alpha, experts)
    perm_from, perm_to = rng.permutation(experts), rng.permutation(experts)
    m = successor_matrix(z, perm_from, perm_to, weight, rng)
    assert m.shape == (experts, experts)
    assert (m >= 0).all()
    assert np.allclose(m.sum(axis=1), 1.0, atol=1e-12)
    assert np.allclose(_pop(z, perm_from) @ m, _pop(z, perm_to), atol=1e-12)
    # the preferred successor keeps the popularity rank: weight on (perm_from[r], perm_to[r])
    assert (m[perm_from, perm_to] >= weight - 1e-12).all()


def test_successor_matrix_identity_in_rank_space() -> None:
    rng = np.random.default_rng(0)
    z = zipf_weights(1.1, 5)
    perm_from, perm_to = np.array([4, 0, 3, 1, 2]), np.array([1, 2, 0, 4, 3])
    m = successor_matrix(z, perm_from, perm_to, 1.0, rng)
    expected = np.zeros((5, 5))
    expected[perm_from, perm_to] = 1.0
    assert np.array_equal(m, expected)


def test_rho_one_follows_preferred_successor(monkeypatch: pytest.MonkeyPatch) -> None:
    """rho = 1, successor_weight = 1: each rank-1 choice is the previous one's preferred successor."""
    recorded: list[np.ndarray] = []

    def spy(*args, **kwargs):
        matrix = successors_between(*args, **kwargs)
        recorded.append(matrix)
        return matrix

    monkeypatch.setattr(synthetic, "successors_between", spy)
    layers, tpb, drift, batches = 4, 8, 3, 7  # phases of 3, 3 and 1 micro-batches
    trace = generate(
        model(layers, 16, 3),
        spec(rho=1.0, successor_weight=1.0, drift_every=drift, tokens_per_batch=tpb, micro_batches=batches),
    )
    phases = [3, 3, 1]
    assert len(recorded) == len(phases) * (layers - 1)
    start = 0
    for phase, size in enumerate(phases):
        stop = start + size * tpb
        for layer in range(layers - 1):
            matrix = recorded[phase * (layers - 1) + layer]
            assert np.array_equal(matrix.max(axis=1), np.ones(16))  # one-hot rows
            preferred = matrix.argmax(axis=1)
            block = trace.topk[start:stop]
            assert np.array_equal(block[:, layer + 1, 0], preferred[block[:, layer, 0]])
        start = stop
    assert start == trace.tokens


# ------------------------------------------------ regimes: topics, requests, degenerate layers


def regime(**keys: object) -> SyntheticTrace:
    import dataclasses

    if "alpha" in keys:
        keys["zipf_alpha"] = keys.pop("alpha")
    return dataclasses.replace(spec(micro_batches=40, tokens_per_batch=32), **keys)


def test_degenerate_layer_sends_its_share_to_one_expert() -> None:
    trace = generate(model(3, 32, 1), regime(alpha=0.5, degenerate_layer=1, degenerate_share=0.999))
    shares = [np.bincount(trace.topk[:, layer, 0], minlength=32).max() / trace.tokens for layer in range(3)]
    assert shares[1] > 0.99  # 1,280 draws at 0.999 (plus the Zipf rest's share of that expert)
    assert shares[0] < 0.5 and shares[2] < 0.5  # the layers around it keep their own Zipf(0.5)


def test_layer_alphas_spread_over_the_range() -> None:
    alphas = synthetic.layer_alphas(regime(alpha=0.7, zipf_alpha_max=1.3), 4)
    assert np.allclose(np.sort(alphas), [0.7, 0.9, 1.1, 1.3])
    assert np.allclose(synthetic.layer_alphas(regime(alpha=0.7), 3), 0.7)


def test_per_layer_alpha_recovered() -> None:
    trace = generate(model(2, 16, 1), regime(alpha=0.4, zipf_alpha_max=2.0, micro_batches=400))
    fitted = trace_stats(trace).layers["alpha_top1"].to_numpy()
    assert np.allclose(np.sort(fitted), [0.4, 2.0], atol=0.1)


def test_topics_have_their_own_hot_experts() -> None:
    """Two topics in turn, each its own popularity: layer 0's hottest expert differs between them."""
    keys = {"alpha": 3.0, "rho": 0.0, "sequence_tokens": 20, "topics": 2, "requests_per_topic": 1}
    trace = generate(model(2, 16, 1), regime(**keys, batching="token-order"))
    topic = np.asarray(trace.seq_id) % 2  # requests alternate topics
    hottest = [np.bincount(trace.topk[topic == t, 0, 0], minlength=16).argmax() for t in (0, 1)]
    assert hottest[0] != hottest[1]


def test_topic_shift_zero_is_one_popularity() -> None:
    keys = {"alpha": 3.0, "rho": 0.0, "sequence_tokens": 20, "topics": 2, "topic_shift": 0.0}
    trace = generate(model(2, 16, 1), regime(**keys))
    topic = np.asarray(trace.seq_id) % 2
    hottest = [np.bincount(trace.topk[topic == t, 0, 0], minlength=16).argmax() for t in (0, 1)]
    assert hottest[0] == hottest[1]


def test_requests_batch_as_the_spec_says() -> None:
    """Decode steps hold one token of each request in flight; token order keeps a prompt together."""
    from comoe_opt.trace.batching import make_batches

    for batching in ("decode", "token-order"):
        trace = generate(model(), regime(sequence_tokens=10, batching=batching))
        assert trace.seq_id is not None and trace.pos is not None
        batches = make_batches(trace, 32, batching, 40)
        assert batches.batches == 40  # enough tokens generated for every micro-batch
        seqs = trace.seq_id[batches.token_index]
        if batching == "decode":
            assert all(np.unique(row).size == 32 for row in seqs)
        else:
            assert np.array_equal(batches.token_index.ravel(), np.arange(40 * 32))


def test_lower_ranks_flatter_than_rank_one() -> None:
    trace = generate(model(2, 32, 4), regime(alpha=1.5, lower_ranks_alpha=0.0, micro_batches=100))
    stats = trace_stats(trace).layers
    assert (stats["alpha_top1"] > 1.3).all()
    assert (stats["alpha"] < 0.8).all()  # ranks 2-4 uniform over the other 31
    sorted_ids = np.sort(trace.topk, axis=2)
    assert not (sorted_ids[:, :, 1:] == sorted_ids[:, :, :-1]).any()


def test_topics_need_requests() -> None:
    from comoe_opt.errors import InputError
    from comoe_opt.instance import check_synthetic

    with pytest.raises(InputError, match=r"trace\.topics"):
        check_synthetic(model(), regime(topics=3), "x.toml")
    with pytest.raises(InputError, match=r"trace\.degenerate_layer"):
        check_synthetic(model(3), regime(degenerate_layer=3), "x.toml")
    with pytest.raises(InputError, match=r"trace\.zipf_alpha_max"):
        check_synthetic(model(), regime(alpha=1.0, zipf_alpha_max=0.5), "x.toml")


@given(
    st.integers(2, 12),
    st.floats(0.0, 1.0),
    st.integers(0, 2**32 - 1),
)
def test_successors_between_keep_any_marginals(n: int, weight: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    a, b = rng.dirichlet(np.ones(n)), rng.dirichlet(np.ones(n))
    m = successors_between(a, b, np.argsort(-a), np.argsort(-b), weight, rng)
    assert np.allclose(m.sum(axis=1), 1.0)
    assert np.allclose(a @ m, b)
    assert (m >= -1e-12).all()
