"""Evaluate strategies on an instance: one pure function per run, and a parallel map over runs."""

from __future__ import annotations

import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from comoe_opt.errors import ComoeError
from comoe_opt.instance import Instance, instance_from_table, to_table
from comoe_opt.simulate.metrics import summarize
from comoe_opt.simulate.runtime import simulate
from comoe_opt.simulate.strategies import strategy as strategy_named
from comoe_opt.trace import instance_batches


@dataclass(frozen=True)
class EvalRun:
    """One evaluation: an instance (as its TOML table), a strategy, how many micro-batches."""

    table: dict[str, Any]
    source: str | None
    strategy: str
    micro_batches: int = 0  # 0 = the whole trace
    label: dict[str, Any] | None = None  # what the caller wants back with the result (sweep values)


def with_overrides(instance: Instance, overrides: dict[str, Any]) -> Instance:
    """The instance with dotted keys replaced (`"trace.zipf_alpha": 0.5`), validated again."""
    table = to_table(instance)
    for dotted, value in overrides.items():
        section, _, key = dotted.partition(".")
        if section not in table or not isinstance(table[section], dict) or not key:
            raise ComoeError(f"cannot override {dotted!r}: no such table")
        table[section][key] = value
    return instance_from_table(table, instance.source or instance.name)


def evaluate_strategy(instance: Instance, strategy: str, micro_batches: int = 0) -> dict[str, Any]:
    """Metrics of one strategy on the instance's trace (the first `micro_batches`, 0 = all)."""
    chosen = strategy_named(strategy)
    batches = instance_batches(instance)
    if micro_batches:
        batches = batches.window(0, min(micro_batches, batches.batches))
    start = time.perf_counter()
    log = simulate(instance, batches, chosen)
    return {
        "strategy": strategy,
        "label": chosen.title,
        **summarize(log),
        "runtime_s": time.perf_counter() - start,
    }


def run_one(run: EvalRun) -> dict[str, Any]:
    instance = instance_from_table(run.table, run.source or "instance")
    return {**(run.label or {}), **evaluate_strategy(instance, run.strategy, run.micro_batches)}


def run_many(runs: list[EvalRun], jobs: int = 1) -> list[dict[str, Any]]:
    """Results in the order of `runs`; with jobs > 1, in worker processes."""
    if jobs <= 1 or len(runs) <= 1:
        return [run_one(r) for r in runs]
    context = multiprocessing.get_context("forkserver")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        return list(pool.map(run_one, runs))


def eval_run(instance: Instance, strategy: str, micro_batches: int = 0, **label: Any) -> EvalRun:
    source = str(instance.source) if isinstance(instance.source, Path) else None
    return EvalRun(to_table(instance), source, strategy, micro_batches, label or None)
