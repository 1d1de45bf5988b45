"""`comoe-opt solve`: the slow loop on one window, or window after window (`--rolling`)."""

from __future__ import annotations

import argparse
import dataclasses
import math
from pathlib import Path
from typing import Any

from comoe_opt.cli.common import option_into
from comoe_opt.errors import ComoeError
from comoe_opt.formats import (
    launch_flags,
    read_step_counts,
    write_placement,
    write_sglang,
    write_vllm_ascend,
)
from comoe_opt.instance import Instance, load_instance
from comoe_opt.planning import plan_window, rolling_horizon
from comoe_opt.residency import Placement
from comoe_opt.results import SolveResult
from comoe_opt.stats.demand import WindowDemand, demand_from_step_counts
from comoe_opt.trace import instance_batches, make_batches, read_trace
from comoe_opt.trace.batching import MicroBatches
from comoe_opt.trace.model import Trace
from comoe_opt.trace.source import check_layer_numbering


def cmd_solve(args: argparse.Namespace) -> dict[str, Any]:
    instance = load_instance(args.instance)
    if args.export and not args.output:
        raise ComoeError("--export needs -o FILE")
    instance = _with_scenarios(instance, args)
    instance = option_into(instance, "--time-limit", "policy.time_limit_s", args.time_limit)
    instance = option_into(instance, "--gap", "policy.mip_gap", args.gap)
    limit, gap = instance.policy.time_limit_s, instance.policy.mip_gap
    if args.rolling:
        if args.counts:
            raise ComoeError("--rolling needs a per-token trace, not --counts")
        return _rolling(instance, _batches(instance, args.trace), args, limit)
    history, counts = _history(instance, args)
    plan = plan_window(instance, history, method=args.method, time_limit_s=limit, mip_gap=gap)
    result, problem = plan.result, plan.problem
    load = plan.demand.tokens if counts is None else counts
    report = _result_dict(result)
    report["balance_scenarios"] = problem.scenarios
    if args.output and result.solution is not None:
        report["output"] = str(_write(instance, result.solution, args, load))
        if args.export:
            report["launch_flags"] = launch_flags(args.export, args.output, result.solution)
    report["_text"] = _format(instance, result, report.get("output"), problem.scenarios)
    if "launch_flags" in report:
        report["_text"] += f"\n  launch the engine with: {report['launch_flags']}"
    return report


def _with_scenarios(instance: Instance, args: argparse.Namespace) -> Instance:
    """The instance with `--scenarios` as its policy's balance scenarios."""
    return option_into(instance, "--scenarios", "policy.balance_scenarios", args.scenarios)


def _batches(instance: Instance, trace_path: Path | None) -> MicroBatches:
    if trace_path is None:
        return instance_batches(instance)
    trace = read_trace(trace_path, num_experts=instance.model.experts_per_layer)
    if not isinstance(trace, Trace):
        raise ComoeError(f"{trace_path}: holds aggregates only; use --counts for load counts")
    if trace.layers != instance.model.layers or trace.top_k != instance.model.top_k:
        raise ComoeError(
            f"{trace_path}: {trace.layers} layers, top-{trace.top_k}; the instance has "
            f"{instance.model.layers} layers, top-{instance.model.top_k}"
        )
    check_layer_numbering(trace, instance.model, trace_path)
    batching = getattr(instance.trace, "batching", "decode")
    return make_batches(trace, instance.trace.tokens_per_batch, batching)


def _history(instance: Instance, args: argparse.Namespace) -> tuple[MicroBatches | WindowDemand, Any]:
    """What the window is planned on: micro-batches, or a demand from load counts (returned too)."""
    model = instance.model
    if args.counts:
        steps = read_step_counts(
            args.counts, model.layers, model.experts_per_layer, model_layer_ids=model.moe_layer_ids
        )
        policy = instance.policy
        demand = demand_from_step_counts(
            steps, instance.trace.tokens_per_batch, model.top_k, policy.balance_scenarios
        )
        # the counts' steps are the scenarios; the plan serves a window of the instance's length
        window = dataclasses.replace(demand, batches=policy.window_batches)
        return window, steps.sum(axis=0)
    batches = _batches(instance, args.trace)
    window = instance.policy.window_batches
    start = args.window * window
    if args.window < 0 or start >= batches.batches:
        raise ComoeError(
            f"--window {args.window} is outside the trace's {math.ceil(batches.batches / window)} windows"
        )
    part = batches.window(start, min(start + window, batches.batches))
    return part, None


def _write(instance: Instance, placement: Placement, args: argparse.Namespace, load: Any) -> Path:
    model = instance.model
    if args.export == "sglang":  # one row per model layer: SGLang indexes the map by layer id
        return write_sglang(
            placement,
            args.output,
            load=load,
            layer_ids=model.moe_layer_ids,
            num_model_layers=model.hidden_layers,
        )
    if args.export == "vllm-ascend":
        return write_vllm_ascend(placement, args.output, load=load)
    return write_placement(placement, args.output, page_gb=instance.model.page_gb, instance=instance.name)


def _rolling(
    instance: Instance, batches: MicroBatches, args: argparse.Namespace, limit: float
) -> dict[str, Any]:
    rows = []
    lines = [f"{instance.name}: rolling horizon, {args.method}, windows of {instance.policy.window_batches}"]
    for plan in rolling_horizon(instance, batches, args.method, time_limit_s=limit):
        row = {"window": plan.window, "start": plan.start, "stop": plan.stop, **_result_dict(plan.result)}
        row["pages_moved"] = plan.pages_moved
        rows.append(row)
        span = f"[{plan.start}, {plan.stop})"
        lines.append(f"window {plan.window:>3} {span}  {plan.result.summary()}  moved {plan.pages_moved}")
    moved = [r["pages_moved"] for r in rows[1:]]
    if moved:
        lines.append(
            f"pages moved per window after the first: mean {sum(moved) / len(moved):.1f}, max {max(moved)}"
        )
    return {"instance": instance.name, "method": args.method, "windows": rows, "_text": "\n".join(lines)}


def _result_dict(result: SolveResult[Placement]) -> dict[str, Any]:
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


def _format(instance: Instance, result: SolveResult[Placement], output: str | None, scenarios: int) -> str:
    r = result.report
    lines = [f"{instance.name}: {result.summary()}"]
    placement = result.solution
    if placement is not None:
        lines += [
            f"  objective terms (ms over the window): balance {r['balance_ms']:.1f}, on-demand loads "
            f"{r['miss_ms']:.1f}, NoP {r['nop_ms']:.1f}, copies {r['migration_ms']:.1f}",
            f"  pages {placement.pages} for {placement.distinct} distinct experts: replica factor "
            f"{placement.replica_factor():.3f} (extra/distinct {placement.extra_replica_ratio():.3f})",
            f"  expected balance {r['expected_balance']:.4f}, pages moved {r['pages_moved']}",
        ]
    if math.isfinite(result.bound) and result.constant:
        lines.append(
            f"  gap on what a placement changes: {result.constant:.6g} of the objective is every token's "
            "least NoP, the same for every placement"
        )
    if scenarios:
        source = (
            "the exact scenario model (row generation)"
            if r.get("cut_rounds")
            else "the replica-count relaxation with per-scenario cuts (--method exact proves more)"
        )
        lines.append(
            f"  balance scored on {scenarios} micro-batches, each routed at its best; bound from {source}"
        )
    if output:
        lines.append(f"  placement written to {output}")
    return "\n".join(lines)
