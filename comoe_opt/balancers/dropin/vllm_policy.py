"""The drop-in as a vLLM EPLB policy: `CoMoEEplbPolicy`, a subclass of vLLM's `AbstractEplbPolicy`.

vLLM's policy package (`vllm/distributed/eplb/policy/`) keeps one abstract classmethod,
`rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_ranks,
old_global_expert_indices=None) -> (physical_to_logical_map, logical_to_physical_map,
expert_count)`, and a registry of policies by name. This module subclasses it, so it imports only
where vLLM is installed (elsewhere: an ImportError naming vLLM); register the class under a name in
your vLLM's policy registry and select it in the EPLB config. The map in service
(`old_global_expert_indices`) is the drop-in's `previous`: experts that stay keep their slot, and
the moves are priced. `dispatch` is vLLM's even split; set `timing` (a `LayerTime` of your GPUs) in
a subclass to plan for modelled layer time (docs/api.md, "Planning for time").
tests/test_dropin_vllm_policy.py checks the class against a stand-in of vLLM's base.
"""

from __future__ import annotations

from typing import Any, Literal

try:
    from vllm.distributed.eplb.policy.abstract import AbstractEplbPolicy
except ImportError as missing:  # pragma: no cover - depends on the environment
    raise ImportError(
        "comoe_opt.balancers.dropin.vllm_policy subclasses vLLM's AbstractEplbPolicy: install vLLM,"
        " or call comoe_opt.rebalance_experts directly"
    ) from missing

from comoe_opt.balancers.dropin.rebalance import rebalance_experts
from comoe_opt.costs import LayerTime


class CoMoEEplbPolicy(AbstractEplbPolicy):  # type: ignore[misc]  # vLLM has no type stubs here
    """CoMoE's drop-in `rebalance_experts` behind vLLM's policy interface (vLLM's even split)."""

    dispatch: Literal["even", "lp"] = "even"
    timing: LayerTime | None = None  # the GPUs' rates: plan for modelled time (None: token balance)

    @classmethod
    def rebalance_experts(
        cls,
        weight: Any,
        num_replicas: int,
        num_groups: int,
        num_nodes: int,
        num_ranks: int,
        old_global_expert_indices: Any = None,
    ) -> tuple[Any, Any, Any]:
        phy2log, log2phy, logcnt = rebalance_experts(
            weight,
            num_replicas,
            num_groups,
            num_nodes,
            num_ranks,
            dispatch=cls.dispatch,
            previous=old_global_expert_indices,
            timing=cls.timing,
        )
        return phy2log, log2phy, logcnt
