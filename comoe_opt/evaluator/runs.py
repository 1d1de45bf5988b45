"""Evaluate strategies on an instance: one pure function per run, and a parallel map over runs."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from comoe_opt.evaluator.metrics import summarize
from comoe_opt.evaluator.runtime import replay
from comoe_opt.evaluator.strategies import strategy as strategy_named
from comoe_opt.instance import Instance, instance_from_table, to_table
from comoe_opt.parallel import parallel_map
from comoe_opt.trace import instance_batches


@dataclass(frozen=True)
class EvalRun:
    """One evaluation: an instance (as its TOML table), a strategy, how many micro-batches."""

    table: dict[str, Any]
    source: str | None
    strategy: str
    micro_batches: int = 0  # 0 = the whole trace
    label: dict[str, Any] | None = None  # what the caller wants back with the result (sweep values)


def evaluate_strategy(instance: Instance, strategy: str, micro_batches: int = 0) -> dict[str, Any]:
    """Metrics of one strategy on the instance's trace (the first `micro_batches`, 0 = all)."""
    chosen = strategy_named(strategy)
    batches = instance_batches(instance)
    if micro_batches:
        batches = batches.window(0, min(micro_batches, batches.batches))
    start = time.perf_counter()
    log = replay(instance, batches, chosen)
    return {
        "strategy": strategy,
        "label": chosen.title,
        **summarize(log),
        "runtime_s": time.perf_counter() - start,
    }


def eval_run(instance: Instance, strategy: str, micro_batches: int = 0, **label: Any) -> EvalRun:
    source = str(instance.source) if isinstance(instance.source, Path) else None
    return EvalRun(to_table(instance), source, strategy, micro_batches, label or None)


def run_eval(run: EvalRun) -> dict[str, Any]:
    """The metrics of one `EvalRun`, with its label; a pure function of the run (timings aside)."""
    instance = instance_from_table(run.table, run.source or "instance")
    return {**(run.label or {}), **evaluate_strategy(instance, run.strategy, run.micro_batches)}


def run_many(runs: list[EvalRun], jobs: int = 1) -> list[dict[str, Any]]:
    """Results in the order of `runs`; with jobs > 1, in worker processes."""
    return parallel_map(run_eval, runs, jobs, preload=["comoe_opt.evaluator.runs"])
