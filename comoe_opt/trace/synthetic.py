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

from dataclasses import asdict, dataclass

import numpy as np

from comoe_opt.instance import ModelShape, SyntheticTrace, check_synthetic
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
    check_synthetic(model, spec, None)
    alphas = layer_alphas(spec, model.layers)
    meta = {"generator": "zipf-markov", **asdict(spec)}
    layer_ids = np.array(model.moe_layer_ids, dtype=np.int64)  # the model's numbering, dense layers skipped
    if spec.sequence_tokens == 0:
        per_phase = []
        for phase, batches in enumerate(_phase_sizes(spec.micro_batches, spec.drift_every)):
            rng = np.random.default_rng([spec.seed, phase])
            tables = _tables(model, spec, alphas, rng)
            tables = _degenerate(spec, tables, tables)
            per_phase.append(_draw(model, spec, tables, batches * spec.tokens_per_batch, rng))
        topk = np.concatenate(per_phase, axis=0)
        return Trace(topk=topk, num_experts=model.experts_per_layer, layer_ids=layer_ids, meta=meta)
    seq_id, pos, topic = _requests(spec)
    topk = _draw_requests(model, spec, alphas, topic)
    return Trace(
        topk=topk, num_experts=model.experts_per_layer, seq_id=seq_id, pos=pos, layer_ids=layer_ids, meta=meta
    )


def layer_alphas(spec: SyntheticTrace, layers: int) -> np.ndarray:
    """Each layer's Zipf exponent: all `zipf_alpha`, or spread evenly up to `zipf_alpha_max` and
    dealt to the layers in an order seeded by `seed` alone (a layer keeps its skew across phases)."""
    if not spec.zipf_alpha_max:
        return np.full(layers, spec.zipf_alpha)
    spread = np.linspace(spec.zipf_alpha, spec.zipf_alpha_max, layers)
    return spread[np.random.default_rng([spec.seed, _LAYER_STREAM]).permutation(layers)]


# Streams of the seed that do not collide with phases (phase numbers stay far below these).
_LAYER_STREAM, _REQUEST_STREAM = 2**32 - 1, 2**32 - 2


def _phase_sizes(micro_batches: int, drift_every: int) -> list[int]:
    full, rest = divmod(micro_batches, drift_every)
    return [drift_every] * full + ([rest] if rest else [])


def _requests(spec: SyntheticTrace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Requests of geometric length (mean `sequence_tokens`): each token's request, position and topic.

    Decode batching drops the drain at the end: steps stop being full when the first slot finds
    no request waiting, about one mean length (the requests in flight) before the tokens run
    out, give or take mean/sqrt(B); two mean lengths and 8 steps more cover it, and the batching
    keeps `micro_batches`.
    """
    rng = np.random.default_rng([spec.seed, _REQUEST_STREAM])
    wanted = spec.generated_tokens()
    lengths = np.empty(0, dtype=np.int64)
    while lengths.sum() < wanted:
        more = max(1, (wanted - int(lengths.sum())) // spec.sequence_tokens + 1)
        lengths = np.concatenate((lengths, rng.geometric(1.0 / spec.sequence_tokens, size=more)))
    lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), wanted)) + 1]
    count = lengths.size
    if spec.topic_order == "turns":
        topic_of_request = (np.arange(count) // spec.requests_per_topic) % spec.topics
    else:
        topic_of_request = rng.integers(spec.topics, size=count)
    seq_id = np.repeat(np.arange(count, dtype=np.int64), lengths)
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    pos = np.arange(seq_id.size, dtype=np.int64) - np.repeat(starts, lengths)
    return seq_id, pos, topic_of_request[seq_id]


def _draw_requests(
    model: ModelShape, spec: SyntheticTrace, alphas: np.ndarray, topic: np.ndarray
) -> np.ndarray:
    """Tokens in request order; phases of `drift_every` micro-batches' tokens, each topic of a
    phase its own tables (a topic that returns within a phase routes as before)."""
    tokens = topic.size
    phase = np.arange(tokens) // (spec.drift_every * spec.tokens_per_batch)
    out = np.empty((tokens, model.layers, model.top_k), dtype=np.int16)
    for p in np.unique(phase).tolist():
        in_phase = phase == p
        rng = np.random.default_rng([spec.seed, p])
        common = _tables(model, spec, alphas, rng)
        for t in np.unique(topic[in_phase]).tolist():
            index = np.flatnonzero(in_phase & (topic == t))
            if spec.topics == 1:
                tables, draws = common, rng
            else:
                draws = np.random.default_rng([spec.seed, p, t])
                tables = _topic_tables(model, spec, alphas, common, draws)
            out[index] = _draw(model, spec, _degenerate(spec, tables, common), index.size, draws)
    return out


@dataclass(frozen=True)
class Tables:
    """Rank-1 popularity of each layer by expert id, and the experts in popularity order."""

    pops: np.ndarray  # [layers, experts]
    orders: np.ndarray  # [layers, experts]: orders[l, r] is the expert of popularity rank r


def _tables(model: ModelShape, spec: SyntheticTrace, alphas: np.ndarray, rng: np.random.Generator) -> Tables:
    """Each layer's Zipf popularity over a random order of the experts (the degenerate layer not yet)."""
    experts = model.experts_per_layer
    perms = [rng.permutation(experts) for _ in range(model.layers)]
    pops = np.stack(
        [_in_id_space(zipf_weights(a, experts), perm) for a, perm in zip(alphas, perms, strict=True)]
    )
    return Tables(pops, np.stack(perms))


def _topic_tables(
    model: ModelShape, spec: SyntheticTrace, alphas: np.ndarray, common: Tables, rng: np.random.Generator
) -> Tables:
    """A topic's popularity: `topic_shift` of its own Zipf order, the rest the phase's common one."""
    own = _tables(model, spec, alphas, rng)
    pops = spec.topic_shift * own.pops + (1.0 - spec.topic_shift) * common.pops
    return Tables(pops, np.argsort(-pops, axis=1, kind="stable"))


def _degenerate(spec: SyntheticTrace, tables: Tables, common: Tables) -> Tables:
    """The degenerate layer puts `degenerate_share` of its rank-1 choices on the phase's most popular
    expert of that layer, whatever the topic (it becomes the most popular, first in the order)."""
    layer = spec.degenerate_layer
    if layer < 0:
        return tables
    expert = common.orders[layer, 0]
    pops, orders = tables.pops.copy(), tables.orders.copy()
    pops[layer] *= 1.0 - spec.degenerate_share
    pops[layer, expert] += spec.degenerate_share
    orders[layer] = np.concatenate(([expert], orders[layer][orders[layer] != expert]))
    return Tables(pops, orders)


def _draw(
    model: ModelShape, spec: SyntheticTrace, tables: Tables, tokens: int, rng: np.random.Generator
) -> np.ndarray:
    """Route `tokens` tokens through the layers: rank 1 follows the successors, the rest as set."""
    out = np.empty((tokens, model.layers, model.top_k), dtype=np.int16)
    pops = tables.pops
    out[:, 0] = _route(spec, tables, 0, pops[0][None, :], np.zeros(tokens, dtype=np.int64), model.top_k, rng)
    for layer in range(1, model.layers):
        successors = successors_between(
            pops[layer - 1],
            pops[layer],
            tables.orders[layer - 1],
            tables.orders[layer],
            spec.successor_weight,
            rng,
        )
        table = spec.rho * successors + (1.0 - spec.rho) * pops[layer][None, :]
        row = out[:, layer - 1, 0].astype(np.int64)
        out[:, layer] = _route(spec, tables, layer, table, row, model.top_k, rng)
    return out


def _route(
    spec: SyntheticTrace,
    tables: Tables,
    layer: int,
    table: np.ndarray,
    row: np.ndarray,
    k: int,
    rng: np.random.Generator,
) -> np.ndarray:
    if spec.lower_ranks_alpha < 0 or k == 1:
        return _plackett_luce(table, row, k, rng)
    first = _plackett_luce(table, row, 1, rng)
    lower = _in_id_space(zipf_weights(spec.lower_ranks_alpha, table.shape[1]), tables.orders[layer])
    return _plackett_luce(lower[None, :], np.zeros(row.size, dtype=np.int64), k, rng, first)


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
    """Row-stochastic [E, E] matrix M with pop_from · M = pop_to, both Zipf `z` (`successors_between`)."""
    return successors_between(
        _in_id_space(z, perm_from), _in_id_space(z, perm_to), perm_from, perm_to, weight, rng
    )


def successors_between(
    pop_from: np.ndarray,
    pop_to: np.ndarray,
    order_from: np.ndarray,
    order_to: np.ndarray,
    weight: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """Row-stochastic [E, E] matrix M with pop_from · M = pop_to.

    In rank space (experts by popularity, `order_*`), `M = weight · P + (1 − weight) · C`: `P`
    is the monotone coupling of the two popularities (the identity when they are equal: each
    expert's preferred successor is the one of the same rank), `C` their interval coupling under
    a random order of the target ranks. Both preserve the marginals, so their mixture does too,
    and each row has one preferred successor plus a handful of others.
    """
    a, b = pop_from[order_from], pop_to[order_to]
    n = a.size
    shuffled = rng.permutation(n)
    coupling = interval_coupling(a, b[shuffled])
    rank_matrix = np.zeros((n, n))
    rank_matrix[:, shuffled] = coupling
    if np.array_equal(a, b):
        rank_matrix = weight * np.eye(n) + (1.0 - weight) * rank_matrix / a[:, None]
    else:
        rank_matrix = weight * interval_coupling(a, b) + (1.0 - weight) * rank_matrix
        used = a > 0  # an expert no token picks (degenerate share 1) gets the target popularity
        rank_matrix[used] /= a[used, None]
        rank_matrix[~used] = b
    out = np.empty_like(rank_matrix)
    out[np.ix_(order_from, order_to)] = rank_matrix
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


def _plackett_luce(
    table: np.ndarray, row: np.ndarray, k: int, rng: np.random.Generator, fixed: np.ndarray | None = None
) -> np.ndarray:
    """Draw k distinct ids per token from `table[row[t]]`, in draw order; `fixed[t]` (if given)
    are the token's first ranks, already drawn."""
    n_rows, experts = table.shape
    cdf = np.cumsum(table, axis=1)
    cdf /= cdf[:, -1:]
    flat = (cdf + np.arange(n_rows)[:, None]).ravel()
    # Tokens grouped by row keep the binary searches within one row's cache lines.
    by_row = np.argsort(row, kind="stable")
    row = row[by_row]
    tokens = row.size
    out = np.full((tokens, k), -1, dtype=np.int64)
    done = 0
    if fixed is not None:
        done = fixed.shape[1]
        out[:, :done] = fixed[by_row]
    for rank in range(done, k):
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
