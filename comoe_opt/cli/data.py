"""`comoe-opt instance show`, `trace gen` and `trace info`: instances and traces."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pandas as pd

from comoe_opt.instance import Instance, load_instance
from comoe_opt.stats.trace_stats import TraceStats, aggregate_stats, trace_stats, window_alpha
from comoe_opt.trace import Trace, instance_batches, instance_trace, read_trace, write_trace
from comoe_opt.trace.source import batched_part


def cmd_instance_show(args: argparse.Namespace) -> dict[str, Any]:
    instance = load_instance(args.instance)
    return {"instance": instance.name, "toml": instance.to_toml(), "_text": instance.to_toml()}


def cmd_instance_new(args: argparse.Namespace) -> dict[str, Any]:
    """The serving instance for a dump, written with every default's unit and source."""
    from comoe_opt.cli.serving import ready_output, setup_of
    from comoe_opt.files import atomic_path
    from comoe_opt.serving import instance_toml

    ready_output(args.output, "-o")
    text = instance_toml(args.from_counts, setup_of(args), args.output)
    with atomic_path(args.output) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return {"path": str(args.output), "toml": text, "_text": f"wrote {args.output}"}


def cmd_trace_gen(args: argparse.Namespace) -> dict[str, Any]:
    instance = load_instance(args.instance)
    trace = instance_trace(instance)
    path = write_trace(trace, args.output)
    text = f"wrote {path}: {trace.tokens} tokens x {trace.layers} layers x top-{trace.top_k}"
    return {
        "path": str(path),
        "tokens": trace.tokens,
        "layers": trace.layers,
        "top_k": trace.top_k,
        "experts": trace.num_experts,
        "_text": text,
    }


def cmd_trace_info(args: argparse.Namespace) -> dict[str, Any]:
    source: Path = args.source
    if source.suffix.lower() == ".toml":
        return _instance_trace_report(load_instance(source))
    loaded = read_trace(source)
    stats = trace_stats(loaded) if isinstance(loaded, Trace) else aggregate_stats(loaded)
    return _stats_report(stats, str(source))


def _instance_trace_report(instance: Instance) -> dict[str, Any]:
    trace = instance_trace(instance)
    batches = instance_batches(instance, trace)
    stats = trace_stats(batched_part(trace, batches))
    stats.summary.update(micro_batches=batches.batches, tokens_per_batch=batches.tokens_per_batch)
    stats.summary.update(window_alpha(batches.experts, batches.num_experts, instance.policy.window_batches))
    return _stats_report(stats, f"instance {instance.name}")


def _stats_report(stats: TraceStats, label: str) -> dict[str, Any]:
    report = {"source": label, **stats.to_dict()}
    report["_text"] = format_stats(stats, label)
    return report


def format_stats(stats: TraceStats, label: str) -> str:
    s = stats.summary
    table = stats.layers.copy()
    table["next_layer"] = table["next_layer"].map(lambda v: "-" if pd.isna(v) else f"{int(v)}")
    lines = [
        f"{label}: {stats.kind} trace, {s['layers']} logged layers, {s['experts']} experts"
        + (f", top-{s['top_k']}, {s['tokens']} tokens" if "tokens" in s else ""),
        table.to_string(index=False, float_format=lambda v: f"{v:.3f}", na_rep="-"),
        "",
        f"Zipf alpha (load, all ranks)   mean {_f(s['alpha_mean'])}  range {_span(s['alpha_range'])}",
        f"Zipf alpha (rank-1 choices)    mean {_f(s['alpha_top1_mean'])}",
    ]
    if s.get("alpha_window_mean") is not None:
        lines.append(
            f"Zipf alpha within windows      load {_f(s['alpha_window_mean'])}"
            f"  rank-1 {_f(s['alpha_top1_window_mean'])}"
        )
    lines += [
        f"hottest expert share           mean {_f(s['hottest_share_mean'])}",
        f"H(next | current) rank-1       mean {_f(s['entropy_bits_mean'])}"
        f" of {_f(s['entropy_max_bits'])} bits",
        f"next rank-1 predicted          {_f(s['predictability_mean'])}  (popularity guess "
        f"{_f(s['popularity_guess_mean'])}; {s['predictability_method']})",
    ]
    return "\n".join(lines)


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _span(values: list[float] | None) -> str:
    return "-" if not values else f"{values[0]:.3f}-{values[1]:.3f}"
