"""The drop-in's constants, chosen per call by rolling-origin backtesting on the history it is given.

A call holds back the newest quarter of its history (`HELD_BACK`), plans on the older steps with
each candidate set of constants (`Constants`: the search's move cost, the steps' half-life, the
smoothing of sparse counts) and scores each plan on the held-back steps: the mean per-step max/mean
GPU load under the dispatch, plus `price` per expert moved off the map in service (the price a
move is worth to the caller: the move cost the caller fixed, else `MOVE_PRICE`). The best
candidate plans on the whole history. Nothing is scored on steps the call has not been given.

For `lp`, EPLB's own plan of the older steps is scored on the held-back steps as well: when it
balances them better than ours (mean over layers), the map in service stays if it balanced them as
well as EPLB's, else EPLB's plan of the whole history serves, so that `lp` does not lose to EPLB +
lp where the backtest can see it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from comoe_opt.balancers.dropin.objective import Shape, moved, scores
from comoe_opt.best_split.even import slot_replicas

HELD_BACK = 4  # the newest 1/4 of the history is held back: the replay's plan serves 1/4 of its history
MIN_STEPS = 8  # fewer steps: no backtest (each side would hold too few steps to rank anything)
MOVE_PRICE = 0.002  # per expert moved, in per-step max/mean: the default move cost (ep_balance.MOVE_COST)
# the candidate constants (docs/api.md "Backtest"). Half-lives are shares of the history's steps:
# 1/2 is where GPT-OSS windows 1-32 put it (64 of 128 steps); 1/8 and all steps alike (None) are
# the shorter and longer memory a shifting or a stationary load wants. The 4x move cost is the
# cautious search sparse or noisy steps want (the regime suite's A and C: benchmarks/results/dropin.md)
HALF_LIFE_SHARES: tuple[float | None, ...] = (0.5, 0.125, None)
MOVE_COST_TIMES = (1.0, 4.0)
SIGNIFICANCE = 2.0  # standard errors by which a candidate must beat the default on the held-back steps
SPARSE_RATE = 1.0  # selections per expert per step below which the smoothed steps are a candidate


@dataclass(frozen=True)
class Constants:
    """What the search plans with."""

    move_cost: float  # the search's price of a moved expert, in per-step max/mean
    half_life: float | None  # steps back a step weighs half as much (None: all alike)
    smooth: bool  # each step's deviation from the experts' mean rates shrunk by its estimated noise

    def label(self) -> str:
        life = "all alike" if self.half_life is None else f"{self.half_life:g} steps"
        return f"move cost {self.move_cost:g}, half-life {life}, {'smoothed' if self.smooth else 'raw'} steps"


@dataclass(frozen=True)
class Backtest:
    """What the backtest chose and the scores behind it."""

    held_back: int  # newest steps scored (the plans saw the steps before them)
    candidates: tuple[Constants, ...]
    scores: tuple[float, ...]  # per candidate: held-back max/mean + price x moves, mean over layers
    chosen: Constants
    price: float  # per expert moved, in the scores
    rate: float  # selections per expert per step in the history (loads read as selection counts)
    ours: float  # the chosen candidate's held-back max/mean (no price), mean over layers
    eplb: float  # EPLB's plan of the older steps, the same way
    eplb_layers: tuple[int, ...] = ()  # lp: layers where EPLB's plan scored better and serves
    kept_layers: tuple[
        int, ...
    ] = ()  # lp: layers where EPLB's did, but so did the map in service, which stays

    def summary(self) -> str:
        lines = [
            f"backtest on the newest {self.held_back} steps (loads {self.rate:.2f} per expert per step):"
        ]
        for c, s in zip(self.candidates, self.scores, strict=True):
            mark = " <- chosen" if c == self.chosen else ""
            lines.append(f"  {c.label()}: {s:.4f}{mark}")
        lines.append(f"  held-back max/mean: ours {self.ours:.4f}, EPLB {self.eplb:.4f}")
        if self.eplb_layers or self.kept_layers:
            lines.append(
                f"  EPLB scored better on {len(self.eplb_layers) + len(self.kept_layers)} layers: its plan"
                f" serves {len(self.eplb_layers)}, the map in service (as good) {len(self.kept_layers)}"
            )
        return "\n".join(lines)


def selection_rate(steps: np.ndarray) -> float:
    """Mean selections per expert per step of raw steps [S, layers, experts]."""
    return float(steps.mean())


def candidates(
    steps: int, rate: float, move_cost: float | None, half_life: float | str | None, smooth: bool | None
) -> list[Constants]:
    """The candidate set, the first the default: one constant changed at a time from it, each
    constant the caller fixed (not None; `half_life` "auto" when not fixed) held at its value."""
    lives = [None if s is None else s * steps for s in HALF_LIFE_SHARES]
    costs = [MOVE_PRICE * t for t in MOVE_COST_TIMES]
    smooths = [False, True] if rate < SPARSE_RATE else [False]
    if move_cost is not None:
        costs = [move_cost]
    if half_life != "auto":
        lives = [half_life]  # type: ignore[list-item]
    if smooth is not None:
        smooths = [smooth]
    base = Constants(costs[0], lives[0], smooths[0])
    out = [base]
    out += [Constants(base.move_cost, life, base.smooth) for life in lives[1:]]
    out += [Constants(cost, base.half_life, base.smooth) for cost in costs[1:]]
    out += [Constants(base.move_cost, base.half_life, s) for s in smooths[1:]]
    return out


def smoothed(w: np.ndarray, raw: np.ndarray) -> np.ndarray:
    """Normalised steps `w` [layers, S, E] with each expert's deviation from its mean scaled by
    sqrt(1 - noise / variance): the share of its step-to-step variance that is not the sampling
    noise of its counts (Poisson: a count's variance is its mean). `raw` [layers, S, E] are the
    counts `w` was normalised from."""
    mean = w.mean(axis=1, keepdims=True)
    per_count = np.divide(w, raw, out=np.zeros_like(w), where=raw > 0)  # w units per selection
    scale = per_count.sum(axis=1, keepdims=True) / np.maximum((raw > 0).sum(axis=1, keepdims=True), 1)
    noise = mean * scale  # variance of w from counting alone
    var = w.var(axis=1, keepdims=True)
    keep = np.sqrt(np.clip(1.0 - np.divide(noise, var, out=np.ones_like(var), where=var > 0), 0.0, 1.0))
    return mean + keep * (w - mean)


Planner = Callable[[np.ndarray, np.ndarray, Constants, float], np.ndarray]


def run(
    raw: np.ndarray,
    w: np.ndarray,
    shape: Shape,
    prev_n: np.ndarray | None,
    options: Sequence[Constants],
    price: float,
    plan: Planner,
    eplb_plan: Callable[[np.ndarray], np.ndarray],
    share: float,
    previous: np.ndarray | None = None,
) -> Backtest | None:
    """The backtest of `options` on raw steps `raw` [layers, S, E] (normalised: `w`); `plan(w,
    raw, constants, share)` plans on steps with `share` of the call's work, `eplb_plan(raw)` is
    EPLB's plan of raw steps; `previous` the map in service. None when the history is too short
    to hold any back."""
    steps = w.shape[1]
    held = steps // HELD_BACK
    if steps < MIN_STEPS or held < 1:
        return None
    old, new = slice(0, steps - held), slice(steps - held, steps)
    each = share / max(len(options), 1)
    plans = [plan(w[:, old], raw[:, old], c, each) for c in options]
    per_step = [scores(p, w[:, new], shape) for p in plans]  # [layers, held] each
    priced = [
        x.mean(axis=0) + price * _moves(p, shape, prev_n).mean() for p, x in zip(plans, per_step, strict=True)
    ]
    best = _pick(priced)
    balance = [x.mean(axis=1) for x in per_step]
    eplb = _held_back(eplb_plan(raw[:, old]), w[:, new], shape)
    ours = balance[best]
    # lp: judged over all layers (a layer's few held-back steps are noisy: picking the better plan
    # per layer would pick noise, and EPLB's plan moves nearly every expert)
    loses = shape.dispatch == "lp" and eplb.mean() < ours.mean() - 1e-12
    lose = np.arange(ours.size) if loses else np.zeros(0, dtype=np.int64)
    served = ours.copy()
    served[lose] = eplb[lose]
    kept = np.zeros(0, dtype=np.int64)
    if previous is not None and lose.size:  # where the map in service does as well, it moves nothing
        stay = _held_back(previous, w[:, new], shape)
        if stay.mean() <= eplb.mean():
            served, kept, lose = stay, lose, kept
    means = [float(x.mean()) for x in priced]
    return Backtest(
        held, tuple(options), tuple(means), options[best], price,
        selection_rate(raw), float(served.mean()), float(eplb.mean()),
        tuple(int(i) for i in lose), tuple(int(i) for i in kept),
    )  # fmt: skip


def _pick(priced: list[np.ndarray]) -> int:
    """The candidate to plan with, from each one's per-step held-back score [held]: the default
    (the first) unless another beats it by more than `SIGNIFICANCE` standard errors of the per-step
    difference (the held-back steps are few: a smaller gain is as likely noise); then the best such."""
    base, best, value = priced[0], 0, float(priced[0].mean())
    for k, x in enumerate(priced[1:], start=1):
        diff = x - base
        noise = float(diff.std(ddof=1)) / np.sqrt(diff.size) if diff.size > 1 else np.inf
        if diff.mean() < -SIGNIFICANCE * noise and x.mean() < value:
            best, value = k, float(x.mean())
    return best


def _held_back(plan: np.ndarray, w: np.ndarray, shape: Shape) -> np.ndarray:
    """[layers] the mean per-step max/mean of `plan` on steps `w` under the dispatch."""
    return scores(plan, w, shape).mean(axis=1)


def _moves(plan: np.ndarray, shape: Shape, prev_n: np.ndarray | None) -> np.ndarray:
    if prev_n is None:
        return np.zeros(plan.shape[0])
    return moved(slot_replicas(plan, prev_n.shape[1], shape.gpus), prev_n).astype(np.float64)
