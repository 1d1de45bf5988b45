"""The columns of `results.parquet`: unit and meaning of each (docs/bench.md is generated from this)."""

from __future__ import annotations

import re

from comoe_opt.bench.store import NONDETERMINISTIC

# name -> (unit, meaning); "–" = no unit. Metric columns are null in the rows of kinds without them.
COLUMNS: dict[str, tuple[str, str]] = {
    "run_id": (
        "–",
        "16 hex digits of the SHA-256 of the run's spec (suite, group, kind, method, seed, "
        "window, full instance table): the resume key",
    ),
    "suite": ("–", "suite name"),
    "group": ("–", "group name within the suite"),
    "kind": ("–", "run kind: `slow-loop` or `evaluate`"),
    "method": (
        "–",
        "slow-loop: method (`milp`, `full`, `lp`, `static`, `hot`, `eplb`, `greedy`); "
        "evaluate: strategy (`static`, `hot`, `transition`, `comoe`, `eplb`, ablations)",
    ),
    "seed": ("–", "trace seed (synthetic traces; 0 for a file trace)"),
    "window": (
        "–",
        "slow-loop window index: micro-batches [window·W, (window+1)·W), W = policy.window_batches",
    ),
    "instance": ("–", "instance name"),
    "point": ("–", "the swept values of this run, for people (`-` when nothing is swept)"),
    "run_status": ("–", "`ok`, or `error` when the run raised (the suite went on)"),
    "error": ("–", "one-line error message of a failed run, else null"),
    "solver_status": (
        "–",
        "slow-loop: `optimal`, `time_limit`, `feasible`, `infeasible`, `unbounded`, `error`",
    ),
    "time_limit_s": ("s", "solver time limit of the run (policy.time_limit_s)"),
    "mip_gap": ("–", "relative MIP gap the run asked for (policy.mip_gap)"),
    "objective": (
        "ms",
        "slow-loop: window objective of the method's placement (same exact evaluation for every method)",
    ),
    "bound": ("ms", "slow-loop: proven lower bound (MILP and LP methods), null for heuristics"),
    "gap": ("–", "slow-loop: (objective − bound) / objective, a fraction; null without a bound"),
    "runtime_s": (
        "s",
        "slow-loop: time of the method (heuristic, or MILP incl. warm start and build); evaluate: simulation",
    ),
    "build_s": ("s", "slow-loop: Pyomo model build time (`milp`), else null"),
    "solver_s": ("s", "slow-loop: HiGHS time incl. model hand-over (`milp`), else null"),
    "pages": ("pages", "slow-loop: resident pages of the placement"),
    "distinct_experts": ("experts", "slow-loop: logical experts with at least one replica"),
    "replica_factor": (
        "–",
        "pages / distinct resident experts (1.0 = no duplication; evaluate: mean over plans)",
    ),
    "extra_replica_ratio": ("–", "(pages − distinct) / distinct, i.e. replica_factor − 1"),
    "expected_balance": ("–", "slow-loop: mean over layers of mean / max expected chiplet work, in (0, 1]"),
    "pages_moved": (
        "pages",
        "slow-loop: pages copied from the previous placement (all pages: runs start empty)",
    ),
    "balance_ms": ("ms", "slow-loop: objective term: expected slowest-chiplet work over the window"),
    "miss_ms": ("ms", "slow-loop: objective term: on-demand loads of non-resident experts"),
    "nop_ms": ("ms", "slow-loop: objective term: network-on-package pressure"),
    "migration_ms": ("ms", "slow-loop: objective term: page copies (0 for a first placement)"),
    "placement_from": ("–", "`milp`: which candidate won (replica-count MILP, full MILP or the warm start)"),
    "window_batches": ("micro-batches", "slow-loop: micro-batches in the solved window"),
    "mean_ms": ("ms", "evaluate: mean per-layer latency over all (micro-batch, layer) samples"),
    "p95_ms": ("ms", "evaluate: P95 per-layer latency"),
    "p99_ms": ("ms", "evaluate: P99 per-layer latency"),
    "token_gb_per_batch": ("GB", "evaluate: token traffic per micro-batch (all layers)"),
    "load_gb_per_batch": (
        "GB",
        "evaluate: expert pages over the link per micro-batch (on demand + prefetch)",
    ),
    "demand_load_gb_per_batch": ("GB", "evaluate: on-demand page loads per micro-batch"),
    "balance": ("–", "evaluate: mean over samples of mean / max chiplet busy time, in (0, 1]"),
    "token_imbalance_p95": (
        "–",
        "evaluate: P95 over samples of max / mean (token, expert) pairs per chiplet",
    ),
    "token_imbalance_mean": ("–", "evaluate: mean over samples of the same ratio"),
    "energy_mj_per_layer": ("mJ", "evaluate: energy per layer (D2D, HBM, SRAM, FLOPs)"),
    "prefetch_issued": ("prefetches", "evaluate: prefetches issued"),
    "prefetch_denied": ("rounds", "evaluate: prefetch rounds ended by a page that could not land in time"),
    "replica_factor_paper": (
        "–",
        "evaluate: the paper's accounting: (placed + buffered pages read) / distinct, per micro-batch",
    ),
    "buffered_in_use_per_batch": ("pages", "evaluate: buffered (unplaced) pages tokens read per micro-batch"),
    "prefetch_accuracy": ("–", "evaluate: prefetches the next layer used / prefetches issued"),
    "prefetch_wasted_gb_per_batch": ("GB", "evaluate: bytes of cancelled prefetches per micro-batch"),
    "pages_migrated": ("pages", "evaluate: re-plan replica copies that landed (counted on landing)"),
    "copies_cancelled": ("copies", "evaluate: re-plan copies a newer plan dropped while in flight"),
    "copies_rolled_back": ("copies", "evaluate: replica copies rolled back before publication"),
    "micro_batches": ("micro-batches", "evaluate: micro-batches simulated (the whole trace)"),
    "attention_ms": (
        "ms",
        "evaluate: attention time per layer used (runtime.attention_ms, or calibrated on static "
        "from runtime.attention_share)",
    ),
    "strategy_label": ("–", "evaluate: the strategy's name in the paper's tables"),
    "layers": ("layers", "MoE layers of the instance"),
    "experts": ("experts", "routed experts per layer"),
    "chiplets": ("chiplets", "expert chiplets (devices)"),
    "wall_s": ("s", "wall time of the whole run on its worker (trace, then solve or simulation)"),
    "finished_at": ("–", "UTC time the run finished, ISO 8601"),
    "worker": ("–", "host:pid of the worker process"),
    "commit": ("–", "commit of the checkout that submitted the run (`-dirty`: uncommitted changes)"),
    "traceback": ("–", "Python traceback of a failed run, else null"),
}

# families of columns: (pattern, unit, meaning)
FAMILIES: tuple[tuple[str, str, str], ...] = (
    (
        r"[a-z_]+\.[a-z0-9_]+",
        "instance unit",
        "a swept instance key (e.g. `trace.zipf_alpha`): its value in this run",
    ),
    (
        r"version_[a-z0-9_]+",
        "–",
        "version of a package on the worker (`version_python`, `version_highspy`, ...)",
    ),
)


def documented(column: str) -> bool:
    return column in COLUMNS or any(re.fullmatch(p, column) for p, _, _ in FAMILIES)


def column_reference() -> str:
    """The Markdown table of every column (generated into docs/bench.md)."""
    rows = ["| column | unit | meaning | deterministic |", "|---|---|---|---|"]
    for name, (unit, meaning) in COLUMNS.items():
        same = "no" if name in NONDETERMINISTIC or name == "traceback" else "yes"
        rows.append(f"| `{name}` | {unit} | {meaning} | {same} |")
    for pattern, unit, meaning in FAMILIES:
        rows.append(f"| `{pattern}` (pattern) | {unit} | {meaning} | yes |")
    return "\n".join(rows)
