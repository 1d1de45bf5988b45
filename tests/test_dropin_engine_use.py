"""The drop-in as engines call it: torch in, torch out on the input's device, EPLB's dtypes (int64),
and several threads at once giving what serial calls give (no global state)."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import comoe_opt


def _inputs(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    steps = rng.poisson(rng.gamma(0.5, 8.0, size=(24, 3, 16))).astype(float)
    return steps.sum(axis=0), steps


def _call(seed: int, dispatch: str) -> tuple[np.ndarray, ...]:
    weight, steps = _inputs(seed)
    previous = comoe_opt.rebalance_experts(steps[:8].sum(axis=0), 20, 1, 1, 4, method="eplb")[0]
    out = comoe_opt.rebalance_experts(
        weight, 20, 1, 1, 4, history=steps, previous=previous, dispatch=dispatch, moves=400, seed=seed
    )
    return tuple(np.asarray(a) for a in out)


def test_threads_give_the_serial_results():
    jobs = [(seed, dispatch) for seed in range(4) for dispatch in ("even", "lp")]
    serial = [_call(*job) for job in jobs]
    with ThreadPoolExecutor(max_workers=4) as pool:
        threaded = list(pool.map(lambda job: _call(*job), jobs))
    for a, b in zip(serial, threaded, strict=True):
        assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(serial[0][0], serial[2][0])  # the inputs differ, and so do the plans


def _moved(previous: np.ndarray, phy2log: np.ndarray, gpus: int) -> int:
    """Replicas on a GPU beyond what `previous` had there, counted slot by slot."""
    per_gpu = phy2log.shape[1] // gpus
    count = 0
    for before, after in zip(previous, phy2log, strict=True):
        for g in range(gpus):
            held = Counter(before[g * per_gpu : (g + 1) * per_gpu].tolist())
            new = Counter(after[g * per_gpu : (g + 1) * per_gpu].tolist())
            count += sum((new - held).values())
    return count


@pytest.mark.parametrize("dispatch", ["even", "lp"])
def test_report_counts_the_experts_copied_onto_each_gpu(dispatch):
    """`report.moved` is the replicas each GPU gains over `previous`, counted here from the two
    maps, whatever `previous` is."""
    weight, steps = _inputs(1)
    previous = comoe_opt.rebalance_experts(steps[:4].sum(axis=0), 20, 1, 1, 4, method="eplb")[0]
    moved = []
    for _ in range(2):  # then from the plan just made
        phy2log, *_, report = comoe_opt.rebalance_experts(
            weight, 20, 1, 1, 4, history=steps, previous=previous, dispatch=dispatch, moves=200, explain=True
        )
        assert report.moved == _moved(previous, phy2log, gpus=4)
        moved.append(report.moved)
        previous = phy2log
    # EPLB's plan on the first four steps is far from the plan on all; the plan from its own
    # output keeps more in place (29 -> 11 even, 31 -> 0 lp)
    assert moved[0] > 0 and moved[1] < moved[0]


@pytest.mark.parametrize("method", ["comoe", "eplb"])
def test_numpy_outputs_are_int64(method):
    weight, steps = _inputs(0)
    out = comoe_opt.rebalance_experts(weight, 20, 1, 1, 4, history=steps, method=method, moves=100)
    assert all(isinstance(a, np.ndarray) and a.dtype == np.int64 for a in out)


@pytest.mark.parametrize("dispatch", ["even", "lp"])
def test_torch_in_torch_out_on_the_inputs_device(dispatch):
    torch = pytest.importorskip("torch")
    weight, steps = _inputs(1)
    previous = comoe_opt.rebalance_experts(weight, 20, 1, 1, 4, method="eplb")[0]
    got = comoe_opt.rebalance_experts(
        torch.from_numpy(weight).float(),
        20, 1, 1, 4,
        history=torch.from_numpy(steps).float(),
        previous=torch.from_numpy(previous),
        dispatch=dispatch,
        moves=200,
        explain=True,
    )  # fmt: skip
    *maps, report = got
    assert all(isinstance(a, torch.Tensor) and a.dtype == torch.int64 for a in maps)
    assert all(a.device == torch.device("cpu") for a in maps)
    assert report.dispatch == dispatch and report.moved == _moved(previous, maps[0].numpy(), gpus=4)
    want = comoe_opt.rebalance_experts(
        weight, 20, 1, 1, 4, history=steps, previous=previous, dispatch=dispatch, moves=200
    )
    assert all(
        np.array_equal(a.numpy(), b) for a, b in zip(maps, want, strict=True)
    )  # the loads are whole numbers: exact in float32
