"""Metrics over all (micro-batch, layer) samples of a run (formulations/latency.md §5)."""

from __future__ import annotations

import numpy as np

from comoe_opt.evaluator.runtime import SampleLog

GB = 1e9


def summarize(log: SampleLog) -> dict[str, float]:
    """One flat row of metrics; per-batch quantities sum over the layers of a micro-batch."""
    lat = log.latency_ms
    pages = np.asarray(log.resident_pages, dtype=float)
    distinct = np.asarray(log.distinct_experts, dtype=float)
    factor = float(np.mean(pages / np.maximum(distinct, 1))) if pages.size else 0.0
    batches = lat.shape[0]
    in_use = log.batch_pages + log.buffered_in_use
    paper_factor = float(np.mean(in_use / np.maximum(log.batch_distinct, 1))) if batches else 0.0
    return {
        "mean_ms": float(lat.mean()),
        "p95_ms": float(np.percentile(lat, 95)),
        "p99_ms": float(np.percentile(lat, 99)),
        "token_gb_per_batch": float(log.token_bytes.sum(axis=1).mean() / GB),
        "load_gb_per_batch": float(log.load_bytes.sum(axis=1).mean() / GB),
        "demand_load_gb_per_batch": float(log.demand_load_bytes.sum(axis=1).mean() / GB),
        "balance": float(log.balance.mean()),
        "token_imbalance_p95": float(np.percentile(log.imbalance_tokens, 95)),
        "token_imbalance_mean": float(log.imbalance_tokens.mean()),
        "replica_factor": factor,
        "extra_replica_ratio": factor - 1.0 if pages.size else 0.0,
        # the paper's accounting: (placed + buffered copies tokens read) / distinct, per micro-batch
        "replica_factor_paper": paper_factor,
        "buffered_in_use_per_batch": float(log.buffered_in_use.mean()) if batches else 0.0,
        "energy_mj_per_layer": float(log.energy_mj.mean()),
        "prefetch_issued": int(log.prefetch_issued),
        "prefetch_denied": int(log.prefetch_denied),
        "prefetch_accuracy": float(log.prefetch_used / log.prefetch_issued) if log.prefetch_issued else 0.0,
        "prefetch_wasted_gb_per_batch": float(log.prefetch_wasted_bytes / GB / batches),
        "pages_migrated": int(log.pages_migrated),
        "copies_cancelled": int(log.copies_cancelled),
        "copies_rolled_back": int(log.copies_rolled_back),
        "micro_batches": int(batches),
    }


def peer_summary(rows: list[dict]) -> dict | None:
    """CoMoE against the strongest EPLB (optimal routing) and the oracle, on P95 token imbalance:
    its lead, the share of the gap from EPLB to the oracle it closes, and its copies against
    EPLB's (None unless `eplb-flow`, `oracle` and `comoe` were all evaluated)."""
    by = {r["strategy"]: r for r in rows}
    if not {"eplb-flow", "oracle", "comoe"} <= by.keys():
        return None
    eplb, oracle, comoe = (by[k]["token_imbalance_p95"] for k in ("eplb-flow", "oracle", "comoe"))
    span = eplb - oracle
    return {
        "lead_over_eplb_optimal_routing": (eplb - comoe) / eplb,
        "gap_closed_to_oracle": (eplb - comoe) / span if span > 0 else None,
        "copies_vs_eplb": (
            by["comoe"]["pages_migrated"] / by["eplb-flow"]["pages_migrated"]
            if by["eplb-flow"]["pages_migrated"]
            else None
        ),
    }
