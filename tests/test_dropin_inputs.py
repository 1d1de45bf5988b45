"""`comoe_opt.rebalance_experts` on what engines pass it: bf16/fp16 loads plan as the same values in
float32, and every bad argument is a one-line `ValueError` (and `ComoeError`) naming it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import comoe_opt
from comoe_opt.balancers.dropin.rebalance import ArgumentError
from comoe_opt.errors import ComoeError

ARGS = (16, 2, 1, 4)  # num_replicas, num_groups, num_nodes, num_gpus for 2 x 12 weights


def _weights(seed: int, layers: int = 2, experts: int = 12) -> np.ndarray:
    """Loads exactly representable in fp16 and bf16: 8 significant bits times a power of two."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(layers, experts)) * 2.0 ** rng.integers(0, 6, size=(layers, experts))


def _same(a: tuple, b: tuple) -> bool:
    return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("method", ["eplb", "comoe"])
def test_numpy_float16_plans_as_float32(method):
    weight = _weights(1)
    half = comoe_opt.rebalance_experts(weight.astype(np.float16), *ARGS, method=method, moves=100)
    single = comoe_opt.rebalance_experts(weight.astype(np.float32), *ARGS, method=method, moves=100)
    assert _same(half, single)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), method=st.sampled_from(["eplb", "comoe"]))
def test_torch_bf16_and_fp16_plan_as_float32(seed, method):
    torch = pytest.importorskip("torch")
    weight = torch.from_numpy(_weights(seed, layers=3))
    want = comoe_opt.rebalance_experts(weight.float(), *ARGS, method=method, moves=60)
    for dtype in (torch.bfloat16, torch.float16):
        assert weight.to(dtype).double().equal(weight)  # the loads are exact in this dtype
        got = comoe_opt.rebalance_experts(weight.to(dtype), *ARGS, method=method, moves=60)
        assert all(isinstance(a, torch.Tensor) for a in got)
        assert _same(got, want)


def test_torch_bf16_history():
    torch = pytest.importorskip("torch")
    steps = torch.from_numpy(np.stack([_weights(s) for s in range(5)]))
    weight = steps.sum(dim=0)
    want = comoe_opt.rebalance_experts(weight.float(), *ARGS, history=steps.float(), moves=80)
    got = comoe_opt.rebalance_experts(weight.float(), *ARGS, history=steps.to(torch.bfloat16), moves=80)
    assert _same(got, want)


def test_integer_and_list_weights_plan_as_float():
    weight = _weights(2).astype(np.int64)
    want = comoe_opt.rebalance_experts(weight.astype(np.float64), *ARGS, method="eplb")
    assert _same(comoe_opt.rebalance_experts(weight, *ARGS, method="eplb"), want)
    assert _same(comoe_opt.rebalance_experts(weight.tolist(), *ARGS, method="eplb"), want)


def test_numpy_integer_counts_are_accepted():
    got = comoe_opt.rebalance_experts(_weights(3), np.int64(16), np.int32(2), 1, np.uint8(4), method="eplb")
    assert _same(got, comoe_opt.rebalance_experts(_weights(3), *ARGS, method="eplb"))


GOOD = {"num_replicas": 16, "num_groups": 2, "num_nodes": 1, "num_gpus": 4}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_gpus": 4.0}, r"num_gpus must be an integer, got 4\.0"),
        ({"num_gpus": 0}, "num_gpus must be at least 1, got 0"),
        ({"num_gpus": -4}, "num_gpus must be at least 1"),
        ({"num_gpus": True}, "num_gpus must be an integer"),
        ({"num_groups": "2"}, "num_groups must be an integer, got '2'"),
        ({"num_nodes": 0}, "num_nodes must be at least 1"),
        ({"num_replicas": 0}, "num_replicas must be at least 1"),
        ({"num_replicas": 16.5}, "num_replicas must be an integer"),
        ({"num_replicas": 10**12}, r"num_replicas must be at most 8,192, got 1,000,000,000,000"),
        ({"num_replicas": 2**24, "num_gpus": 1}, r"num_replicas must be at most 8,192"),
        ({"num_gpus": 2048, "num_replicas": 4096}, r"num_gpus must be at most 1,024"),
        ({"num_replicas": 18}, r"num_replicas \(18\) must be a multiple of num_gpus \(4\)"),
        ({"num_replicas": 8}, r"must be at least the experts \(12\)"),
        ({"num_groups": 5}, r"must split evenly into num_groups \(5\)"),
        ({"moves": -5}, "moves must be at least 0, got -5"),
        ({"moves": 10**9}, "moves must be at most 1,000,000"),
        ({"moves": 1.5}, "moves must be an integer"),
        ({"seed": -1}, "seed must be at least 0"),
        ({"method": "EPLB"}, "method must be one of comoe, eplb"),
    ],
)
def test_bad_counts_name_the_argument(change, message):
    kwargs = {**GOOD, **change}
    with pytest.raises(ArgumentError, match=message) as caught:
        comoe_opt.rebalance_experts(_weights(0), **kwargs)
    _one_line_value_error(caught.value)


def _bad_weight(value: float) -> np.ndarray:
    weight = _weights(0)
    weight[1, 3] = value
    return weight


@pytest.mark.parametrize(
    ("weight", "message"),
    [
        (_bad_weight(-1.0), r"weight\[1\]\[3\] must be finite, non-negative .*got -1\.0"),
        (_bad_weight(np.nan), r"weight\[1\]\[3\] must be finite"),
        (_bad_weight(np.inf), r"weight\[1\]\[3\] must be finite"),
        (_bad_weight(1e39), r"weight\[1\]\[3\] .*at most 1e\+15"),  # float32's overflow
        (np.ones(12), r"weight must be \[layers, experts\], got shape \(12,\)"),
        (np.ones((2, 3, 12)), r"weight must be \[layers, experts\]"),
        (np.ones((0, 12)), r"weight must be \[layers, experts\], got shape \(0, 12\)"),
        (np.ones((2, 12), dtype=bool), "weight must hold real numbers, got dtype bool"),
        (np.ones((2, 12), dtype=complex), "weight must hold real numbers, got dtype complex128"),
        ([[1.0] * 12, [1.0] * 11], "weight must be a numeric array"),
        ([["a"] * 12] * 2, "weight must hold real numbers"),
    ],
)
def test_bad_weights_name_the_argument(weight, message):
    with pytest.raises(ArgumentError, match=message) as caught:
        comoe_opt.rebalance_experts(weight, **GOOD)
    _one_line_value_error(caught.value)


@pytest.mark.parametrize("method", ["eplb", "comoe"])
@pytest.mark.parametrize(
    ("history", "message"),
    [
        (-np.ones((3, 2, 12)), r"history\[0\]\[0\]\[0\] must be finite, non-negative"),
        (np.full((3, 2, 12), np.nan), r"history\[0\]\[0\]\[0\] must be finite"),
        (np.ones((3, 2, 11)), r"history must be \[steps, 2, 12\], got shape \(3, 2, 11\)"),
    ],
)
def test_bad_history_is_refused_by_either_method(history, message, method):
    with pytest.raises(ArgumentError, match=message):
        comoe_opt.rebalance_experts(_weights(0), **GOOD, history=history, method=method)


def test_torch_bool_and_complex_are_refused():
    torch = pytest.importorskip("torch")
    for tensor in (torch.ones(2, 12, dtype=torch.bool), torch.ones(2, 12, dtype=torch.complex64)):
        with pytest.raises(ArgumentError, match="weight must hold real numbers, got dtype torch"):
            comoe_opt.rebalance_experts(tensor, **GOOD)


def _one_line_value_error(exc: BaseException) -> None:
    assert isinstance(exc, ValueError) and isinstance(exc, ComoeError)
    assert "\n" not in str(exc) and len(str(exc)) < 200


def test_load_limit_is_the_count_files_limit():
    from comoe_opt.balancers.dropin.rebalance import MAX_LOAD
    from comoe_opt.trace.counts import MAX_COUNT

    assert MAX_LOAD == MAX_COUNT


def test_the_callers_arrays_are_not_changed():
    # float64 inputs are used without a copy: nothing may write to them
    rng = np.random.default_rng(3)
    history = rng.poisson(20.0, size=(12, 3, 16)).astype(np.float64)
    history[4] = 0.0  # an unused recorder row
    weight = history.sum(axis=0)
    kept_history, kept_weight = history.copy(), weight.copy()
    for dispatch in ("even", "lp"):
        comoe_opt.rebalance_experts(weight, 24, 2, 2, 8, history=history, dispatch=dispatch)
    assert np.array_equal(history, kept_history) and np.array_equal(weight, kept_weight)
