"""Command-line interface: every verb is a thin call into the library.

Every verb accepts `--json` and then prints one JSON object on stdout. User
errors print one line on stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import pandas as pd

from comoe_opt import __version__
from comoe_opt.bench import commands as bench_commands
from comoe_opt.errors import ComoeError
from comoe_opt.instance import Instance, load_instance
from comoe_opt.residency import commands as residency_commands
from comoe_opt.simulate import commands as simulate_commands
from comoe_opt.trace import (
    Trace,
    aggregate_stats,
    instance_batches,
    instance_trace,
    read_trace,
    trace_stats,
    write_trace,
)
from comoe_opt.trace.stats import TraceStats, window_alpha

USER_ERROR = 2


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors on one line, like every other user error."""

    def error(self, message: str) -> NoReturn:
        self.exit(USER_ERROR, f"{self.prog}: error: {message} (see --help)\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "handler"):
        parser.print_help()
        return USER_ERROR
    try:
        result = args.handler(args)
    except ComoeError as exc:
        print(f"comoe-opt: error: {exc}", file=sys.stderr)
        return USER_ERROR
    except KeyboardInterrupt:
        print("comoe-opt: interrupted", file=sys.stderr)
        return 130
    emit(result, args.json)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="comoe-opt", description="MoE expert placement and token mapping for chiplets.")
    parser.add_argument("--version", action="version", version=f"comoe-opt {__version__}")
    verbs = parser.add_subparsers(title="commands", metavar="COMMAND", parser_class=_Parser)

    run = add_verb(verbs, "run", "run the main job on an instance", cmd_run)
    run.add_argument("instance", type=Path, help="instance TOML file")

    inst = verbs.add_parser("instance", help="instance files").add_subparsers(
        title="instance commands", metavar="COMMAND", parser_class=_Parser
    )
    show = add_verb(
        inst, "show", "validate an instance and print it with every default filled in", cmd_instance_show
    )
    show.add_argument("instance", type=Path)

    trace = verbs.add_parser("trace", help="routing traces").add_subparsers(
        title="trace commands", metavar="COMMAND", parser_class=_Parser
    )
    gen = add_verb(trace, "gen", "generate or read an instance's trace and write it to a file", cmd_trace_gen)
    gen.add_argument("instance", type=Path, help="instance TOML file")
    gen.add_argument("-o", "--output", type=Path, required=True, help="trace file (.npz or .parquet)")
    info = add_verb(trace, "info", "statistics of a trace file or of an instance's trace", cmd_trace_info)
    info.add_argument("source", type=Path, help="trace file (.npz, .parquet) or instance (.toml)")
    residency_commands.register(verbs, add_verb)
    simulate_commands.register(verbs, add_verb)
    bench_commands.register(verbs, add_verb)
    from comoe_opt.mapping.commands import register as register_mapping  # here: it imports add_verb

    register_mapping(verbs)
    return parser


def add_verb(
    group: Any, name: str, help_text: str, handler: Callable[[argparse.Namespace], dict]
) -> argparse.ArgumentParser:
    sub = group.add_parser(name, help=help_text, description=help_text)
    sub.add_argument("--json", action="store_true", help="print the result as one JSON object")
    sub.set_defaults(handler=handler)
    return sub


# ------------------------------------------------------------------ verbs


def cmd_run(args: argparse.Namespace) -> dict[str, Any]:
    """Main job: for now, the statistics of the instance's trace."""
    instance = load_instance(args.instance)
    return _instance_trace_report(instance)


def cmd_instance_show(args: argparse.Namespace) -> dict[str, Any]:
    instance = load_instance(args.instance)
    return {"instance": instance.name, "toml": instance.to_toml(), "_text": instance.to_toml()}


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
    stats = trace_stats(trace)
    stats.summary.update(micro_batches=batches.batches, tokens_per_batch=batches.tokens_per_batch)
    stats.summary.update(window_alpha(batches.experts, batches.num_experts, instance.policy.window_batches))
    return _stats_report(stats, f"instance {instance.name}")


# ----------------------------------------------------------------- output


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


def emit(result: dict[str, Any], as_json: bool) -> None:
    """Print a verb's result: its `_text` for people, the rest as JSON with --json."""
    if as_json:
        payload = {k: v for k, v in result.items() if not k.startswith("_")}
        print(json.dumps(payload, default=_json_default, allow_nan=False))
    else:
        print(result.get("_text", json.dumps(result, default=_json_default, indent=2)))


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot serialise {type(value).__name__}")


if __name__ == "__main__":
    raise SystemExit(main())
