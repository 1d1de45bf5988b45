"""The EPLB port against DeepSeek's own outputs (../shared/eplb-reference, 12 recorded calls).

Upstream sorts ties in an order of its own, so where loads tie two equal
items may sit on each other's GPUs; everything a placement is judged by must
be the same: the replica counts, every GPU's planned load, the load of each
replica on each GPU, and (on the small hand-checkable cases) the arrays
themselves. Needs no torch.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import TRACES

from comoe_opt.balancers.engines.vllm_default import vllm_default
from comoe_opt.balancers.eplb import balanced_packing, deepseek_eplb, log2phy_of, replicate, slot_ranks
from comoe_opt.balancers.maps import maps_of

REFERENCE = TRACES.parent / "eplb-reference"
CASES = json.loads((REFERENCE / "cases.json").read_text()) if (REFERENCE / "cases.json").exists() else []
ARGS = ("num_replicas", "num_groups", "num_nodes", "num_gpus")


def _load(name: str) -> dict[str, np.ndarray]:
    with np.load(REFERENCE / f"{name}.npz") as data:
        return {k: data[k] for k in data.files}


def _gpu_loads(weight: np.ndarray, phy2log: np.ndarray, logcnt: np.ndarray, gpus: int) -> np.ndarray:
    """[layers, gpus, slots per gpu] planned load of each slot (float32 as upstream)."""
    share = weight.astype(np.float32) / logcnt.astype(np.float32)
    return np.take_along_axis(share, phy2log.astype(np.int64), axis=1).reshape(weight.shape[0], gpus, -1)


@pytest.mark.skipif(not CASES, reason="../shared/eplb-reference is not present")
@pytest.mark.parametrize("case", [c["case"] for c in CASES])
def test_port_reproduces_upstream(case):
    ref = _load(case)
    args = [int(ref[k]) for k in ARGS]
    phy2log, log2phy, logcnt = deepseek_eplb(ref["weight"], *args)
    assert np.array_equal(logcnt, ref["logcnt"])
    assert phy2log.shape == ref["phy2log"].shape and log2phy.shape == ref["log2phy"].shape
    ours = _gpu_loads(ref["weight"], phy2log, logcnt, args[3])
    theirs = _gpu_loads(ref["weight"], ref["phy2log"], ref["logcnt"], args[3])
    assert np.allclose(ours.sum(axis=2), theirs.sum(axis=2), rtol=1e-6)  # every GPU, every layer
    assert np.allclose(np.sort(ours, axis=2), np.sort(theirs, axis=2), rtol=1e-6)
    # log2phy is the inverse of phy2log
    layers, experts, _ = log2phy.shape
    for layer in range(layers):
        for e in range(experts):
            slots = log2phy[layer, e][log2phy[layer, e] >= 0]
            assert len(slots) == logcnt[layer, e]
            assert np.all(phy2log[layer, slots] == e)
    if case.startswith("small"):
        assert np.array_equal(phy2log, ref["phy2log"])
        assert np.array_equal(log2phy, ref["log2phy"])


@pytest.mark.skipif(not CASES, reason="../shared/eplb-reference is not present")
def test_upstream_places_two_copies_of_one_expert_on_one_gpu_and_so_does_the_port():
    ref = _load("gptoss_w10_r48_g1_n1_gpu8")
    phy2log, _, _ = deepseek_eplb(ref["weight"], *[int(ref[k]) for k in ARGS])
    per_gpu = phy2log.reshape(phy2log.shape[0], 8, -1)
    duplicates = sum(len(g) - len(set(g.tolist())) for layer in per_gpu for g in layer)
    upstream = ref["phy2log"].reshape(per_gpu.shape)
    expected = sum(len(g) - len(set(g.tolist())) for layer in upstream for g in layer)
    assert expected > 0 and duplicates == expected


def test_replication_by_hand():
    phy2log, rank, count = replicate(np.array([[9.0, 3.0, 1.0]], dtype=np.float32), 5)
    # 9 -> 4.5 (second replica), then 4.5 > 3 -> third replica of expert 0
    assert phy2log.tolist() == [[0, 1, 2, 0, 0]]
    assert rank.tolist() == [[0, 0, 0, 1, 2]]
    assert count.tolist() == [[3, 1, 1]]


def test_balanced_packing_by_hand():
    pack, rank = balanced_packing(np.array([[5.0, 4.0, 3.0, 2.0]], dtype=np.float32), 2)
    # 5 -> pack 0, 4 -> pack 1, 3 -> pack 1 (4 < 5), 2 -> pack 0
    assert pack.tolist() == [[0, 1, 1, 0]] and rank.tolist() == [[0, 0, 1, 1]]


@pytest.mark.parametrize(
    "args, message",
    [((10, 1, 1, 4), "multiple of num_gpus"), ((8, 3, 1, 4), "split evenly"), ((3, 1, 1, 1), "at least")],
)
def test_upstream_requirements_are_refused(args, message):
    with pytest.raises(ValueError, match=message):
        deepseek_eplb(np.ones((1, 4)), *args)


@pytest.mark.parametrize("port", [deepseek_eplb, vllm_default])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_loads_are_refused(port, bad):
    with pytest.raises(ValueError, match="finite"):
        port(np.array([[1.0, bad, 2.0, 3.0]]), 4, 1, 1, 2)


def test_log2phy_by_hand():
    phy2log = np.array([[1, 0, 1, 2, 1]])
    assert slot_ranks(phy2log).tolist() == [[0, 0, 1, 0, 2]]
    # in slot order (the engines' maps): expert 1 on slots 0, 2, 4
    assert maps_of(phy2log, 3)[1].tolist() == [[[1, -1, -1], [0, 2, 4], [3, -1, -1]]]
    # in an order of replicas of its own (EPLB's creation order): slot 0 holds expert 1's third
    assert log2phy_of(phy2log, np.array([[2, 0, 0, 0, 1]]), 3).tolist() == [
        [[1, -1, -1], [2, 4, 0], [3, -1, -1]]
    ]
