"""Run a suite: skip finished runs, execute the rest, store each as it finishes, consolidate, report.

Interruption (SIGINT, SIGTERM): the runner stops submitting, stores every run
that has already finished, drops the unfinished ones, writes the Parquet and
the report, and returns with the signal recorded; the CLI then exits with
128 + signal (130, 143). `--resume` later runs only what is missing or failed.
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from comoe_opt import interrupts
from comoe_opt.bench.executors import Executor, make_executor
from comoe_opt.bench.kinds import one_line, spec_columns
from comoe_opt.bench.progress import Progress
from comoe_opt.bench.provenance import commit as current_commit
from comoe_opt.bench.report import write_report
from comoe_opt.bench.spec import RunSpec
from comoe_opt.bench.store import ResultStore
from comoe_opt.bench.suite import Suite
from comoe_opt.errors import ComoeError

POLL_S = 0.2  # how often the runner looks for a signal while runs are in flight


@dataclass(frozen=True)
class BenchOutcome:
    suite: str
    out: Path
    executor: str
    total: int  # runs in the suite
    skipped: int  # finished (ok) before this invocation
    ran: int  # finished in this invocation, ok or error
    failed: int  # runs of the suite whose stored result is an error
    missing: int  # runs with no stored result (interrupted)
    wall_s: float
    interrupted: int | None  # the signal number, when a signal stopped the suite

    @property
    def exit_status(self) -> int:
        if self.interrupted is not None:
            return 128 + self.interrupted
        return 1 if self.failed else 0


class StopOnSignal:
    """Turn SIGINT/SIGTERM into a flag the runner polls, so no finished run is half-stored."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum = signum


def run_suite(
    suite: Suite,
    out: Path,
    *,
    jobs: int = 1,
    scheduler: str | None = None,
    resume: bool = False,
    progress_stream: Any = None,
    bar: bool | None = None,
    plots: bool = True,
) -> BenchOutcome:
    store = ResultStore(out)
    store.check_writable()
    ids = [spec.run_id for spec in suite.specs]
    stored = store.rows(ids)
    if stored and not resume:
        raise ComoeError(
            f"{out} already holds {len(stored)} results of suite {suite.name!r}: "
            "add --resume to continue it, or choose another --out"
        )
    finished = {row["run_id"] for row in stored if row.get("run_status") == "ok"}
    todo = sorted((s for s in suite.specs if s.run_id not in finished), key=estimated_cost, reverse=True)
    start = time.perf_counter()
    progress = Progress(len(ids), len(finished), progress_stream, bar)
    description = "nothing to run"
    ran = 0
    with interrupts.graceful(), StopOnSignal() as stop:
        try:
            if todo and stop.signum is None:
                executor = make_executor(jobs, scheduler)
                description = executor.description
                progress.note(
                    f"{suite.name}: {len(todo)} runs to do, {len(finished)} done before; {description}"
                )
                ran = _execute(executor, todo, store, progress, stop)
        finally:
            progress.close()
        frame = store.consolidate(ids)
        write_report(suite, frame, out, plots=plots and stop.signum is None)
    failed = int((frame["run_status"] != "ok").sum()) if len(frame) else 0
    return BenchOutcome(
        suite=suite.name,
        out=out,
        executor=description,
        total=len(ids),
        skipped=len(finished),
        ran=ran,
        failed=failed,
        missing=len(ids) - len(frame),
        wall_s=time.perf_counter() - start,
        interrupted=stop.signum,
    )


def _execute(
    executor: Executor, todo: list[RunSpec], store: ResultStore, progress: Progress, stop: StopOnSignal
) -> int:
    """Submit every run, store each as it finishes; on a signal, keep the finished ones and abort."""
    commit = current_commit()
    pending: dict[Any, RunSpec] = {}
    ran = 0
    aborted = True
    try:
        for spec in todo:
            if stop.signum is not None:
                break
            pending[executor.submit(spec)] = spec
        while pending and stop.signum is None:
            for future in executor.wait(pending, POLL_S):
                ran += _store(future, pending.pop(future), store, progress, commit)
        for future in [f for f in pending if f.done()]:  # finished while the signal arrived
            ran += _store(future, pending.pop(future), store, progress, commit)
        aborted = bool(pending)
    finally:
        executor.close(abort=aborted)
    if stop.signum is not None:
        name = signal.Signals(stop.signum).name
        progress.note(f"{name}: stopped; {len(pending)} unfinished runs dropped, finished runs are stored")
    return ran


def _store(future: Any, spec: RunSpec, store: ResultStore, progress: Progress, commit: str) -> int:
    if future.cancelled():
        return 0
    try:
        row = future.result()
    except Exception as exc:  # the worker itself failed (killed, pool broken): the run is an error
        row = {**spec_columns(spec), "run_status": "error", "error": f"worker failed: {one_line(exc)}"}
    row["commit"] = commit
    store.save(row)
    progress.update(row)
    return 1


def estimated_cost(spec: RunSpec) -> float:
    """A rough relative cost (about µs on the 2-core reference machine), to start the longest runs
    first: better balance over the workers. Only the order of runs depends on it."""
    table = spec.table()
    model, trace = table["model"], table["trace"]
    size = model["layers"] * model["experts_per_layer"] * table["hardware"]["chiplets"]
    batches = trace.get("micro_batches") or 1000
    selections = model["layers"] * batches * trace["tokens_per_batch"] * model["top_k"]
    if spec.kind == "evaluate":  # simulates every micro-batch; flow mapping costs about twice as much
        return selections * (3.0 if spec.method in ("static", "hot", "transition", "eplb") else 7.0)
    weight = {"full": 300.0, "exact": 300.0, "milp": 30.0, "lp": 15.0}.get(spec.method, 1.0)
    return 0.1 * selections + weight * size


def describe_suite(suite: Suite) -> dict[str, Any]:
    """The expanded runs without running them (`--dry-run`)."""
    runs = [
        {
            "run_id": s.run_id,
            "group": s.group,
            "kind": s.kind,
            "method": s.method,
            "seed": s.seed,
            "window": s.window,
            "point": s.point_label,
        }
        for s in suite.specs
    ]
    groups = f"{len(suite.groups)} group{'s' if len(suite.groups) != 1 else ''}"
    lines = [f"{suite.name}: {len(runs)} runs in {groups}"]
    lines += [
        f"{r['run_id']}  {r['group']}  {r['point']}  {r['kind']} {r['method']}  seed {r['seed']}  "
        f"window {r['window']}"
        for r in runs
    ]
    return {"suite": suite.name, "runs": runs, "_text": "\n".join(lines)}
