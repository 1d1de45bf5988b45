"""Balancers with DeepSeek EPLB's signature: `(weight, num_replicas, num_groups, num_nodes,
num_gpus) -> (phy2log, log2phy, logcnt)`.

* eplb.py — DeepSeek's EPLB, and the slot maps and checks every balancer shares;
* maps.py — an engine's map in service and its initial layout;
* engines/ — the balancers serving engines ship (`ENGINES`, the one registry of them);
* dropin/ — `rebalance_experts`, the drop-in that plans for the engine's dispatch.

They see counts and slots only, never a `ResidencyProblem`: the slow loop adapts them as
heuristics (residency/heuristics/engines.py), not the other way round.
"""
