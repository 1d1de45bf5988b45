"""`comoe-opt compare`: the engines' balancers, CoMoE, the limits and the bound, side by side."""

from __future__ import annotations

import argparse
from typing import Any

from comoe_opt.cli.common import names_in
from comoe_opt.cli.serving import check_redundant, gpu_of, instance_and_steps, ready_figure
from comoe_opt.errors import ComoeError
from comoe_opt.evaluator import advice, plots
from comoe_opt.evaluator import compare as cmp
from comoe_opt.evaluator import frontier as front_
from comoe_opt.evaluator import sweep as sweep_
from comoe_opt.residency.even_split import SPLITS
from comoe_opt.schema import plain_number
from comoe_opt.stats.regime import counts_regime
from comoe_opt.trace.counts import read_step_counts
from comoe_opt.trace.source import instance_step_counts


def cmd_compare(args: argparse.Namespace) -> dict[str, Any]:
    peers = _check_flags(args)
    ready_figure(args.figure, "--figure")
    instance, dumped = instance_and_steps(args, args.redundant or ())
    sized = dumped is None or args.model is not None or args.expert_mb is not None  # GB are known
    if args.redundant is not None:
        check_redundant(instance, args.redundant, built=dumped is not None, sized=sized, gpu=gpu_of(args))
    model = instance.model
    if dumped is not None:
        steps = dumped
    elif args.counts is None:
        steps = instance_step_counts(instance)
    else:
        steps = read_step_counts(
            args.counts,
            model.layers,
            model.experts_per_layer,
            model_layer_ids=model.moe_layer_ids,
            model_layers=model.hidden_layers,
        )
    used = min(steps.shape[0], args.steps) if args.steps else steps.shape[0]
    if used < 2:  # one step to plan on, one to serve: named where it came from
        source = (
            f"--steps {args.steps}"
            if args.steps and args.steps < 2
            else (str(args.counts) if args.counts is not None else f"{args.instance}'s trace")
        )
        raise ComoeError(
            f"{source}: {used} step with load; compare needs at least 2 (one to plan on, one to serve)"
        )
    settings = cmp.CompareSettings(
        peers=peers,
        steps=args.steps,
        hindsight_limit_s=args.hindsight_limit,
        crossfit=args.crossfit,
        bound_windows=args.bound_windows,
        jobs=args.jobs,
        replan_every=args.replan_every,
        comoe_splits=SPLITS if args.comoe_split == "both" else (args.comoe_split,),
    )
    regime = counts_regime(steps, instance.costs) if sized else None
    theirs = advice.their_balancer(peers)
    if args.redundant is not None:
        sweep = sweep_.redundancy_sweep(instance, steps, args.redundant, settings, sized=sized)
        if args.figure is not None:
            plots.plot_redundancy(sweep, args.figure)
        lines = advice.sweep_answer(sweep, theirs, "GB" if sized else "slots", regime)
        return {**sweep, "answer": lines, "_text": _with_answer(sweep_.redundancy_markdown(sweep), lines)}
    result = cmp.compare(instance, steps, settings)
    if args.figure is not None:
        plots.plot_cdf(result, args.figure)
    shown: dict[str, Any] = {k: v for k, v in result.items() if k != "imbalance"}  # arrays: figure only
    shown["_text"] = cmp.markdown(result)
    if not sized:  # the time columns are in units of an assumed expert size, not milliseconds
        shown["_text"] += (
            "\n\nThe time columns assume 1 GB per expert (no --model or --expert-mb): compare rows"
            " with each other, not with a clock."
        )
    if args.frontier:
        sweep = {
            "weights": args.migration_weights or front_.MIGRATION_WEIGHTS,
            "move_costs": args.move_costs or front_.MOVE_COSTS,
        }
        front = front_.frontier(instance, steps, settings, peers=front_.peer_points(result), **sweep)
        if args.figure is not None:
            plots.plot_frontier(front, args.figure.with_name(args.figure.stem + "-frontier.png"))
        shown["frontier"] = front
        shown["_text"] += "\n\n" + front_.frontier_markdown(front)
    shown["answer"] = advice.table_answer(result, theirs, regime, timed=sized)
    shown["_text"] = _with_answer(shown["_text"], shown["answer"])
    return shown


MAX_SECONDS = 86_400  # a day: a time limit beyond is a slip of a digit


def _check_flags(args: argparse.Namespace) -> tuple[str, ...]:
    """Flags that conflict, or that would be ignored, refused before any work; the peers named."""
    if args.slots is not None and args.redundant is not None:
        raise ComoeError(
            "--slots and --redundant exclude each other: --redundant sweeps the slots beyond one per expert"
        )
    for name in ("migration_weights", "move_costs"):
        if getattr(args, name) is not None and not args.frontier:
            raise ComoeError(f"--{name.replace('_', '-')}: sweeps of the frontier; add --frontier")
    if args.redundant is not None and args.frontier:
        raise ComoeError("--frontier and --redundant: the frontier is drawn at one slot count; give one")
    if args.hindsight_limit is not None and not 0 < args.hindsight_limit <= MAX_SECONDS:
        raise ComoeError(
            f"--hindsight-limit: seconds in (0, {MAX_SECONDS:,}], got {plain_number(args.hindsight_limit)}"
        )
    return tuple(names_in(args.peers, cmp.COMPARE_PEERS, "--peers"))


def _with_answer(table: str, lines: list[str]) -> str:
    return table + "\n\nAnswer:\n" + "\n".join(f"- {line}" for line in lines)
