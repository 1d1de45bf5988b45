"""Evaluate strategies on an instance: one pure function per run, and a parallel map over runs."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from comoe_opt.evaluator.calibration import calibrated
from comoe_opt.evaluator.metrics import summarize
from comoe_opt.evaluator.runtime import SampleLog, simulate
from comoe_opt.evaluator.strategies import strategy as strategy_named
from comoe_opt.files import atomic_path
from comoe_opt.instance import FileTrace, Instance, instance_from_table, to_table
from comoe_opt.parallel import parallel_map
from comoe_opt.residency.solve import MODEL_METHODS
from comoe_opt.stats.regime import Regime, batch_regime
from comoe_opt.trace import instance_batches
from comoe_opt.trace.batching import MicroBatches


@dataclass(frozen=True)
class EvalRun:
    """One evaluation: an instance (as its TOML table), a strategy, how many micro-batches."""

    table: dict[str, Any]
    source: str | None
    strategy: str
    micro_batches: int = 0  # 0 = the whole trace
    label: dict[str, Any] | None = None  # what the caller wants back with the result (sweep values)
    placements_out: str | None = None  # folder for the placements the runtime used


def evaluate_strategy(
    instance: Instance, strategy: str, micro_batches: int = 0, placements_out: Path | None = None
) -> dict[str, Any]:
    """Metrics of one strategy on the instance's trace (the first `micro_batches`, 0 = all); with
    `placements_out`, every placement it used goes to `<folder>/<strategy>.json`."""
    chosen = strategy_named(strategy)
    batches = _batches(instance)
    if micro_batches:
        batches = batches.window(0, min(micro_batches, batches.batches))
    instance = calibrated(instance, batches)  # attention from runtime.attention_share, if set
    start = time.perf_counter()
    log = simulate(instance, batches, chosen)
    if placements_out is not None:
        write_used_placements(placements_out / f"{strategy}.json", instance, strategy, log)
    return {
        "strategy": strategy,
        "label": chosen.title,
        **summarize(log),
        "attention_ms": instance.runtime.attention_ms,
        "runtime_s": time.perf_counter() - start,
    }


def trace_regime(instance: Instance, micro_batches: int = 0) -> Regime:
    """Weight-read or compute bound on the trace `evaluate_strategy` replays (stats/regime.py)."""
    batches = _batches(instance)
    if micro_batches:
        batches = batches.window(0, min(micro_batches, batches.batches))
    return batch_regime(batches.experts, batches.num_experts, instance.costs)


_SYNTHETIC: dict[str, MicroBatches] = {}


def _batches(instance: Instance) -> MicroBatches:
    """The instance's micro-batches; a synthetic trace is generated once per process (the runs
    of one paper table or map point share it; it is a pure function of model and trace keys)."""
    if isinstance(instance.trace, FileTrace):
        return instance_batches(instance)
    key = json.dumps([to_table(instance)[k] for k in ("model", "trace")], sort_keys=True)
    if key not in _SYNTHETIC:
        while len(_SYNTHETIC) >= 4:
            _SYNTHETIC.pop(next(iter(_SYNTHETIC)))
        batches = instance_batches(instance)
        for array in (batches.experts, batches.token_index):
            array.flags.writeable = False  # shared by later runs: nobody may change it
        _SYNTHETIC[key] = batches
    return _SYNTHETIC[key]


def eval_run(
    instance: Instance,
    strategy: str,
    micro_batches: int = 0,
    placements_out: Path | None = None,
    **label: Any,
) -> EvalRun:
    source = str(instance.source) if isinstance(instance.source, Path) else None
    out = None if placements_out is None else str(placements_out)
    return EvalRun(to_table(instance), source, strategy, micro_batches, label or None, out)


def run_eval(run: EvalRun) -> dict[str, Any]:
    """The metrics of one `EvalRun`, with its label; a pure function of the run (timings aside)."""
    instance = instance_from_table(run.table, run.source or "instance")
    out = None if run.placements_out is None else Path(run.placements_out)
    return {**(run.label or {}), **evaluate_strategy(instance, run.strategy, run.micro_batches, out)}


def write_used_placements(path: Path, instance: Instance, strategy: str, log: SampleLog) -> None:
    """Every placement the runtime used, window by window, so that other code can re-score them.

    `replicas[layer][device]` lists the experts resident on the device; `copies` are the
    re-plan copies the window started, `[layer, expert, device, lands_ms]` (runtime clock), and
    `cancelled` the copies of earlier plans it dropped in flight, `[layer, expert, device]`.
    """
    windows = []
    for (window, placement), info in zip(log.placements, log.windows, strict=True):
        resident = placement.resident
        replicas = [[np.flatnonzero(resident[l, :, c]).tolist() for c in range(resident.shape[2])]
                    for l in range(resident.shape[0])]  # fmt: skip
        windows.append({**info, "window": window, "replicas": replicas})
    payload = {
        "format": "comoe-opt used placements",
        "version": 1,
        "instance": instance.name,
        "strategy": strategy,
        "layers": instance.model.layers,
        "experts": instance.model.experts_per_layer,
        "devices": instance.hardware.chiplets,
        "copy_topology": instance.hardware.copy_topology,
        "windows": windows,
    }
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(payload), encoding="utf-8")


def run_many(
    runs: list[EvalRun], jobs: int = 1, progress: Callable[[], None] | None = None
) -> list[dict[str, Any]]:
    """Results in the order of `runs`; with jobs > 1, in worker processes; `progress` is
    called once per finished run. Runs that differ only in their label run once (a sweep
    through the base point repeats it)."""
    keys = [_work_key(run) for run in runs]
    unique = {key: dataclasses.replace(run, label=None) for key, run in zip(keys, runs, strict=True)}
    # the longest first, so that the workers finish together (each run is a pure function: the
    # order changes no number)
    order = sorted(unique, key=lambda key: _cost_rank(unique[key].strategy))
    preload = ["comoe_opt.evaluator.runs"]
    done = parallel_map(run_eval, [unique[key] for key in order], jobs, preload=preload, progress=progress)
    by_key = dict(zip(order, done, strict=True))
    return [{**(run.label or {}), **by_key[key]} for key, run in zip(keys, runs, strict=True)]


def _cost_rank(strategy: str) -> int:
    """0 for the strategies that plan with a model every window, 1 for the oracle (a heuristic
    plan every micro-batch), 2 for the rest: on GPT-OSS comoe took longer than eplb-flow and the
    oracle together (benchmarks/results/phases.md, "Evaluation replay speed")."""
    chosen = strategy_named(strategy)
    if chosen.residency in MODEL_METHODS:
        return 0
    return 1 if chosen.oracle else 2


def distinct_runs(runs: list[EvalRun]) -> int:
    """How many runs `run_many` actually runs (what its progress counts)."""
    return len({_work_key(run) for run in runs})


def _work_key(run: EvalRun) -> str:
    return json.dumps(
        [run.table, run.source, run.strategy, run.micro_batches, run.placements_out],
        sort_keys=True,
        default=str,
    )
