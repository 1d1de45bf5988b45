"""What the drop-in's search minimises, for a plan as a whole (the searches score moves
incrementally and must agree with these).

A layer's plan is a row of slots (`phy2log`); GPU g owns slots g·R/G … (g+1)·R/G − 1. Steps are
normalised so that each step's mean GPU load is 1, and a plan is scored on them under the
engine's dispatch:

* `even` — each expert's tokens split evenly over its replicas: the expected peak of the GPUs'
  loads from their recency-weighted means and variances (`Moments`, covariances between experts
  included), bounded smoothly by `lse_at` at the best of a few temperatures (`expected_peaks`);
* `lp` — each step's best split (the cut condition, best_split/cut_condition.py), its
  recency-weighted mean over the steps (`step_mean` of `scores`).

Steps are weighted by recency (`step_weights`: halved every `half_life` steps back), since a plan
serves the steps after its history; every function that weighs steps is handed the half-life.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from comoe_opt.best_split.cut_condition import unit_speed_makespans
from comoe_opt.best_split.even import expert_replicas, slot_replicas


@dataclass(frozen=True)
class Shape:
    gpus: int
    nodes: int  # moves stay within a node (1: anywhere)
    dispatch: str  # "even" or "lp"
    timed: bool = False  # the search minimises modelled time (timing.py), by steps at any size


def normalised(steps: np.ndarray, gpus: int) -> np.ndarray:
    """[layers, S, E] loads with each (layer, step)'s mean GPU load 1 (all-zero steps stay 0)."""
    total = steps.sum(axis=-1, keepdims=True) / gpus
    return np.divide(steps, total, out=np.zeros_like(steps), where=total > 0)


def step_weights(steps: int, half_life: float | None) -> np.ndarray:
    """[steps] weights summing to 1, oldest step first, halving every `half_life` steps back from
    the newest (all alike when None)."""
    if half_life is None or steps <= 1:
        return np.full(steps, 1.0 / max(steps, 1))
    p = 0.5 ** ((steps - 1 - np.arange(steps)) / half_life)
    return p / p.sum()


def step_mean(spans: np.ndarray, half_life: float | None) -> np.ndarray:
    """The recency-weighted mean of each layer's per-step max/mean loads (the last axis, oldest
    first)."""
    return np.einsum("...s,s->...", spans.astype(np.float64), step_weights(spans.shape[-1], half_life))


def moved(n: np.ndarray, prev: np.ndarray | None) -> np.ndarray:
    """Experts moved per layer: replicas on GPUs that did not hold them (`n`, `prev` [.., E, G])."""
    if prev is None:
        return np.zeros(n.shape[:-2], dtype=np.int64)
    return np.maximum(n - prev, 0).sum(axis=(-2, -1))


def lower(value: np.ndarray, current: np.ndarray) -> np.ndarray:
    """Where `value` is below `current` by more than round-off (1e-12 relative, at least absolute)."""
    return value < current - 1e-12 * np.maximum(1.0, np.abs(current))


# ----------------------------------------------------------------- each step's exact score


def scores(slots: np.ndarray, w: np.ndarray, shape: Shape) -> np.ndarray:
    """[layers, S] each step's max/mean GPU load under the dispatch (`w` normalised)."""
    if shape.dispatch == "even":
        return even_loads(slots, w, shape.gpus).max(axis=-1)
    n = slot_replicas(slots, w.shape[-1], shape.gpus)
    return np.stack([unit_speed_makespans(n[layer] > 0, w[layer]) for layer in range(w.shape[0])])


def even_loads(slots: np.ndarray, w: np.ndarray, gpus: int) -> np.ndarray:
    """[layers, S, G] GPU loads when each expert's load is split evenly over its replicas (a
    gather and a sum: no BLAS call, whose threads contend on a loaded host)."""
    layers, replicas = slots.shape
    count = np.maximum(expert_replicas(slots, w.shape[-1]), 1).astype(w.dtype)
    share = w / count[:, None, :]
    per_slot = np.take_along_axis(share, slots[:, None, :], axis=2)  # [layers, S, slots]
    return per_slot.reshape(layers, w.shape[1], gpus, replicas // gpus).sum(axis=-1)


# ----------------------------------------------------------------- even: the steps' moments


@dataclass(frozen=True)
class Moments:
    """What the `even` objective needs of the steps, whatever the plan: each expert's
    (recency-weighted) mean load [L, E], its deviations from it [L, E, S] and their variance [L, E]."""

    mean: np.ndarray
    dev: np.ndarray  # scaled by sqrt(steps x weight), so that their plain means over steps are weighted
    var_w: np.ndarray


def step_moments(w: np.ndarray, half_life: float | None, p: np.ndarray | None = None) -> Moments:
    """The moments of normalised steps `w` [layers, S, E] under step weights `p` [S] summing to 1
    (default: `step_weights` of `half_life`)."""
    w = w.astype(np.float64)
    steps = w.shape[1]
    p = step_weights(steps, half_life) if p is None else p
    mean = np.einsum("lse,s->le", w, p)  # [L, E]
    scale = np.sqrt(steps * p)
    dev = np.ascontiguousarray(((w - mean[:, None, :]) * scale[None, :, None]).transpose(0, 2, 1))
    return Moments(mean, dev, (dev**2).mean(axis=-1))


def half_weights(
    steps: int, block: int | None, half_life: float | None
) -> tuple[np.ndarray, np.ndarray] | None:
    """[steps] step weights of the two halves of the steps, alternate blocks of `block` steps
    counted back from the newest, each weighted by recency as the whole is and zero off its half;
    None when the check is off (`block` None) or the steps make fewer than two blocks each."""
    if block is None or steps < 4 * block:
        return None
    side = (np.arange(steps)[::-1] // block) % 2
    p = step_weights(steps, half_life)
    a, b = (np.where(side == h, p, 0.0) / p[side == h].sum() for h in (0, 1))
    return a, b


def half_moments(w: np.ndarray, block: int | None, half_life: float | None) -> tuple[Moments, Moments] | None:
    """The moments of the two halves (`half_weights`) of the steps `w` [layers, S, E]."""
    weights = half_weights(w.shape[1], block, half_life)
    if weights is None:
        return None
    a, b = (step_moments(w[:, q > 0], half_life, q[q > 0]) for q in weights)
    return a, b


def temperatures(moments: Moments, gpus: int) -> np.ndarray:
    """[T] the LSE bound's temperatures, from the steps alone (not the plan), so that every plan
    is scored alike."""
    spread = float(np.sqrt(moments.var_w.sum(axis=-1) / gpus).mean()) or 1.0
    return spread * np.array([0.25, 0.5, 1.0, 2.0, 4.0]) / np.sqrt(2 * np.log(max(gpus, 2)))


def lse_at(mu: np.ndarray, var: np.ndarray, t: np.ndarray) -> np.ndarray:
    """[..., 1] t log sum_g exp(mu_g / t + var_g / 2t^2) over the last axis (GPUs), for mu and var
    [..., G] and t broadcast to [..., 1]: E[max_g X_g] <= it for Gaussian X_g of those moments."""
    top = mu.max(axis=-1, keepdims=True)
    expo = (mu - top) / t + var / (2 * t**2)
    peak = expo.max(axis=-1, keepdims=True)
    return top + t * (peak + np.log(np.exp(expo - peak).sum(axis=-1, keepdims=True)))


def expected_peaks(slots: np.ndarray, w: np.ndarray, gpus: int, moments: Moments) -> np.ndarray:
    """[layers] the `even` objective of `slots` on normalised steps `w` [layers, S, E] whose
    moments are `moments`, as EvenSearch scores it."""
    _, experts, steps = moments.dev.shape
    n = slot_replicas(slots, experts, gpus)
    share = n / np.maximum(n.sum(axis=-1, keepdims=True), 1)  # [L, E, G]
    mu = np.einsum("le,leg->lg", moments.mean, share)
    if steps == 1:
        return mu.max(axis=-1)
    centred = np.einsum("leg,les->lgs", share, moments.dev)
    var = (centred**2).mean(axis=-1)
    t = temperatures(moments, gpus)
    return lse_at(mu[..., None, :], var[..., None, :], t[:, None])[..., 0].min(axis=-1)


def peaks_of_loads(loads: np.ndarray, p: np.ndarray, t: np.ndarray) -> np.ndarray:
    """[layers] the `even` objective from each step's GPU loads [layers, S, G] (`even_loads`)
    under step weights `p` [S] and temperatures `t` (`temperatures` of the same steps' moments):
    what `expected_peaks` gives, without the experts' moments."""
    mu = np.einsum("lsg,s->lg", loads, p)
    var = np.einsum("lsg,s->lg", (loads - mu[:, None]) ** 2, p)
    return lse_at(mu[..., None, :], var[..., None, :], t[:, None])[..., 0].min(axis=-1)
