"""Zipf–Markov routing generator with phase drift (formulations/traces.md).

The router of each token is a Plackett–Luce draw of `k` distinct experts:
experts are drawn one after another, each in proportion to its probability
among the experts not yet chosen. Draw order is router rank order.

* Layer 0 draws from the popularity `pop_0`: Zipf(α) over a random
  permutation of the expert ids.
* Layer l+1 draws from `ρ · M_l[i] + (1 − ρ) · pop_{l+1}`, where `i` is the
  token's rank-1 expert at layer l and `M_l` is the successor matrix. Each row
  of `M_l` puts `successor_weight` on one preferred successor (the expert of the
  same popularity rank) and spreads the rest over a few others.
* `M_l` is built so that `pop_l · M_l = pop_{l+1}`: the rank-1 expert of
  every layer follows Zipf(α) exactly, whatever ρ. That is what lets the
  statistics recover α from a trace (`alpha_top1`).
* Every `drift_every` micro-batches a new phase starts: permutations and
  successor maps are redrawn, so the hot set and the transitions move.

Everything is vectorised over tokens; randomness comes from one
`numpy.random.Generator` per phase, seeded from `(seed, phase)`.
"""

from __future__ import annotations

from dataclasses import asdict

import numpy as np

from comoe_opt.errors import InputError
from comoe_opt.instance import ModelShape, SyntheticTrace
from comoe_opt.trace.model import Trace

# Rejection rounds before switching to exact masked sampling (both are exact
# Plackett–Luce draws; masking is slower per token but never stalls).
_REJECTION_ROUNDS = 4


def zipf_weights(alpha: float, n: int) -> np.ndarray:
    """Zipf(α) probabilities of ranks 1..n."""
    w = np.arange(1, n + 1, dtype=np.float64) ** -alpha
    return w / w.sum()


def generate(model: ModelShape, spec: SyntheticTrace) -> Trace:
    """Generate a synthetic trace for `model` from the generator parameters."""
    if model.top_k > model.experts_per_layer:
        raise InputError(None, "model.top_k", "exceeds experts_per_layer")
    per_phase = []
    for phase, batches in enumerate(_phase_sizes(spec.micro_batches, spec.drift_every)):
        rng = np.random.default_rng([spec.seed, phase])
        per_phase.append(_generate_phase(model, spec, batches * spec.tokens_per_batch, rng))
    topk = np.concatenate(per_phase, axis=0)
    meta = {"generator": "zipf-markov", **asdict(spec)}
    layer_ids = np.array(model.moe_layer_ids, dtype=np.int64)  # the model's numbering, dense layers skipped
    return Trace(topk=topk, num_experts=model.experts_per_layer, layer_ids=layer_ids, meta=meta)


def _phase_sizes(micro_batches: int, drift_every: int) -> list[int]:
    full, rest = divmod(micro_batches, drift_every)
    return [drift_every] * full + ([rest] if rest else [])


def _generate_phase(
    model: ModelShape, spec: SyntheticTrace, tokens: int, rng: np.random.Generator
) -> np.ndarray:
    experts, layers, k = model.experts_per_layer, model.layers, model.top_k
    z = zipf_weights(spec.zipf_alpha, experts)
    perms = [rng.permutation(experts) for _ in range(layers)]
    out = np.empty((tokens, layers, k), dtype=np.int16)
    pop = _in_id_space(z, perms[0])
    out[:, 0] = _plackett_luce(pop[None, :], np.zeros(tokens, dtype=np.int64), k, rng)
    for layer in range(1, layers):
        successors = successor_matrix(z, perms[layer - 1], perms[layer], spec.successor_weight, rng)
        pop = _in_id_space(z, perms[layer])
        table = spec.rho * successors + (1.0 - spec.rho) * pop[None, :]
        out[:, layer] = _plackett_luce(table, out[:, layer - 1, 0].astype(np.int64), k, rng)
    return out


def _in_id_space(z: np.ndarray, perm: np.ndarray) -> np.ndarray:
    """Popularity by expert id: the expert `perm[r]` has rank r."""
    pop = np.empty_like(z)
    pop[perm] = z
    return pop


def successor_matrix(
    z: np.ndarray,
    perm_from: np.ndarray,
    perm_to: np.ndarray,
    weight: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """Row-stochastic [E, E] matrix M with pop_from · M = pop_to.

    In rank space, `M = weight · I + (1 − weight) · C`, where `C` is the
    interval coupling of `z` with itself under a random order of the target
    ranks: both terms preserve the Zipf marginal, so their mixture does too,
    and each row has one preferred successor plus a handful of others.
    """
    n = z.size
    shuffled = rng.permutation(n)
    coupling = interval_coupling(z, z[shuffled])
    rank_matrix = np.zeros((n, n))
    rank_matrix[:, shuffled] = coupling
    rank_matrix = weight * np.eye(n) + (1.0 - weight) * rank_matrix / z[:, None]
    out = np.empty_like(rank_matrix)
    out[np.ix_(perm_from, perm_to)] = rank_matrix
    return out


def interval_coupling(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Joint mass J[i, j] = |I_i ∩ J_j| of masses laid out on [0, 1].

    Rows sum to `a`, columns to `b` (both must sum to one).
    """
    ca = np.concatenate(([0.0], np.cumsum(a)))
    cb = np.concatenate(([0.0], np.cumsum(b)))
    ca[-1] = cb[-1] = 1.0
    lo = np.maximum(ca[:-1, None], cb[None, :-1])
    hi = np.minimum(ca[1:, None], cb[None, 1:])
    return np.clip(hi - lo, 0.0, None)


def _plackett_luce(table: np.ndarray, row: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Draw k distinct ids per token from `table[row[t]]`, in draw order."""
    n_rows, experts = table.shape
    cdf = np.cumsum(table, axis=1)
    cdf /= cdf[:, -1:]
    flat = (cdf + np.arange(n_rows)[:, None]).ravel()
    # Tokens grouped by row keep the binary searches within one row's cache lines.
    by_row = np.argsort(row, kind="stable")
    row = row[by_row]
    tokens = row.size
    out = np.full((tokens, k), -1, dtype=np.int64)
    for rank in range(k):
        pending = np.arange(tokens)
        for _ in range(_REJECTION_ROUNDS):
            if pending.size == 0:
                break
            u = rng.random(pending.size)
            r = row[pending]
            ids = np.searchsorted(flat, r + u, side="right") - r * experts
            ids = np.clip(ids, 0, experts - 1)
            dup = (out[pending, :rank] == ids[:, None]).any(axis=1)
            out[pending[~dup], rank] = ids[~dup]
            pending = pending[dup]
        if pending.size:
            out[pending, rank] = _masked_draw(table[row[pending]], out[pending, :rank], rng)
    result = np.empty_like(out)
    result[by_row] = out
    return result


def _masked_draw(probs: np.ndarray, chosen: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One draw per row from `probs` with the already chosen ids removed."""
    probs = probs.copy()
    np.put_along_axis(probs, chosen, 0.0, axis=1)
    exhausted = probs.sum(axis=1) <= 0.0
    if exhausted.any():  # support smaller than k (rho = 1): fill uniformly
        probs[exhausted] = 1.0
        np.put_along_axis(probs, chosen, 0.0, axis=1)
    cdf = np.cumsum(probs, axis=1)
    u = rng.random(probs.shape[0]) * cdf[:, -1]
    ids = (cdf <= u[:, None]).sum(axis=1)
    return np.minimum(ids, probs.shape[1] - 1)
