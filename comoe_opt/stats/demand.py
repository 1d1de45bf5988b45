"""Demand statistics of a trace window, the data the slow loop plans on.

Per logical expert (l, e), over the micro-batches of a window:

* `tokens[l, e]` — λ, mean selections per micro-batch;
* `used[l, e]` — q, share of micro-batches that select it at least once
  (each such micro-batch needs the page once);
* `hidden[l, e]` — h, share of those uses in which transition-graph prefetch
  would already have asked for the page (see `comoe_opt.stats.prefetch`);
* `scenario_tokens[s, l, e]` — with `policy.balance_scenarios > 0`, the
  selections of (l, e) in each of S micro-batches sampled evenly from the
  window: the balance scenarios (see `comoe_opt.best_split.cut_condition`);
* `load_counts[l, e]` — the selections λ was computed from, unscaled (summed
  over the window's micro-batches or a dump's steps): what an engine gives
  EPLB, so `eplb` plans on them (λ rounds differently in float32, which
  EPLB computes in, and can break its ties otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from comoe_opt.errors import InputError
from comoe_opt.instance import Policy
from comoe_opt.stats.prefetch import prefetch_targets, prefetched
from comoe_opt.stats.sparse import Smoothing, smoothed_scenarios
from comoe_opt.stats.transitions import TransitionGraph, window_graph
from comoe_opt.trace.batching import MicroBatches


@dataclass(frozen=True, eq=False)
class WindowDemand:
    tokens: np.ndarray  # [L, E] float64, λ
    used: np.ndarray  # [L, E] float64 in [0, 1], q
    hidden: np.ndarray  # [L, E] float64 in [0, 1], h
    batches: int  # micro-batches the statistics come from
    peak_tokens: np.ndarray | None = None  # [L, E] most selections in one micro-batch (default λ)
    scenario_tokens: np.ndarray | None = None  # [S, L, E] selections in sampled micro-batches
    load_counts: np.ndarray | None = None  # [L, E] unscaled selections λ comes from (EPLB's weight)
    step_counts: np.ndarray | None = None  # [T, L, E] the same per step (per-step planners)
    smoothing: Smoothing | None = None  # smoothed scenarios: the pseudo-steps chosen and the backtest

    @property
    def peak(self) -> np.ndarray:
        return self.tokens if self.peak_tokens is None else self.peak_tokens

    def __post_init__(self) -> None:
        shape = self.tokens.shape
        if self.used.shape != shape or self.hidden.shape != shape:
            raise InputError(None, "demand", "tokens, used and hidden must have one shape")
        if np.any(self.tokens < 0) or not np.all(np.isfinite(self.tokens)):
            raise InputError(None, "demand.tokens", "must be finite and non-negative")
        scenarios = self.scenario_tokens
        if scenarios is not None and (scenarios.ndim != 3 or scenarios.shape[1:] != shape):
            raise InputError(None, "demand.scenario_tokens", f"must be [scenarios, {shape[0]}, {shape[1]}]")

    @property
    def layers(self) -> int:
        return self.tokens.shape[0]

    @property
    def experts(self) -> int:
        return self.tokens.shape[1]


def used_mask(experts: np.ndarray, num_experts: int) -> np.ndarray:
    """Bool [batches, layers, E]: expert selected at least once in the micro-batch."""
    batches, _, layers, _ = experts.shape
    out = np.zeros((batches, layers, num_experts), dtype=bool)
    b = np.arange(batches)[:, None, None, None]
    layer = np.arange(layers)[None, None, :, None]
    out[b, layer, experts.astype(np.int64)] = True
    return out


def window_demand(window: MicroBatches, policy: Policy, graph: TransitionGraph | None = None) -> WindowDemand:
    """Demand of a window; prefetch coverage from `graph` (default: learnt on the window itself)."""
    experts = window.experts
    n = window.batches
    e = window.num_experts
    layers = window.layers
    used = used_mask(experts, e)
    # one bincount over (micro-batch, layer, expert) keys, int32 where they fit (memory-bound)
    key_type = np.int32 if n * layers * e < 2**31 else np.int64
    keys = (
        np.add(
            np.arange(n, dtype=key_type)[:, None, None, None] * layers,
            np.arange(layers, dtype=key_type)[None, None, :, None],
        )
        * e
    )
    per_batch = np.bincount((keys + experts.astype(key_type)).ravel(), minlength=n * layers * e).reshape(
        n, layers, e
    )
    counts = per_batch.sum(axis=0)
    if graph is None:
        graph = window_graph(window, policy)
    hit = prefetched(used, prefetch_targets(graph, policy)) & used
    uses = used.sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        hidden = np.where(uses > 0, hit.sum(axis=0) / uses, 0.0)
    scenarios, smoothing = balance_scenarios(
        per_batch, policy.balance_scenarios, policy.balance_scenario_model, policy.scenario_pseudo_steps
    )
    return WindowDemand(
        counts / n,
        uses / n,
        hidden,
        n,
        per_batch.max(axis=0).astype(np.float64),
        scenarios,
        counts.astype(np.float64),
        per_batch,
        smoothing,
    )


def balance_scenarios(
    steps: np.ndarray, count: int, model: str = "steps", pseudo_steps: float = -1.0
) -> tuple[np.ndarray | None, Smoothing | None]:
    """`count` balance scenarios of per-step counts `steps` [T, L, E]: steps spread evenly over the
    window, or (`smoothed`, more than one step) multinomial draws at smoothed shares."""
    if not count:
        return None, None
    if model == "smoothed" and steps.shape[0] > 1:
        return smoothed_scenarios(steps, min(count, steps.shape[0]), pseudo_steps)
    return steps[sample_scenarios(steps.shape[0], count)].astype(np.float64), None


def sample_scenarios(batches: int, wanted: int) -> np.ndarray:
    """Indices of `wanted` micro-batches spread evenly over `batches` (all when there are fewer)."""
    if batches <= wanted:
        return np.arange(batches)
    return np.floor((np.arange(wanted) + 0.5) * batches / wanted).astype(np.int64)


def demand_from_counts(counts: np.ndarray, tokens_per_batch: int, top_k: int) -> WindowDemand:
    """Demand from load counts only (no per-token trace): each layer's counts are
    scaled to `tokens_per_batch · top_k` selections per micro-batch, use
    probability from a Poisson approximation `q = 1 − exp(−λ)`, no prefetch."""
    counts = np.asarray(counts, dtype=np.float64)
    totals = counts.sum(axis=1, keepdims=True)
    if np.any(totals <= 0):
        raise InputError(None, "logical_count", "every layer needs a positive total count")
    tokens = counts / totals * (tokens_per_batch * top_k)
    return WindowDemand(tokens, 1.0 - np.exp(-tokens), np.zeros_like(tokens), 0, load_counts=counts)


def demand_from_step_counts(
    steps: np.ndarray,
    tokens_per_batch: int,
    top_k: int,
    scenarios: int = 0,
    model: str = "steps",
    pseudo_steps: float = -1.0,
) -> WindowDemand:
    """Demand from per-step load counts [T, L, E] (SGLang's recorder dump): each layer scaled by
    one factor so its mean step has `tokens_per_batch · top_k` selections (bursts keep their
    size), use probability = share of steps that selected the expert, no prefetch; with
    `scenarios` > 0 and more than one step, that many balance scenarios (`balance_scenarios`).
    One step is `demand_from_counts`."""
    steps = np.asarray(steps, dtype=np.float64)
    if steps.ndim == 2 or steps.shape[0] == 1:
        return demand_from_counts(steps.reshape(steps.shape[-2:]), tokens_per_batch, top_k)
    totals = steps.sum(axis=2).mean(axis=0)  # [L] mean selections per step
    if np.any(totals <= 0):
        raise InputError(None, "logical_count", "every layer needs a positive total count")
    scaled = steps * (tokens_per_batch * top_k / totals)[None, :, None]
    chosen, smoothing = balance_scenarios(scaled, scenarios, model, pseudo_steps)
    return WindowDemand(
        scaled.mean(axis=0),
        (scaled > 0).mean(axis=0),
        np.zeros(scaled.shape[1:]),
        scaled.shape[0],
        scaled.max(axis=0),
        chosen,
        steps.sum(axis=0),
        steps,
        smoothing,
    )
