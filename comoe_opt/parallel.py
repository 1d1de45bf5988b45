"""Worker processes: the one process pool behind `evaluate --jobs`, `paper` and `bench --jobs`.

Workers come from a fork server (or spawn), never a plain fork of a process
that may already run solver threads. Each run is single-process: HiGHS may
still use its own threads, so more jobs than cores oversubscribes.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import signal
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def process_pool(
    jobs: int, *, preload: Sequence[str] = (), ignore_sigint: bool = False
) -> cf.ProcessPoolExecutor:
    """A pool of `jobs` workers that import `preload` once (in the fork server).

    With `ignore_sigint`, Ctrl-C reaches only the parent, which then decides
    what an interrupt means (the benchmark runner stores finished runs first).
    """
    initializer = _ignore_sigint if ignore_sigint else None
    return cf.ProcessPoolExecutor(max_workers=jobs, mp_context=_context(preload), initializer=initializer)


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


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
