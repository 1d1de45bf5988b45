"""`comoe-opt solve`: the slow loop on one window, or window after window (`--rolling`)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from comoe_opt.cli.common import option_into
from comoe_opt.cli.serving import instance_and_steps, ready_output
from comoe_opt.errors import ComoeError
from comoe_opt.formats import ModelLayers, export_placement, launch_flags, write_placement
from comoe_opt.instance import CountsTrace, Instance
from comoe_opt.planning import counts_history, plan_window, rolling_horizon
from comoe_opt.planning.rolling import reproducible_limit
from comoe_opt.residency import Placement
from comoe_opt.residency.report import LayersReport, ModelReport, ResidencyResult
from comoe_opt.stats.regime import batch_regime
from comoe_opt.trace import load_batches
from comoe_opt.trace.batching import MicroBatches
from comoe_opt.trace.source import instance_step_counts


def cmd_solve(args: argparse.Namespace) -> dict[str, Any]:
    if args.export and not args.output:
        raise ComoeError("--export needs -o FILE")
    if args.instance is None and args.rolling:
        raise ComoeError("--rolling needs an instance file and a per-token trace")
    ready_output(args.output, "-o")
    instance, _ = instance_and_steps(args)
    instance = _with_scenarios(instance, args)
    instance = option_into(instance, "--time-limit", "policy.time_limit_s", args.time_limit)
    instance = option_into(instance, "--gap", "policy.mip_gap", args.gap)
    instance = option_into(instance, "--dispatch", "policy.split", args.dispatch)
    limit, gap = instance.policy.time_limit_s, instance.policy.mip_gap
    if args.work_limits:
        if args.time_limit is not None:
            raise ComoeError("--work-limits and --time-limit exclude each other")
        limit = reproducible_limit(args.method)
    if args.rolling:
        if args.counts:
            raise ComoeError("--rolling needs a per-token trace, not --counts")
        if args.window is not None:
            raise ComoeError("--window: --rolling plans every window")
        instance, batches = load_batches(instance, args.trace)
        return _rolling(instance, batches, args, limit)
    window_batches: MicroBatches | None = None  # the window's tokens, where a trace gives them
    if args.counts or (args.trace is None and isinstance(instance.trace, CountsTrace)):
        # a load dump: all its steps, or the window `--window` names
        dump = args.counts if args.counts else instance_step_counts(instance)
        history, counts = counts_history(instance, dump, window=args.window)
        plan = plan_window(instance, history, method=args.method, time_limit_s=limit, mip_gap=gap)
    else:
        instance, batches = load_batches(instance, args.trace)
        window = 0 if args.window is None else args.window
        window_batches = batches.planning_window(window, instance.policy.window_batches, "--window")
        counts = None
        plan = plan_window(instance, window_batches, method=args.method, time_limit_s=limit, mip_gap=gap)
    result, problem = plan.result, plan.problem
    load = plan.demand.tokens if counts is None else counts
    report = _result_dict(result)
    report["balance_scenarios"] = problem.scenarios
    report["layer_ids"] = instance.model.moe_layer_ids
    if args.output and result.solution is not None:
        report["output"] = str(_write(instance, result.solution, args, load))
        if args.export:
            report["launch_flags"] = launch_flags(args.export, args.output, result.solution)
    report["_text"] = _format(instance, result, report.get("output"), problem.scenarios)
    if window_batches is not None:  # the window's tokens say whether a replica can shorten a layer
        regime = batch_regime(window_batches.experts, window_batches.num_experts, instance.costs)
        report["regime"] = regime.to_dict()
        report["_text"] += "\n  " + regime.summary()
    if "launch_flags" in report:
        report["_text"] += f"\n  launch the engine with: {report['launch_flags']}"
    return report


def _with_scenarios(instance: Instance, args: argparse.Namespace) -> Instance:
    """The instance with `--scenarios` as its policy's balance scenarios."""
    return option_into(instance, "--scenarios", "policy.balance_scenarios", args.scenarios)


def _write(instance: Instance, placement: Placement, args: argparse.Namespace, load: Any) -> Path:
    if args.export:  # engines address model layers: the instance's layer ids place each row
        layers = ModelLayers.of(instance.model)
        return export_placement(args.export, placement, args.output, load=load, layers=layers)
    return write_placement(placement, args.output, page_gb=instance.model.page_gb, instance=instance.name)


def _rolling(
    instance: Instance, batches: MicroBatches, args: argparse.Namespace, limit: float
) -> dict[str, Any]:
    rows = []
    lines = [f"{instance.name}: rolling horizon, {args.method}, windows of {instance.policy.window_batches}"]
    for plan in rolling_horizon(instance, batches, args.method, time_limit_s=limit):
        row = {"window": plan.window, "start": plan.start, "stop": plan.stop, **_result_dict(plan.result)}
        row["pages_moved"] = plan.pages_moved
        row["migration_weight"] = plan.weight.to_dict()  # with the backtest behind it, where one ran
        rows.append(row)
        span = f"[{plan.start}, {plan.stop})"
        weight = f"  weight {plan.weight.weight:g}" + (
            " (backtest)" if plan.weight.chosen_at is not None else ""
        )
        lines.append(
            f"window {plan.window:>3} {span}  {plan.result.summary()}  moved {plan.pages_moved}{weight}"
        )
    moved = [r["pages_moved"] for r in rows[1:]]
    if moved:
        lines.append(
            f"pages moved per window after the first: mean {sum(moved) / len(moved):.1f}, max {max(moved)}"
        )
    return {"instance": instance.name, "method": args.method, "windows": rows, "_text": "\n".join(lines)}


def _result_dict(result: ResidencyResult) -> dict[str, Any]:
    out = result.to_dict()
    placement = result.solution
    if placement is not None:
        out.update(
            pages=placement.pages,
            distinct_experts=placement.distinct,
            replica_factor=placement.replica_factor(),
            extra_replica_ratio=placement.extra_replica_ratio(),
        )
    return out


def _format(instance: Instance, result: ResidencyResult, output: str | None, scenarios: int) -> str:
    report, terms = result.report, result.report.terms
    lines = [f"{instance.name}: {result.summary()}"]
    placement = result.solution
    if placement is not None and terms is not None:
        lines += [
            f"  objective terms (ms over the window): balance {terms.balance_ms:.1f}, on-demand loads "
            f"{terms.miss_ms:.1f}, NoP {terms.nop_ms:.1f}, copies {terms.migration_ms:.1f}",
            f"  pages {placement.pages} for {placement.distinct} distinct experts: replica factor "
            f"{placement.replica_factor():.3f} (extra/distinct {placement.extra_replica_ratio():.3f})",
            f"  expected balance {terms.expected_balance:.4f}, pages moved {terms.pages_moved}",
        ]
        if report.layout_moves:
            lines.append(
                f"  laid out within {instance.policy.layer_slots} slots per layer on each device"
                f" (policy.layer_slots): {report.layout_moves} replica(s) moved or dropped"
            )
    if math.isfinite(result.bound) and result.constant:
        lines.append(
            f"  gap on what a placement changes: {result.constant:.6g} of the objective is every token's "
            "least NoP, the same for every placement"
        )
    if scenarios and isinstance(report, ModelReport | LayersReport):
        source = (
            report.bound_from if isinstance(report, LayersReport) else _bound_source(report, result.bound)
        )
        lines.append(
            f"  balance scored on {scenarios} micro-batches, each routed at its best; bound from {source}"
        )
    timing = report.timing
    if timing.stopped_by_time_limit:
        cut = "; ".join(timing.stopped_by_time_limit)
        lines.append(f"  the time limit ({timing.time_limit_s:g} s) cut short: {cut}")
    if output:
        lines.append(f"  placement written to {output}")
    return "\n".join(lines)


def _bound_source(report: ModelReport, bound: float) -> str:
    """Which of `milp`'s and `exact`'s bounds the reported one is (the largest, formulations/residency.md);
    on a tie the certified class LP."""
    sources = [
        (report.class_bound, "the hop-class LP (its certificate is in --json)"),
        (report.lagrangian_bound, "the Lagrangian over layers at the class LP's prices"),
        (report.group_bound, "scenario groups placed exactly at those prices (check in --json)"),
        (report.cut_model_bound, "the exact scenario model (row generation)"),
        (report.full_model_bound, "the full model"),
    ]
    for value, name in sources:
        if value is not None and math.isclose(value, bound, rel_tol=1e-9, abs_tol=1e-12):
            return name
    return "the replica-count relaxation with per-scenario cuts"
