"""How a placement serves steps of per-expert counts: each (step, layer)'s busiest device.

Three dispatches, the engines' and ours (formulations/mapping.md):

* `even` — an expert's whole tokens dealt over its slots (`best_split/even.py`: vLLM's and
  SGLang's even dispatch, the one rule of the project);
* `lp` — SGLang's `lp` dispatch (DeepSeek's LPLB): the LP that minimises the largest device load
  with fractional tokens, whose optimum is the cut condition over device sets
  (`best_split/cut_condition.py`: enumerated sets up to 12 devices, parametric min cut beyond);
* `flow` — our min-cost flow, whole tokens: its optimum is the LP's rounded up (max-flow
  integrality; tests/test_compare.py checks it against the flow and HiGHS).

With a `LayerTime` (costs.py) each (step, layer) also gets the MoE layer's modelled time from each
device's own tokens and busy slots: under `even` the split's own; under `lp` and `flow` one
whole-token split at the best makespan, rounded up (`best_split/split.py`: a maximum flow), the
same for both (formulations/serving-time.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from comoe_opt.best_split.cut_condition import layer_makespans
from comoe_opt.best_split.even import even_split
from comoe_opt.best_split.split import Splitter
from comoe_opt.costs import LayerTime
from comoe_opt.errors import ComoeError

DISPATCHES = ("even", "lp", "flow")


@dataclass(frozen=True)
class Served:
    """Per (step, layer): the busiest device's tokens and the mean device's, and the layer's
    modelled time (ms) when a `LayerTime` was given."""

    peak: np.ndarray  # [n, L]
    mean: np.ndarray  # [n, L]
    layer_ms: np.ndarray | None = None  # [n, L]

    @property
    def imbalance(self) -> np.ndarray:
        """[n, L] largest over mean device load (1 where a layer has no load)."""
        return np.where(self.mean > 0, self.peak / np.where(self.mean > 0, self.mean, 1.0), 1.0)

    def balancedness_sglang(self) -> float:
        """SGLang's: per layer and step, (mean + 1e-5) / (max + 1e-5), averaged."""
        return float(((self.mean + 1e-5) / (self.peak + 1e-5)).mean())

    def balancedness_vllm(self) -> float:
        """vLLM's: per step, the layers' summed mean over their summed max, averaged."""
        return float((self.mean.sum(axis=1) / np.maximum(self.peak.sum(axis=1), 1e-12)).mean())

    @staticmethod
    def joined(parts: list[Served]) -> Served:
        if not parts:
            return Served(np.zeros((0, 0)), np.zeros((0, 0)))
        timed = all(p.layer_ms is not None for p in parts)
        return Served(
            np.concatenate([p.peak for p in parts]),
            np.concatenate([p.mean for p in parts]),
            np.concatenate([p.layer_ms for p in parts if p.layer_ms is not None]) if timed else None,
        )

    def reordered(self, order: np.ndarray) -> Served:
        """The same steps in `order`."""
        return Served(
            self.peak[order], self.mean[order], None if self.layer_ms is None else self.layer_ms[order]
        )


def serve(slots: np.ndarray, counts: np.ndarray, dispatch: str, timing: LayerTime | None = None) -> Served:
    """Steps `counts` [n, L, E] served by a placement's `slots` [L, E, C] (slots each device holds
    of each expert: `Placement.slots()`) under `dispatch`, timed by `timing` when given."""
    counts = np.asarray(counts, dtype=np.float64)
    devices = slots.shape[2]
    mean = counts.sum(axis=2) / devices
    if dispatch == "even":
        loads, busy = even_split(np.rint(counts), slots, active=timing is not None)
        layer_ms = None if timing is None or busy is None else timing.layer_ms(loads, busy)
        return Served(loads.max(axis=2), mean, layer_ms)
    if dispatch not in DISPATCHES:
        raise ComoeError(f"unknown dispatch {dispatch!r} (known: {', '.join(DISPATCHES)})")
    unit = np.ones(devices)
    resident = slots > 0
    peak = np.stack(
        [
            layer_makespans(counts[:, layer, :, None] * unit, resident[layer])
            for layer in range(counts.shape[1])
        ],
        axis=1,
    )  # [n, L]
    if dispatch == "flow":
        peak = np.ceil(peak - 1e-9)  # whole tokens: the flow's optimum
    if timing is None:
        return Served(peak, mean)
    tokens, busy = best_split_loads(slots, np.rint(counts), np.ceil(peak - 1e-9))
    return Served(peak, mean, timing.layer_ms(tokens, busy))


def best_split_loads(
    slots: np.ndarray, counts: np.ndarray, caps: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """([n, L, C] tokens, [n, L, C] busy slots) of one whole-token split per step and layer with no
    device above `caps` [n, L]; a device's slots of one expert are busy up to its tokens of it."""
    n, layers, _ = counts.shape
    devices = slots.shape[2]
    tokens, busy = np.zeros((n, layers, devices)), np.zeros((n, layers, devices))
    for layer in range(layers):
        splitter = Splitter(slots[layer] > 0)
        for t in range(n):
            served = splitter.split(counts[t, layer].astype(np.int64), int(caps[t, layer]))
            tokens[t, layer] = served.sum(axis=0)
            busy[t, layer] = np.minimum(slots[layer], served).sum(axis=0)
    return tokens, busy
