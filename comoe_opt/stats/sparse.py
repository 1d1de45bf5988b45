"""Balance scenarios for sparse steps: multinomial draws at smoothed rates, the smoothing chosen
by a rolling-origin backtest on the history the call is given (formulations/residency.md,
"Scenarios from sparse steps").

Where an expert sees less than one selection per step, a raw step says little about the next
window: which of the rarely chosen experts happened to fire is noise. The smoothed model keeps
what does carry over, each expert's share of its layer, shrunk toward the layer's uniform share
by `κ` pseudo-steps of the layer's mean:

    p[l, e] = (N[l, e] + κ · N[l] / (E · T)) / (N[l] + κ · N[l] / T)

(N[l, e] selections over the T history steps, N[l] the layer's). κ = 0 is the raw shares.
Scenario s of layer l is a multinomial draw of that layer's mean selections per step at p[l].

κ is chosen from `PSEUDO_STEPS` by the history alone: at each origin the shares are estimated
on the steps before it and scored by the multinomial log-likelihood of the next block of steps
(plan on older steps, score on newer ones the call already has), summed over origins.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# κ candidates in pseudo-steps of the layer's mean: none, then each a quarter of the next; 256
# steps of the mean outweigh any history the rolling horizon keeps (128-512 steps)
PSEUDO_STEPS = (0.0, 1.0, 4.0, 16.0, 64.0, 256.0)
ORIGINS = 4  # the history is cut into ORIGINS + 1 blocks; each of the last ORIGINS is scored once
SEED = 0  # scenario draws are seeded: the same history gives the same scenarios


@dataclass(frozen=True)
class Smoothing:
    """What the backtest chose and its evidence: held-out log-likelihood per candidate."""

    pseudo_steps: float
    scores: dict[float, float]  # κ -> summed held-out log-likelihood (nats); -inf: an unseen expert
    origins: int


def smoothed_shares(steps: np.ndarray, pseudo_steps: float) -> np.ndarray:
    """[L, E] shares of each layer's selections over `steps` [T, L, E], shrunk by κ pseudo-steps."""
    counts = steps.sum(axis=0).astype(np.float64)
    layer_total = counts.sum(axis=1, keepdims=True)
    per_step = layer_total / steps.shape[0]
    prior = pseudo_steps * per_step / counts.shape[1]
    denominator = layer_total + pseudo_steps * per_step
    return np.divide(
        counts + prior, denominator, out=np.full_like(counts, 1.0 / counts.shape[1]), where=denominator > 0
    )


def held_out_score(train: np.ndarray, test: np.ndarray, pseudo_steps: float) -> float:
    """Multinomial log-likelihood (up to the counts' constant) of `test` steps' selections under the
    shares smoothed on `train`."""
    shares = smoothed_shares(train, pseudo_steps)
    counts = test.sum(axis=0).astype(np.float64)
    with np.errstate(divide="ignore"):
        logs = np.log(shares)
    seen = counts > 0
    return float((counts[seen] * logs[seen]).sum())


def choose_pseudo_steps(steps: np.ndarray, candidates: tuple[float, ...] = PSEUDO_STEPS) -> Smoothing:
    """κ with the best held-out score over rolling origins; the smallest κ on ties (least smoothing).
    Fewer than ORIGINS + 1 steps: every step but the first is an origin."""
    total = steps.shape[0]
    blocks = min(ORIGINS + 1, total)
    if blocks < 2:
        return Smoothing(0.0, {}, 0)
    edges = np.linspace(0, total, blocks + 1).round().astype(int)
    scores = {}
    for kappa in candidates:
        scores[kappa] = sum(
            held_out_score(steps[: edges[i]], steps[edges[i] : edges[i + 1]], kappa) for i in range(1, blocks)
        )
    best = max(candidates, key=lambda k: (scores[k], -k))
    return Smoothing(best, scores, blocks - 1)


def multinomial_scenarios(shares: np.ndarray, per_step: np.ndarray, count: int) -> np.ndarray:
    """[count, L, E] selections: layer l draws round(per_step[l]) selections at `shares[l]`."""
    rng = np.random.default_rng(SEED)
    totals = np.rint(per_step).astype(np.int64)
    out = np.empty((count, *shares.shape), dtype=np.float64)
    for layer in range(shares.shape[0]):
        out[:, layer] = rng.multinomial(totals[layer], shares[layer] / shares[layer].sum(), size=count)
    return out


def smoothed_scenarios(
    steps: np.ndarray, count: int, pseudo_steps: float = -1.0
) -> tuple[np.ndarray, Smoothing]:
    """`count` balance scenarios for the history `steps` [T, L, E] (scaled as the planner scales
    them), at shares smoothed by `pseudo_steps` (negative: chosen by `choose_pseudo_steps`)."""
    choice = choose_pseudo_steps(steps) if pseudo_steps < 0 else Smoothing(pseudo_steps, {}, 0)
    shares = smoothed_shares(steps, choice.pseudo_steps)
    per_step = steps.sum(axis=2).mean(axis=0)
    return multinomial_scenarios(shares, per_step, count), choice
