"""`comoe-opt gap`: heuristics against exact optima, for the fast loop and the slow loop."""

from __future__ import annotations

import argparse
from typing import Any

from comoe_opt.formats import read_placement
from comoe_opt.instance import load_instance
from comoe_opt.mapping.gap import GapReport, fast_loop_gap
from comoe_opt.planning.gap import slow_loop_gap, summarize_slow_gap
from comoe_opt.trace import instance_batches
from comoe_opt.trace.source import file_batches


def cmd_gap(args: argparse.Namespace) -> dict[str, Any]:
    instance = load_instance(args.instance)
    batches = instance_batches(instance) if args.trace is None else file_batches(instance, args.trace)
    placement = None
    if args.placement is not None:
        placement = read_placement(
            args.placement, batches.layers, batches.num_experts, instance.hardware.chiplets
        ).resident
    report = fast_loop_gap(instance, batches, windows=args.windows, seed=args.seed, placement=placement)
    out = {**report.to_dict(), "_text": format_gap(report)}
    if args.slow_windows and args.trace is None:
        slow = summarize_slow_gap(slow_loop_gap(instance, batches, args.slow_windows))
        out["slow_loop"] = slow.to_dict(orient="records")
        out["_text"] += "\n\n" + format_slow(slow)
    return out


def format_slow(table: Any) -> str:
    shown = table.copy()
    for column in ("mean_gap_to_bound", "max_gap_to_bound", "mean_gap_to_best"):
        shown[column] = shown[column].map(lambda v: f"{100 * v:.3f}%")
    shown["median_time_s"] = shown["median_time_s"].map(lambda v: f"{v:.3f}")
    head = "slow loop: each method's gap to the proven bound (on what a placement changes)"
    return head + "\n" + shown.to_string(index=False)


def format_gap(report: GapReport) -> str:
    meta, table = report.meta, report.summary.copy()
    for column in ("mean_gap", "p95_gap", "max_gap", "optimal_share"):
        table[column] = table[column].map(lambda v: f"{100 * v:.2f}%")
    table["max_deviation_s"] = table["max_deviation_s"].map(lambda v: f"{1e6 * v:.2f}")
    table["median_time_us"] = table["median_time_us"].map(lambda v: f"{v:.0f}")
    table["loads_per_sample"] = table["loads_per_sample"].map(lambda v: f"{v:.1f}")
    table = table.rename(columns={"max_deviation_s": "max_dev_us", "loads_per_sample": "loads"})
    head = (
        f"{meta['instance']}: {meta['samples']} (micro-batch, layer) samples, "
        f"{meta['tokens_per_batch']} tokens x top-{meta['top_k']}, placement {meta['placement']}, "
        f"replica factor {meta['replica_factor']:.2f}"
    )
    return "\n".join([head, table.to_string(index=False)])
