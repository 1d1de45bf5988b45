"""Calibration on the static strategy, as the paper's Table 4 is read: static's mean latency.

Static's per-layer latency is `attention_ms + rest`, where `rest` (routing,
dispatch, page waits, execution, reduction) does not depend on attention:
static never prefetches or re-plans, and its on-demand loads of one layer end
before the next layer is routed. So one static replay with no attention gives
`rest`, and the attention time that makes attention the share `a` of static's
mean latency is `a · rest / (1 − a)` (formulations/latency.md, "Calibration").
"""

from __future__ import annotations

import dataclasses
import json

from comoe_opt.evaluator.runtime import simulate
from comoe_opt.evaluator.strategies import STRATEGIES
from comoe_opt.instance import Instance, to_table
from comoe_opt.trace.batching import MicroBatches


def static_rest_ms(instance: Instance, batches: MicroBatches) -> float:
    """Static's mean per-layer latency without attention, ms."""
    runtime = dataclasses.replace(instance.runtime, attention_ms=0.0, attention_share=0.0)
    log = simulate(dataclasses.replace(instance, runtime=runtime), batches, STRATEGIES["static"])
    return float(log.latency_ms.mean())


def attention_for_share(share: float, rest_ms: float) -> float:
    """Attention time (ms) that is `share` of static's mean latency `attention + rest_ms`."""
    if not 0.0 <= share < 1.0:
        raise ValueError(f"attention share {share} is outside [0, 1)")
    return share * rest_ms / (1.0 - share)


def calibrated(instance: Instance, batches: MicroBatches) -> Instance:
    """The instance with `runtime.attention_ms` set from `runtime.attention_share` (unchanged if 0)."""
    share = instance.runtime.attention_share
    if share <= 0.0:
        return instance
    key = (_static_key(instance), batches.batches)
    rest = _REST.get(key)
    if rest is None:  # the strategies of one map point share a static replay in a process
        rest = _REST[key] = static_rest_ms(instance, batches)
        while len(_REST) > 16:
            _REST.pop(next(iter(_REST)))
    runtime = dataclasses.replace(instance.runtime, attention_ms=attention_for_share(share, rest))
    return dataclasses.replace(instance, runtime=runtime)


_REST: dict[tuple[str, int], float] = {}


def _static_key(instance: Instance) -> str:
    """What static's `rest` depends on: the instance without its attention settings."""
    table = to_table(instance)
    table["runtime"] = {k: v for k, v in table["runtime"].items() if not k.startswith("attention")}
    table.pop("name", None)
    return json.dumps(table, sort_keys=True, default=str)
