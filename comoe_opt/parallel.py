"""Worker processes: the one process pool behind `evaluate --jobs`, `paper` and `bench --jobs`.

Workers come from a fork server (or spawn), never a plain fork of a process
that may already run solver threads. Each run is single-process: HiGHS may
still use its own threads, so more jobs than cores oversubscribes.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def available_cores() -> int:
    """Processors this process may run on (as `nproc` reports)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def process_pool(
    jobs: int, *, preload: Sequence[str] = (), tasks_per_worker: int | None = None
) -> cf.ProcessPoolExecutor:
    """A pool of `jobs` workers that import `preload` once (in the fork server); with
    `tasks_per_worker`, a worker is replaced after that many tasks (its memory given back).

    Workers ignore Ctrl-C (a terminal sends it to the whole process group): it reaches the
    parent, which decides what an interrupt means (interrupts.py; the benchmark runner stores
    finished runs first), and the workers exit when it does.
    """
    _quiet_resource_tracker()
    return cf.ProcessPoolExecutor(
        max_workers=jobs,
        mp_context=_context(preload),
        initializer=_start_worker,
        initargs=(os.getpid(),),
        max_tasks_per_child=tasks_per_worker,
    )


def _quiet_resource_tracker() -> None:
    """A command stopped by a signal ends without unlinking its pool's queue semaphores, and
    multiprocessing's resource tracker (a process of its own, started with the interpreter's
    warning options) would print a warning about them after the command's one line. The tracker
    unlinks them anyway; only its warning is silenced, before the tracker starts."""
    option = "ignore::UserWarning:multiprocessing.resource_tracker"
    if option not in sys.warnoptions:
        sys.warnoptions.append(option)


STOP_WAIT_S = 5.0  # how long `terminate` waits for the pool's manager thread and each worker


def terminate(pool: cf.ProcessPoolExecutor) -> None:
    """Drop the queue and stop the workers now (unfinished runs are not results).

    The workers are stopped before the pool is shut down: `shutdown` empties the pool's table of
    workers while its manager thread may still be replacing one that finished a task (with
    `tasks_per_worker`), which kills that thread and could leave a fresh worker running a queued
    task that the interpreter's exit then waits for. Stopped workers make the manager thread mark
    the pool broken, stop every worker in the table (a replacement too) and end."""
    workers = getattr(pool, "_processes", None) or {}  # the table the manager thread updates
    manager = getattr(pool, "_executor_manager_thread", None)
    calls = getattr(pool, "_call_queue", None)
    if calls is not None:
        calls.cancel_join_thread()  # a task nobody will read must not hold the exit
    seen: dict[int, Any] = {}
    for _ in range(int(STOP_WAIT_S / PARENT_POLL_S)):
        for pid, process in _snapshot(workers):
            seen[pid] = process
            process.terminate()
        if manager is None or not manager.is_alive():
            break
        manager.join(PARENT_POLL_S)
    pool.shutdown(wait=False, cancel_futures=True)
    for process in seen.values():
        process.join(timeout=STOP_WAIT_S)


def _snapshot(workers: dict[int, Any]) -> list[tuple[int, Any]]:
    """The workers' table as it is now (another thread may change it while it is read)."""
    while True:
        try:
            return list(workers.items())
        except RuntimeError:  # changed size during iteration: read it again
            continue


def parallel_map(
    fn: Callable[[T], R],
    items: Sequence[T],
    jobs: int,
    preload: Sequence[str] = (),
    progress: Callable[[], None] | None = None,
    tasks_per_worker: int | None = None,
) -> list[R]:
    """`[fn(x) for x in items]` in the order of `items`; in worker processes when jobs > 1
    (each replaced after `tasks_per_worker` items, when given). `progress` is called once per
    finished item."""
    tick = progress or (lambda: None)
    if jobs <= 1 or len(items) <= 1:
        out = []
        for x in items:
            out.append(fn(x))
            tick()
        return out
    pool = process_pool(min(jobs, len(items)), preload=preload, tasks_per_worker=tasks_per_worker)
    try:
        futures = [pool.submit(fn, x) for x in items]
        for future in cf.as_completed(futures):
            future.result()  # a run that raised (a user error, pickled back) ends the map now
            tick()
        results = [f.result() for f in futures]
    except BaseException:
        terminate(pool)
        raise
    pool.shutdown(wait=True)
    return results


class ProgressLine:
    """Progress of a long command on stderr: a tqdm bar on a terminal, otherwise a plain line at
    most every `every_s` seconds (and at the end), so a log shows the command is alive."""

    def __init__(self, total: int, label: str, stream: Any = None, every_s: float = 15.0):
        self.stream = stream if stream is not None else sys.stderr
        self.total, self.label, self.every_s = total, label, every_s
        self.done = 0
        self.start = self.last = time.perf_counter()
        self.bar = None
        if is_terminal(self.stream):
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=label, unit="run", file=self.stream, dynamic_ncols=True)
        else:
            print(f"{label}: {total} runs", file=self.stream, flush=True)

    def __call__(self) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
            if self.done == self.total:
                self.bar.close()
            return
        now = time.perf_counter()
        if now - self.last >= self.every_s or self.done == self.total:
            self.last = now
            elapsed = now - self.start
            eta = elapsed / self.done * (self.total - self.done)
            print(
                f"{self.label}: {self.done}/{self.total} runs in {elapsed:.0f} s, about {eta:.0f} s left",
                file=self.stream,
                flush=True,
            )


def is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _context(preload: Sequence[str]) -> Any:
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        if preload:
            ctx.set_forkserver_preload(list(preload))
        return ctx
    return multiprocessing.get_context("spawn")


PARENT_POLL_S = 0.5  # how often a worker checks that the process that started it is alive


def _start_worker(parent: int) -> None:
    """Set up a worker: it ignores Ctrl-C, and exits as soon as its parent dies (even by kill -9,
    which runs no cleanup), instead of idling for minutes on the memory and pipes of a run nobody
    waits for."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True, name="parent-watch").start()


def _exit_with_parent(parent: int) -> None:
    while _alive(parent):
        time.sleep(PARENT_POLL_S)
    os._exit(1)  # the parent is gone: no one will read this worker's results


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except FileNotFoundError:
        return False
    except (OSError, IndexError):  # no /proc (macOS): ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
