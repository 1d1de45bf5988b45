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
    jobs: int, *, preload: Sequence[str] = (), ignore_sigint: bool = False
) -> cf.ProcessPoolExecutor:
    """A pool of `jobs` workers that import `preload` once (in the fork server).

    With `ignore_sigint`, Ctrl-C reaches only the parent, which then decides
    what an interrupt means (the benchmark runner stores finished runs first).
    """
    return cf.ProcessPoolExecutor(
        max_workers=jobs,
        mp_context=_context(preload),
        initializer=_start_worker,
        initargs=(os.getpid(), ignore_sigint),
    )


def terminate(pool: cf.ProcessPoolExecutor) -> None:
    """Drop the queue and stop the workers now (unfinished runs are not results)."""
    workers = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in workers:
        process.terminate()
    for process in workers:
        process.join(timeout=5)


def parallel_map(fn: Callable[[T], R], items: Sequence[T], jobs: int, preload: Sequence[str] = ()) -> list[R]:
    """`[fn(x) for x in items]` in the order of `items`; in worker processes when jobs > 1."""
    if jobs <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    pool = process_pool(min(jobs, len(items)), preload=preload)
    try:
        results = list(pool.map(fn, items))
    except BaseException:
        terminate(pool)
        raise
    pool.shutdown(wait=True)
    return results


def _context(preload: Sequence[str]) -> Any:
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        if preload:
            ctx.set_forkserver_preload(list(preload))
        return ctx
    return multiprocessing.get_context("spawn")


PARENT_POLL_S = 0.5  # how often a worker checks that the process that started it is alive


def _start_worker(parent: int, ignore_sigint: bool) -> None:
    """Set up a worker: it exits as soon as its parent dies (even by kill -9, which runs no
    cleanup), instead of idling for minutes on the memory and pipes of a run nobody waits for."""
    if ignore_sigint:
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
