"""`comoe-opt compare`: the engines' balancers, CoMoE, the limits and the bound, side by side."""

from __future__ import annotations

import argparse
from typing import Any

from comoe_opt.errors import ComoeError
from comoe_opt.evaluator import compare as cmp
from comoe_opt.formats.counts import read_step_counts
from comoe_opt.instance import load_instance
from comoe_opt.trace import instance_batches


def cmd_compare(args: argparse.Namespace) -> dict[str, Any]:
    instance = load_instance(args.instance)
    model = instance.model
    if args.counts is None:
        steps = cmp.step_counts(instance_batches(instance))
    else:
        steps = read_step_counts(
            args.counts,
            model.layers,
            model.experts_per_layer,
            model_layer_ids=model.moe_layer_ids,
            model_layers=model.hidden_layers,
        )
    peers = tuple(args.peers.split(","))
    unknown = sorted(set(peers) - set(cmp.PEERS))
    if unknown:
        raise ComoeError(f"--peers: unknown {', '.join(unknown)} (known: {', '.join(cmp.PEERS)})")
    if args.hindsight_limit is not None and not args.hindsight_limit > 0:
        raise ComoeError(f"--hindsight-limit must be positive, got {args.hindsight_limit}")
    settings = cmp.CompareSettings(
        peers=peers,
        steps=args.steps,
        hindsight_limit_s=args.hindsight_limit,
        bound_windows=args.bound_windows,
    )
    if args.redundant is not None:
        sweep = cmp.redundancy_sweep(instance, steps, args.redundant, settings)
        if args.figure is not None:
            cmp.plot_redundancy(sweep, args.figure)
        return {**sweep, "_text": cmp.redundancy_markdown(sweep)}
    result = cmp.compare(instance, steps, settings)
    if args.figure is not None:
        cmp.plot_cdf(result, args.figure)
    shown: dict[str, Any] = {k: v for k, v in result.items() if k != "imbalance"}  # arrays: figure only
    shown["_text"] = cmp.markdown(result)
    return shown
