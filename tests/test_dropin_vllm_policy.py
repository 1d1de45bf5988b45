"""`comoe_opt.rebalance_experts` in the place of vLLM's `AbstractEplbPolicy.rebalance_experts(weight,
num_replicas, num_groups, num_nodes, num_ranks, old_global_expert_indices=None)`: that argument
order and vLLM's dtypes (int64 loads and map), the old map as `previous`."""

from __future__ import annotations

import numpy as np
import pytest

import comoe_opt


def _policy(weight, num_replicas, num_groups, num_nodes, num_ranks, old_global_expert_indices=None):
    return comoe_opt.rebalance_experts(
        weight, num_replicas, num_groups, num_nodes, num_ranks, previous=old_global_expert_indices
    )


def _inputs() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    weight = rng.poisson(rng.gamma(0.6, 60.0, size=(3, 16))).astype(np.int64)
    weight[:, 0] += 1  # every layer has load
    old = comoe_opt.rebalance_experts(weight[::-1].copy(), 24, 4, 2, 8, method="eplb")[0]
    return weight, old.astype(np.int64)


def test_vllm_argument_order_and_dtypes_numpy():
    weight, old = _inputs()
    phy2log, log2phy, logcnt = _policy(weight, 24, 4, 2, 8, old)
    assert all(a.dtype == np.int64 for a in (phy2log, log2phy, logcnt))
    assert phy2log.shape == (3, 24) and logcnt.shape == (3, 16)
    assert (logcnt >= 1).all() and (logcnt.sum(axis=1) == 24).all()
    for layer in range(3):  # on each GPU (3 slots), every expert it keeps stays in its old slot
        for gpu in range(8):
            new, was = phy2log[layer, gpu * 3 : gpu * 3 + 3], old[layer, gpu * 3 : gpu * 3 + 3]
            shared = sum(min(list(new).count(e), list(was).count(e)) for e in set(new.tolist()))
            assert int((new == was).sum()) == shared
    fresh = _policy(weight, 24, 4, 2, 8)[0]  # without an old map, as at start-up
    assert fresh.shape == (3, 24)
    assert (phy2log == old).sum() > (fresh == old).sum()  # the old map went in as `previous`
    again = _policy(weight, 24, 4, 2, 8, old_global_expert_indices=old)
    assert all(np.array_equal(a, b) for a, b in zip((phy2log, log2phy, logcnt), again, strict=True))


def test_vllm_argument_order_and_dtypes_torch():
    torch = pytest.importorskip("torch")
    weight, old = _inputs()
    out = _policy(torch.from_numpy(weight), 24, 4, 2, 8, torch.from_numpy(old))
    assert all(t.dtype == torch.int64 for t in out)
    want = _policy(weight, 24, 4, 2, 8, old)
    assert all(np.array_equal(t.numpy(), a) for t, a in zip(out, want, strict=True))


def _stand_in_vllm(monkeypatch) -> type:
    """vLLM's `vllm.distributed.eplb.policy.abstract` as its source defines it: an ABC whose one
    abstract classmethod is `rebalance_experts(weight, num_replicas, num_groups, num_nodes,
    num_ranks, old_global_expert_indices=None)`."""
    import abc
    import sys
    import types

    class AbstractEplbPolicy(abc.ABC):
        @classmethod
        @abc.abstractmethod
        def rebalance_experts(
            cls, weight, num_replicas, num_groups, num_nodes, num_ranks, old_global_expert_indices=None
        ): ...

    names = ["vllm", "vllm.distributed", "vllm.distributed.eplb", "vllm.distributed.eplb.policy"]
    for name in names:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    abstract = types.ModuleType("vllm.distributed.eplb.policy.abstract")
    abstract.AbstractEplbPolicy = AbstractEplbPolicy
    monkeypatch.setitem(sys.modules, abstract.__name__, abstract)
    monkeypatch.delitem(sys.modules, "comoe_opt.balancers.dropin.vllm_policy", raising=False)
    return AbstractEplbPolicy


def test_the_policy_class_subclasses_vllms_base_and_plans_as_the_drop_in(monkeypatch):
    import importlib

    base = _stand_in_vllm(monkeypatch)
    module = importlib.import_module("comoe_opt.balancers.dropin.vllm_policy")
    policy = module.CoMoEEplbPolicy
    assert issubclass(policy, base) and not getattr(policy, "__abstractmethods__", None)
    weight, old = _inputs()
    got = policy.rebalance_experts(weight, 24, 4, 2, 8, old_global_expert_indices=old)
    want = _policy(weight, 24, 4, 2, 8, old)
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))


def test_without_vllm_the_policy_module_says_what_to_install(monkeypatch):
    import importlib
    import sys

    monkeypatch.setitem(sys.modules, "vllm", None)  # an import of vllm fails, as where it is absent
    monkeypatch.delitem(sys.modules, "comoe_opt.balancers.dropin.vllm_policy", raising=False)
    with pytest.raises(ImportError, match="install vLLM"):
        importlib.import_module("comoe_opt.balancers.dropin.vllm_policy")


def test_a_timed_subclass_plans_for_time_as_the_drop_in(monkeypatch):
    import importlib

    from comoe_opt.costs import LayerTime

    _stand_in_vllm(monkeypatch)
    module = importlib.import_module("comoe_opt.balancers.dropin.vllm_policy")
    timing = LayerTime.of_gpus(0.5, 0.001, 0.002, 8)

    class Timed(module.CoMoEEplbPolicy):
        pass

    Timed.timing = timing
    weight, old = _inputs()
    got = Timed.rebalance_experts(weight, 24, 4, 2, 8, old_global_expert_indices=old)
    want = comoe_opt.rebalance_experts(weight, 24, 4, 2, 8, previous=old, timing=timing)
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
