"""The public API: `comoe_opt.rebalance_experts` against EPLB's conventions and planned balance on
upstream's recorded inputs, and every example of docs/api.md run as written."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
from conftest import ROOT, TRACES

import comoe_opt
from comoe_opt.balancers.dropin.rebalance import gpu_loads, planned_score
from comoe_opt.balancers.eplb import deepseek_eplb as eplb_port

REFERENCE = TRACES.parent / "eplb-reference"
CASES = json.loads((REFERENCE / "cases.json").read_text()) if (REFERENCE / "cases.json").exists() else []
ARGS = ("num_replicas", "num_groups", "num_nodes", "num_gpus")
MOVES = 300  # enough to find improvements; the property holds for any number


def _case(name: str) -> tuple[np.ndarray, list[int]]:
    with np.load(REFERENCE / f"{name}.npz") as data:
        return data["weight"].astype(np.float64), [int(data[k]) for k in ARGS]


def _node_of_slots(phy2log: np.ndarray, experts: int, nodes: int) -> list[set[int]]:
    per_node = phy2log.size // nodes
    where: list[set[int]] = [set() for _ in range(experts)]
    for slot, expert in enumerate(phy2log):
        where[expert].add(slot // per_node)
    return where


@pytest.mark.skipif(not CASES, reason="../shared/eplb-reference is not present")
@pytest.mark.parametrize("case", [c["case"] for c in CASES])
def test_default_keeps_eplbs_conventions_and_is_no_worse(case):
    weight, (replicas, groups, nodes, gpus) = _case(case)
    phy2log, log2phy, logcnt = comoe_opt.rebalance_experts(weight, replicas, groups, nodes, gpus, moves=MOVES)
    ref_phy2log = eplb_port(weight, replicas, groups, nodes, gpus)[0]
    layers, experts = weight.shape
    assert phy2log.shape == ref_phy2log.shape == (layers, replicas)
    assert logcnt.shape == (layers, experts) and log2phy.shape[:2] == (layers, experts)
    assert log2phy.shape[2] == logcnt.max()  # padded to the most replicas, as upstream
    assert (logcnt >= 1).all() and (logcnt.sum(axis=1) == replicas).all()
    hierarchical = groups % nodes == 0 and nodes > 1
    for layer in range(layers):
        for e in range(experts):
            slots = log2phy[layer, e][log2phy[layer, e] >= 0]
            assert len(slots) == logcnt[layer, e] and (phy2log[layer, slots] == e).all()
            assert list(slots) == sorted(slots) and (log2phy[layer, e][len(slots) :] == -1).all()
        ours = planned_score(phy2log[layer], weight[layer][None], gpus)
        theirs = planned_score(ref_phy2log[layer], weight[layer][None], gpus)
        assert ours <= theirs * (1 + 1e-12)  # planned balance never worse than EPLB's
        if hierarchical:  # every replica stays on the node EPLB packed its group onto
            mine = _node_of_slots(phy2log[layer], experts, nodes)
            eplbs = _node_of_slots(ref_phy2log[layer], experts, nodes)
            assert all(a <= b for a, b in zip(mine, eplbs, strict=True))


def test_eplb_method_is_the_port_and_plans_are_deterministic():
    rng = np.random.default_rng(3)
    weight = rng.gamma(0.6, 50, size=(3, 12))
    assert all(
        np.array_equal(a, b)
        for a, b in zip(
            comoe_opt.rebalance_experts(weight, 16, 4, 2, 4, method="eplb"),
            eplb_port(weight, 16, 4, 2, 4),
            strict=True,
        )
    )
    first = comoe_opt.rebalance_experts(weight, 16, 4, 2, 4, moves=200)
    again = comoe_opt.rebalance_experts(weight, 16, 4, 2, 4, moves=200)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))


def test_history_plans_are_no_worse_on_the_steps():
    rng = np.random.default_rng(1)
    steps = rng.poisson(rng.gamma(0.5, 6.0, size=(40, 2, 10)))
    weight = steps.sum(axis=0)
    ours = comoe_opt.rebalance_experts(weight, 15, 1, 1, 5, history=steps, moves=MOVES)[0]
    eplb = eplb_port(weight, 15, 1, 1, 5)[0]
    for layer in range(2):
        scenarios = steps[:, layer].astype(float)
        assert planned_score(ours[layer], scenarios, 5) <= planned_score(eplb[layer], scenarios, 5) + 1e-12
    assert gpu_loads(ours[0], weight[0].astype(float), 5).sum() == pytest.approx(weight[0].sum())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"method": "best"}, "method must be one of"),
        ({"history": np.ones((3, 2, 9))}, "history must be"),
        ({"history": -np.ones((3, 2, 10))}, "non-negative"),
        ({"dispatch": "random"}, "dispatch must be one of"),
    ],
)
def test_bad_arguments_raise_value_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        comoe_opt.rebalance_experts(np.ones((2, 10)), 15, 1, 1, 5, **kwargs)


def test_torch_tensors_in_give_tensors_out():
    torch = pytest.importorskip("torch")
    weight = torch.rand(2, 10) * 100
    phy2log, log2phy, logcnt = comoe_opt.rebalance_experts(weight, 15, 1, 1, 5, moves=50)
    assert all(isinstance(a, torch.Tensor) for a in (phy2log, log2phy, logcnt))
    assert tuple(phy2log.shape) == (2, 15)


def test_api_page_examples_run(tmp_path):
    """Every python block of docs/api.md, in order, in one namespace, from the project root."""
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 4
    namespace: dict = {}
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        for block in blocks:
            exec(compile(block, "docs/api.md", "exec"), namespace)
    finally:
        os.chdir(cwd)
