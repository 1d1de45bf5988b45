"""Trace statistics: skew, hot share, successor entropy, cross-layer predictability.

* `alpha` — maximum-likelihood Zipf exponent of the per-expert selection
  counts (all k ranks) against their rank: the skew of expert *load*.
* `alpha_top1` — the same fit on rank-1 choices only: the skew of the
  router's first choice. The synthetic generator's α is this one; a token
  cannot pick one expert twice, so load skew is lower for k > 1.
* `entropy_bits` — H(next rank-1 expert | current rank-1 expert) in bits,
  the empirical conditional entropy, for each logged layer pair.
* `predictability` — held-out accuracy of predicting the next layer's rank-1
  expert as the most frequent successor of the current rank-1 expert, learnt
  on the other part of the trace (every 5th sequence held out; aggregate
  sources: leave one data domain out). `popularity_guess` is the accuracy of
  always guessing the next layer's most popular rank-1 expert.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from comoe_opt.stats.transitions import transition_counts
from comoe_opt.trace.model import AggregateTrace, Trace, selection_counts

if TYPE_CHECKING:
    import pandas as pd

HOLDOUT_EVERY = 5  # every 5th sequence (or token) is held out for predictability


def fit_zipf_alpha(counts: np.ndarray, max_alpha: float = 10.0) -> float:
    """Maximum-likelihood Zipf exponent of counts ranked by size.

    Model: P(rank r) = r^-α / Σ_{s=1..E} s^-α over the E experts; the
    log-likelihood Σ_r n_r log P(r) is concave in α, so a bounded scalar
    search finds the maximum.
    """
    n = np.sort(np.asarray(counts, dtype=np.float64))[::-1]
    if n.sum() <= 0:
        return float("nan")
    log_rank = np.log(np.arange(1, n.size + 1))
    total = n.sum()
    weighted = float(n @ log_rank)

    def negative_log_likelihood(alpha: float) -> float:
        log_norm = np.log(np.exp(-alpha * log_rank).sum())
        return alpha * weighted + total * log_norm

    # imported here: only the Zipf fit needs SciPy, and most verbs never fit
    from scipy.optimize import minimize_scalar

    result = minimize_scalar(
        negative_log_likelihood, bounds=(0.0, max_alpha), method="bounded", options={"xatol": 1e-6}
    )
    return float(result.x)


def conditional_entropy_bits(joint: np.ndarray) -> float:
    """H(J | I) in bits of a joint count matrix N[i, j]."""
    joint = np.asarray(joint, dtype=np.float64)
    total = joint.sum()
    if total <= 0:
        return float("nan")
    row = joint.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        cond = np.where(joint > 0, joint / row, 1.0)
    return float(-(joint * np.log2(cond)).sum() / total)


def successor_accuracy(train: np.ndarray, test: np.ndarray) -> tuple[float, float]:
    """(successor accuracy, popularity-guess accuracy) of top-1 transition counts."""
    test = np.asarray(test, dtype=np.float64)
    total = test.sum()
    if total <= 0:
        return float("nan"), float("nan")
    predicted = np.argmax(train, axis=1)
    hits = test[np.arange(test.shape[0]), predicted].sum()
    popular = int(np.argmax(train.sum(axis=0)))
    return float(hits / total), float(test[:, popular].sum() / total)


@dataclass(frozen=True)
class TraceStats:
    """Per-layer statistics (`layers`) and their summary over the trace."""

    kind: str  # "per-token" or "aggregate"
    layers: pd.DataFrame
    summary: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        rows = [{k: _plain(v, k) for k, v in row.items()} for row in self.layers.to_dict(orient="records")]
        return {"kind": self.kind, "summary": self.summary, "layers": rows}


_INTEGER_COLUMNS = ("layer", "next_layer")  # float in the table when the last layer has no next


def _plain(value: Any, column: str = "") -> Any:
    """JSON-ready scalar: NumPy scalars unwrapped, NaN as None, layer numbers as ints."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and value != value:
        return None
    if column in _INTEGER_COLUMNS and value is not None:
        return int(value)
    return value


def trace_stats(trace: Trace) -> TraceStats:
    """Statistics of a per-token trace."""
    counts = trace.counts()
    top1_counts = selection_counts(trace.topk[:, :, :1], trace.num_experts)
    transitions = transition_counts(trace.topk, trace.num_experts, "top1")
    held_out = _holdout_mask(trace)
    train = transition_counts(trace.topk[~held_out], trace.num_experts, "top1")
    test = transition_counts(trace.topk[held_out], trace.num_experts, "top1")
    accuracy = [successor_accuracy(train[p], test[p]) for p in range(trace.layers - 1)]
    table = _layer_table(trace.layer_ids, counts, top1_counts, transitions, accuracy)
    summary = _summary(table, trace.num_experts)
    unit = "sequence" if trace.seq_id is not None else "token"
    summary.update(
        tokens=trace.tokens,
        sequences=None if trace.seq_id is None else int(np.unique(trace.seq_id).size),
        top_k=trace.top_k,
        predictability_method=f"held out every {HOLDOUT_EVERY}th {unit}",
    )
    return TraceStats("per-token", table, summary)


def aggregate_stats(agg: AggregateTrace) -> TraceStats:
    """Statistics of an aggregate source (counts and, if present, transitions)."""
    transitions = agg.transitions
    accuracy: list[tuple[float, float]] = []
    method = "none (no transitions in the source)"
    if transitions is not None:
        by_domain = {d: v["transitions"] for d, v in agg.domains.items() if "transitions" in v}
        if len(by_domain) >= 2:
            accuracy = _leave_one_domain_out(by_domain, agg.layers - 1)
            method = f"leave one of {len(by_domain)} domains out"
        else:
            accuracy = [successor_accuracy(transitions[p], transitions[p]) for p in range(agg.layers - 1)]
            method = "in-sample (no per-domain data to hold out)"
    table = _layer_table(agg.layer_ids, agg.counts, agg.counts_top1, transitions, accuracy)
    summary = _summary(table, agg.num_experts)
    summary.update(predictability_method=method)
    return TraceStats("aggregate", table, summary)


def _holdout_mask(trace: Trace) -> np.ndarray:
    if trace.seq_id is None:
        return np.arange(trace.tokens) % HOLDOUT_EVERY == HOLDOUT_EVERY - 1
    _, sequence_index = np.unique(trace.seq_id, return_inverse=True)
    return sequence_index % HOLDOUT_EVERY == HOLDOUT_EVERY - 1


def _leave_one_domain_out(by_domain: dict[str, np.ndarray], pairs: int) -> list[tuple[float, float]]:
    out = []
    for p in range(pairs):
        hits = popular = total = 0.0
        for domain, test in by_domain.items():
            train = sum(v[p] for d, v in by_domain.items() if d != domain)
            weight = float(test[p].sum())
            acc, pop = successor_accuracy(train, test[p])
            hits += acc * weight
            popular += pop * weight
            total += weight
        out.append((hits / total, popular / total) if total else (float("nan"), float("nan")))
    return out


def _layer_table(
    layer_ids: np.ndarray,
    counts: np.ndarray,
    top1_counts: np.ndarray | None,
    transitions: np.ndarray | None,
    accuracy: list[tuple[float, float]],
) -> pd.DataFrame:
    layers = counts.shape[0]
    rows = []
    for li in range(layers):
        has_next = li < layers - 1
        row = {
            "layer": int(layer_ids[li]),
            "alpha": fit_zipf_alpha(counts[li]),
            "alpha_top1": fit_zipf_alpha(top1_counts[li]) if top1_counts is not None else np.nan,
            "hottest_share": float(counts[li].max() / counts[li].sum()),
            "next_layer": int(layer_ids[li + 1]) if has_next else None,
            "entropy_bits": conditional_entropy_bits(transitions[li])
            if has_next and transitions is not None
            else np.nan,
            "predictability": accuracy[li][0] if has_next and accuracy else np.nan,
            "popularity_guess": accuracy[li][1] if has_next and accuracy else np.nan,
        }
        rows.append(row)
    import pandas as pd  # here: only the report's table needs pandas; planning loads none

    return pd.DataFrame(rows)


def _summary(table: pd.DataFrame, experts: int) -> dict[str, Any]:
    def mean(col: str) -> float | None:
        values = table[col].dropna()
        return float(values.mean()) if len(values) else None

    def span(col: str) -> list[float] | None:
        values = table[col].dropna()
        return [float(values.min()), float(values.max())] if len(values) else None

    return {
        "layers": len(table),
        "experts": experts,
        "alpha_mean": mean("alpha"),
        "alpha_range": span("alpha"),
        "alpha_top1_mean": mean("alpha_top1"),
        "hottest_share_mean": mean("hottest_share"),
        "entropy_bits_mean": mean("entropy_bits"),
        "entropy_max_bits": float(np.log2(experts)),
        "predictability_mean": mean("predictability"),
        "popularity_guess_mean": mean("popularity_guess"),
    }


def window_alpha(experts: np.ndarray, num_experts: int, window_batches: int) -> dict[str, float | None]:
    """Mean Zipf α within slow-loop windows of micro-batches `experts[b, s, l, r]`.

    A drifting trace pooled over all phases looks flatter than any window the
    slow loop plans on; this is the skew it actually sees.
    """
    batches = experts.shape[0]
    alphas, alphas_top1 = [], []
    for start in range(0, batches - window_batches + 1, window_batches):
        block = experts[start : start + window_batches]
        topk = block.reshape(-1, block.shape[2], block.shape[3])
        counts = selection_counts(topk, num_experts)
        top1 = selection_counts(topk[:, :, :1], num_experts)
        alphas += [fit_zipf_alpha(c) for c in counts]
        alphas_top1 += [fit_zipf_alpha(c) for c in top1]
    if not alphas:
        return {"alpha_window_mean": None, "alpha_top1_window_mean": None}
    return {
        "alpha_window_mean": float(np.mean(alphas)),
        "alpha_top1_window_mean": float(np.mean(alphas_top1)),
    }
