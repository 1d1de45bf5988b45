"""The `comoe-opt` argument parser: every verb and option, with its help.

Building it imports no solver and no data library: each verb's handler is named by module and
function and imported only when that verb runs, so `comoe-opt --help` answers at once.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from comoe_opt import __version__
from comoe_opt.cli.choices import (
    COMPARE_PEERS,
    DEFAULT_PAPER_INSTANCE,
    DEFAULT_REGIME_INSTANCE,
    DEFAULT_STRATEGIES,
    EXPORT_FORMATS,
    PAPER_SWEEP_BATCHES,
    PAPER_TABLE5_BATCHES,
    RESIDENCY_METHODS,
    STRATEGIES,
    described,
)
from comoe_opt.cli.common import Parser, int_in
from comoe_opt.costs import REPLAN_EVERY
from comoe_opt.gpus import DEFAULT_GPU, GPUS
from comoe_opt.parallel import available_cores


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="comoe-opt",
        description="MoE expert placement and token mapping for chiplets and expert-parallel devices.",
        epilog="Every verb takes --json. User errors print one line on stderr and exit with status 2.",
    )
    parser.add_argument("--version", action="version", version=f"comoe-opt {__version__}")
    verbs = parser.add_subparsers(title="commands", metavar="COMMAND", parser_class=Parser)
    for register in (_data, _solve, _gap, _compare, _evaluate, _paper, _bench):
        register(verbs)
    return parser


def lazy(module: str, function: str) -> Callable[[argparse.Namespace], dict[str, Any]]:
    """A handler that imports `comoe_opt.cli.<module>` only when its verb runs."""

    def handler(args: argparse.Namespace) -> dict[str, Any]:
        return getattr(importlib.import_module(f"comoe_opt.cli.{module}"), function)(args)

    return handler


def add_verb(group: Any, name: str, help_text: str, handler: Callable) -> argparse.ArgumentParser:
    sub = group.add_parser(name, help=help_text, description=help_text)
    sub.add_argument("--json", action="store_true", help="print the result as one JSON object")
    sub.set_defaults(handler=handler)
    return sub


def _data(verbs: Any) -> None:
    inst = verbs.add_parser("instance", help="instance files").add_subparsers(
        title="instance commands", metavar="COMMAND", parser_class=Parser
    )
    show = add_verb(
        inst,
        "show",
        "validate an instance and print it with every default filled in",
        lazy("data", "cmd_instance_show"),
    )
    show.add_argument("instance", type=Path, help="instance TOML file")
    new = add_verb(
        inst,
        "new",
        "write the instance of serving GPUs for a load dump (each default with its unit and source)",
        lazy("data", "cmd_instance_new"),
    )
    new.add_argument("--from-counts", type=Path, required=True, metavar="DUMP", help=COUNTS_HELP)
    serving_flags(new, redundant=True)
    new.add_argument("-o", "--output", type=Path, required=True, help="instance TOML file to write")
    trace = verbs.add_parser("trace", help="routing traces").add_subparsers(
        title="trace commands", metavar="COMMAND", parser_class=Parser
    )
    gen = add_verb(
        trace,
        "gen",
        "generate or read an instance's trace and write it to a file",
        lazy("data", "cmd_trace_gen"),
    )
    gen.add_argument("instance", type=Path, help="instance TOML file")
    gen.add_argument("-o", "--output", type=Path, required=True, help="trace file (.npz or .parquet)")
    info = add_verb(
        trace,
        "info",
        "statistics of a trace file or of an instance's trace",
        lazy("data", "cmd_trace_info"),
    )
    info.add_argument("source", type=Path, help="trace file (.npz, .parquet) or instance (.toml)")


def _solve(verbs: Any) -> None:
    sub = add_verb(
        verbs,
        "solve",
        "expert residency and replicas for a trace window (the slow loop)",
        lazy("solve", "cmd_solve"),
    )
    sub.add_argument("instance", type=Path, nargs="?", help="instance TOML file (or --counts with --gpus)")
    source = sub.add_mutually_exclusive_group()
    source.add_argument("--trace", type=Path, help="per-token trace file instead of the instance's trace")
    source.add_argument(
        "--counts",
        type=Path,
        help="expert-load counts instead of a trace: JSON or .npz, logical_count [layers, experts]"
        " or [steps, layers, experts]",
    )
    sub.add_argument(
        "--method",
        choices=tuple(RESIDENCY_METHODS),
        default="milp",
        metavar="METHOD",
        help=f"(default milp) {described(RESIDENCY_METHODS)}",
    )
    sub.add_argument(
        "--window",
        type=int_in(0, 10**6),
        help="which window of the trace (default 0); with load counts, which window of their steps"
        " (default: all of them)",
    )
    sub.add_argument("--rolling", action="store_true", help="solve every window in turn (rolling horizon)")
    sub.add_argument("--time-limit", type=float, help="seconds, > 0 (default: policy.time_limit_s)")
    sub.add_argument(
        "--work-limits",
        action="store_true",
        help="no time limit: every phase ends on a work limit sized to the instance, as evaluations plan"
        " (the same plan on any machine and load; residency/schedule.py)",
    )
    sub.add_argument("--gap", type=float, help="relative MIP gap in [0, 1] (default: policy.mip_gap)")
    sub.add_argument(
        "--dispatch",
        choices=("best", "even"),
        help="the dispatch to plan for (policy.split): even = each expert's tokens shared evenly by its"
        " replicas (vLLM, vLLM-Ascend, SGLang's static and dynamic); best = the best split (SGLang's lp,"
        " our flow) (default: policy.split, best)",
    )
    sub.add_argument(
        "--scenarios",
        type=int,
        help="score balance on this many sampled micro-batches, 0 = on the mean load "
        "(default: policy.balance_scenarios)",
    )
    sub.add_argument("-o", "--output", type=Path, help="write the placement (our JSON, or --export format)")
    sub.add_argument(
        "--export",
        choices=EXPORT_FORMATS,
        help="write the placement for a serving engine (see docs/placement-format.md)",
    )
    serving_flags(sub, redundant=True)


def _gap(verbs: Any) -> None:
    gap = add_verb(
        verbs,
        "gap",
        "heuristics against exact optima: each token-mapping method's makespan gap (fast loop) and "
        "each residency heuristic's objective gap to the MILP bound (slow loop)",
        lazy("gap", "cmd_gap"),
    )
    gap.add_argument("instance", type=Path, help="instance TOML file")
    gap.add_argument("--trace", type=Path, help="per-token trace (.npz/.parquet) instead of the instance's")
    gap.add_argument(
        "--windows", type=int_in(1, 10**6), default=200, help="(micro-batch, layer) samples (default 200)"
    )
    gap.add_argument("--placement", type=Path, help="placement JSON (comoe-opt solve -o) for the fast loop")
    gap.add_argument(
        "--slow-windows",
        type=int_in(0, 10**4),
        default=3,
        help="slow-loop windows to compare heuristics with the MILP on (default 3)",
    )
    gap.add_argument(
        "--seed", type=int_in(0, 2**63 - 1), default=0, help="seed of the sample draw, >= 0 (default 0)"
    )


def _compare(verbs: Any) -> None:
    cmp = add_verb(
        verbs,
        "compare",
        "the engines' balancers (SGLang, vLLM, vLLM-Ascend), EPLB and CoMoE under even, LP and flow routing,"
        " beside the oracle, the hindsight limit and the milp bound",
        lazy("compare", "cmd_compare"),
    )
    cmp.add_argument("instance", type=Path, nargs="?", help="instance TOML file (or --counts with --gpus)")
    cmp.add_argument("--counts", type=Path, help="per-step expert counts (SGLang recorder dump, .npz, JSON)")
    cmp.add_argument("--steps", type=int_in(0, 10**7), default=0, help="use the first N steps (0 = all)")
    cmp.add_argument(
        "--redundant",
        type=int_list,
        metavar="R1,R2,...",
        help="sweep redundant slots per layer instead (e.g. 0,8,16): P95 and gap per peer, GB per device",
    )
    cmp.add_argument("--peers", default=",".join(COMPARE_PEERS), metavar="A,B,...", help="peers to plan")
    cmp.add_argument(
        "--hindsight-limit",
        type=float,
        default=None,
        help="seconds of `exact` per window for hindsight (default: work limits, machine-independent)",
    )
    cmp.add_argument(
        "--crossfit",
        action="store_true",
        help="also hindsight cross-fitted: each window's even steps planned for its odd ones and back"
        " (the window's load known, not the steps scored; two more `exact` solves per window)",
    )
    cmp.add_argument(
        "--bound-windows", type=int_in(0, 10**4), default=8, help="windows the milp bound is taken on (8)"
    )
    cmp.add_argument(
        "--jobs",
        type=int_in(1, 1024),
        default=2,
        help="worker processes for the peers' replays, the limits and the bound (default 2; the table"
        " is the same with any number)",
    )
    cmp.add_argument(
        "--replan-every",
        type=int_in(1, 10**9),
        default=REPLAN_EVERY,
        metavar="STEPS",
        help="steps between your engine's re-plans: a re-plan's net time is the time it saves per step"
        f" over this many steps, less its stall (default {REPLAN_EVERY}, vLLM's EPLB step interval);"
        " CoMoE prices its copies over them too (policy.replan_every, unless the instance sets it)",
    )
    cmp.add_argument(
        "--comoe-split",
        choices=("both", "best", "even"),
        default="both",
        help="the dispatch CoMoE plans for (policy.split): both = its even-split rows from a plan made for"
        " the even split, its lp and flow rows from one made for the best split (two plans); best or"
        " even = one plan scored under every dispatch (default both)",
    )
    cmp.add_argument("--figure", type=Path, help="write the figure (PNG) here (a missing folder is created)")
    cmp.add_argument(
        "--frontier",
        action="store_true",
        help="also sweep CoMoE's policy.migration_weight and the drop-in's move_cost: P95 against copies"
        " per re-plan, and each peer beaten at equal copies or not (with --figure: NAME-frontier.png)",
    )
    cmp.add_argument(
        "--migration-weights",
        type=float_list,
        metavar="W1,W2,...",
        help="--frontier: policy.migration_weight values to sweep (default 0,0.01,0.03,0.1,0.3,1,5; the"
        " instance's own is added)",
    )
    cmp.add_argument(
        "--move-costs",
        type=float_list,
        metavar="C1,C2,...",
        help="--frontier: the drop-in's move_cost values to sweep (default 0,0.0005,0.002,0.008,0.016)",
    )
    serving_flags(cmp, redundant=False)


COUNTS_HELP = "per-step expert counts [steps, layers, experts] (SGLang recorder dump, .npz, JSON)"


def serving_flags(sub: argparse.ArgumentParser, redundant: bool) -> None:
    """The deployment of serving GPUs that `--counts DUMP` is planned for, with no instance file
    (comoe_opt/serving.py): GPUs, nodes, slots and the model's expert size."""
    group = sub.add_argument_group("serving GPUs, no instance file (with --counts)")
    group.add_argument("--gpus", type=int_in(1, 1024), help="expert-parallel GPUs")
    group.add_argument("--nodes", type=int_in(1, 1024), default=1, help="nodes the GPUs span (default 1)")
    slots = group.add_mutually_exclusive_group() if redundant else group
    slots.add_argument(
        "--slots",
        type=int_in(1, 10**6),
        help="expert slots per layer over all GPUs (default: one per expert)",
    )
    if redundant:
        slots.add_argument(
            "--redundant", type=int_in(0, 10**6), help="redundant slots per layer beyond one per expert"
        )
    size = group.add_mutually_exclusive_group()
    size.add_argument(
        "--model",
        metavar="NAME",
        help="a public MoE model's preset: its expert size and MoE layers"
        " (comoe_opt/presets.py: deepseek-v3, qwen3-30b-a3b, gpt-oss-120b, ...)",
    )
    size.add_argument(
        "--expert-mb", type=float, metavar="MB", help="one expert's weights, MB (instead of --model)"
    )
    group.add_argument(
        "--gpu",
        metavar="KIND",
        help=f"the GPU: its memory, HBM bandwidth, peak and links (comoe_opt/gpus.py: {', '.join(GPUS)};"
        f" default {DEFAULT_GPU})",
    )
    for flag, what in (
        ("--gpu-memory-gb", "GB of one GPU's memory"),
        ("--gpu-hbm-gb-s", "GB/s of one GPU's HBM"),
        ("--gpu-tflops", "TFLOP/s, one GPU's dense peak for the experts' weight type"),
        ("--scale-up-gb-s", "GB/s into a GPU from its node, per direction"),
        ("--scale-out-gb-s", "GB/s into a GPU from another node, per direction"),
    ):
        group.add_argument(flag, type=float, metavar="X", help=f"{what} (instead of --gpu's)")


MAX_LIST = 64  # values a list flag takes: each is a whole run of the sweep


def float_list(text: str) -> list[float]:
    """An argparse type: comma-separated finite non-negative numbers, at most `MAX_LIST`."""
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be numbers separated by commas, got {_short(text)}") from None
    if not values or not all(0 <= v < float("inf") for v in values):
        raise argparse.ArgumentTypeError(f"must be finite non-negative numbers, got {_short(text)}")
    return _few(values)


def int_list(text: str) -> list[int]:
    """An argparse type: comma-separated non-negative integers, at most `MAX_LIST`."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be integers separated by commas, got {_short(text)}"
        ) from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"must be non-negative integers, got {_short(text)}")
    return _few(values)


def _few(values: list) -> list:
    if len(values) > MAX_LIST:
        raise argparse.ArgumentTypeError(
            f"at most {MAX_LIST} values (each is a run of the sweep), got {len(values)}"
        )
    if len(set(values)) < len(values):
        raise argparse.ArgumentTypeError("a value is repeated")
    return values


def _short(text: str) -> str:
    return repr(text if len(text) <= 60 else text[:57] + "...")


def _evaluate(verbs: Any) -> None:
    ev = add_verb(
        verbs,
        "evaluate",
        "strategies through the analytic latency model on a trace",
        lazy("evaluate", "cmd_evaluate"),
    )
    ev.add_argument("instance", type=Path, help="instance TOML file")
    ev.add_argument(
        "--strategies",
        default=",".join(DEFAULT_STRATEGIES),
        metavar="A,B,...",
        help=f"comma-separated (default {','.join(DEFAULT_STRATEGIES)}); {described(STRATEGIES)}",
    )
    ev.add_argument(
        "--micro-batches", type=int_in(0, 10**6), default=0, help="use the first N micro-batches (0 = all)"
    )
    ev.add_argument("--jobs", type=int_in(1, 1024), default=2, help="worker processes (default 2)")
    ev.add_argument(
        "--placements-out",
        type=Path,
        metavar="DIR",
        help="write every placement each strategy used (DIR/<strategy>.json: window, replicas per device,"
        " when each copy landed) for re-scoring by other code",
    )
    ev.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override an instance value (TOML syntax), e.g. policy.balance_scenarios=32; repeatable",
    )


def _paper(verbs: Any) -> None:
    paper = add_verb(
        verbs,
        "paper",
        "reproduce the paper's Tables 4-5 and Figures 4-7, and Tables 4-5 at the regime instance:"
        " tables printed beside the paper's with the claims that hold, CSV + PNG",
        lazy("evaluate", "cmd_paper"),
    )
    paper.add_argument(
        "instance",
        type=Path,
        nargs="?",
        default=Path(DEFAULT_PAPER_INSTANCE),
        help="instance TOML file (default instances/paper-baseline.toml; outside a checkout, the copy"
        " shipped with the package)",
    )
    paper.add_argument(
        "--out",
        type=Path,
        default=Path("out/paper"),
        help="folder for CSVs, PNGs, tables (default out/paper)",
    )
    paper.add_argument(
        "--regime",
        default=DEFAULT_REGIME_INSTANCE,
        metavar="FILE|none",
        help="run Tables 4 and 5 at this instance too: the point of the regime map where the most of the"
        " paper's claims hold (default instances/paper-regime.toml; 'none' skips)",
    )
    paper.add_argument("--jobs", type=int_in(1, 1024), default=2, help="worker processes (default 2)")
    paper.add_argument(
        "--sweep-batches",
        type=int_in(1, 10**6),
        default=PAPER_SWEEP_BATCHES,
        help="micro-batches per point of the Figure 5-7 sweeps (default %(default)s)",
    )
    paper.add_argument(
        "--table5-batches",
        type=int_in(1, 10**6),
        default=PAPER_TABLE5_BATCHES,
        help="micro-batches per Table 5 ablation (default %(default)s); Table 4 uses the whole trace",
    )


def _bench(verbs: Any) -> None:
    sub = add_verb(
        verbs,
        "bench",
        "run a benchmark suite (instances x methods x seeds)",
        lazy("bench", "cmd_bench"),
    )
    sub.add_argument("suite", type=Path, help="suite TOML file (see docs/bench.md)")
    where = sub.add_mutually_exclusive_group()
    where.add_argument(
        "--jobs",
        type=int_in(1, 1024),
        help=f"local worker processes (default: the cores available, {available_cores()})",
    )
    where.add_argument("--scheduler", metavar="ADDRESS", help="run on a Dask scheduler, e.g. tcp://host:8786")
    sub.add_argument("--out", type=Path, help="output folder (default: bench-out/<suite name>)")
    sub.add_argument("--resume", action="store_true", help="skip finished runs, retry failed ones")
    sub.add_argument("--no-plots", action="store_true", help="write the report without plots")
    sub.add_argument("--dry-run", action="store_true", help="list the expanded runs, run nothing")
