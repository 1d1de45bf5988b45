"""The drop-in's time objective (`rebalance_experts(..., timing=LayerTime)`): each step's MoE
layer time under the even split by the one cost model's rule (costs.py: `device_time`), in units
of the step's balanced time, so that the search by steps weighs it, and a move's price, as it
weighs the max/mean token load without timing.

A GPU g takes T_g selections on A_g active slots in a step: t_g = max(A_g·read, T_g·flop) +
T_g·link (formulations/serving-time.md). The search keeps T_g as the normalised load (each step's
mean GPU load 1, objective.normalised) times the step's selections per GPU (`scale`), and A_g as
its slots' expected activity: a slot of an expert with c selections over r slots takes at least
one with probability min(1, c / r) (the even split gives every slot one when c >= r, and c of them
otherwise). A step's value is the slowest GPU's time over the time of a GPU with the step's mean
selections and one active slot per expert that has any, spread evenly (`ref`): with read = 0 the
value is the max/mean token load exactly, so a model whose layers never wait on weight reads is
planned as without timing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from comoe_opt.costs import LayerTime, device_time


@dataclass(frozen=True)
class StepTimes:
    """`device_time`'s rates per (layer, step) [L, S], in units of the step's balanced time:
    `read` per active slot, `flop` and `link` per normalised selection; `scale` [L, S] the step's
    selections per GPU (what a normalised load of 1 is)."""

    read: np.ndarray
    flop: np.ndarray
    link: np.ndarray
    scale: np.ndarray

    @classmethod
    def of(cls, rates: tuple[float, float, float], raw: np.ndarray, gpus: int) -> StepTimes:
        """The rates (read_ms, flop_ms, link_ms) of alike GPUs, for raw steps [L, S, E]."""
        read_ms, flop_ms, link_ms = rates
        scale = raw.sum(axis=-1) / gpus  # [L, S]
        ref = balanced_ms(rates, raw, gpus)
        unit = np.divide(1.0, ref, out=np.zeros_like(ref), where=ref > 0)  # an empty step scores 0
        return cls(read_ms * unit, flop_ms * scale * unit, link_ms * scale * unit, scale)

    def value(self, tokens: np.ndarray, active: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """Each GPU's time in units of its step's balanced time, for normalised `tokens` and active
        slots `active` [B, ..., S] of layers `rows` (None: every layer, arrays [L, G, S])."""
        read, flop, link = (r if rows is None else r[rows] for r in (self.read, self.flop, self.link))
        shape = (read.shape[0], *(1,) * (tokens.ndim - 2), read.shape[1])
        return device_time(tokens, active, read.reshape(shape), flop.reshape(shape), link.reshape(shape))

    def activity(self, w_t: np.ndarray, count: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """[L, K, S] one slot's expected activity per expert and step, min(1, c / r), for `w_t`
        [L, K, S] normalised steps of K experts and `count` [L, K] slots of each, of layers `rows`
        (None: every layer)."""
        scale = self.scale if rows is None else self.scale[rows]
        return np.minimum(w_t * scale[:, None, :] / np.maximum(count, 1)[..., None], 1.0)


def balanced_ms(rates: tuple[float, float, float], raw: np.ndarray, gpus: int) -> np.ndarray:
    """[L, S] each step's balanced layer time (ms, `ref`): a GPU with the step's mean selections
    and one active slot per expert that has any, spread evenly, for raw steps [L, S, E]."""
    read_ms, flop_ms, link_ms = rates
    return device_time(raw.sum(axis=-1) / gpus, (raw > 0).sum(axis=-1) / gpus, read_ms, flop_ms, link_ms)


def interval_price(
    copy_ms: float, rates: tuple[float, float, float], raw: np.ndarray, gpus: int, every: int
) -> float:
    """A move's price in the time objective's units when a plan serves `every` steps: its share
    of the re-plan's stall spread over them, over the steps' mean balanced layer time (0 when no
    step has a selection). Every GPU receives its copies at once over its own link, so the stall
    is the most copies into one GPU times a copy's time (`copy_ms`, LayerTime.replan_copy_ms; as
    compare's `migration_ms`): with the moves spread over the GPUs, one adds 1 / G of a copy."""
    ref = balanced_ms(rates, raw, gpus)
    mean = float(ref[ref > 0].mean()) if (ref > 0).any() else 0.0
    return copy_ms / (gpus * every * mean) if mean > 0 else 0.0


def uniform_rates(timing: LayerTime, gpus: int) -> tuple[float, float, float] | None:
    """`timing`'s rates when it times `gpus` alike GPUs, else None."""
    if np.shape(timing.read_ms) not in ((gpus,), ()):
        return None
    return timing.uniform()
