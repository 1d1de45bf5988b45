"""Where runs execute: a local process pool, or the workers of a Dask distributed cluster.

Both run the same pure function, `run_one(spec)`, and offer the same three
operations to the runner: submit a spec, wait (with a timeout, so the runner
notices a signal promptly) for some futures to finish, and close (aborting
the unfinished ones when interrupted).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
from collections.abc import Collection
from typing import Any, Protocol

from comoe_opt.bench.kinds import run_one
from comoe_opt.bench.spec import RunSpec
from comoe_opt.errors import ComoeError
from comoe_opt.parallel import process_pool, terminate


class Executor(Protocol):
    description: str

    def submit(self, spec: RunSpec) -> Any: ...

    def wait(self, futures: Collection[Any], timeout: float) -> set[Any]: ...

    def close(self, *, abort: bool) -> None: ...


class LocalPool:
    """A local process pool (`comoe_opt.parallel`); the solver stack is imported once, in the fork
    server, not per worker."""

    def __init__(self, jobs: int):
        if jobs < 1:
            raise ComoeError(f"--jobs must be >= 1, got {jobs}")
        self.description = f"local process pool, {jobs} worker{'s' if jobs > 1 else ''}"
        self.pool = process_pool(jobs, preload=["comoe_opt.bench.kinds"])

    def submit(self, spec: RunSpec) -> cf.Future:
        return self.pool.submit(run_one, spec)

    def wait(self, futures: Collection[cf.Future], timeout: float) -> set[cf.Future]:
        done, _ = cf.wait(futures, timeout=timeout, return_when=cf.FIRST_COMPLETED)
        return done

    def close(self, *, abort: bool) -> None:
        if abort:
            terminate(self.pool)
        else:
            self.pool.shutdown(wait=True)


class DaskCluster:
    """A running Dask distributed scheduler; its workers need comoe-opt installed (same version)."""

    def __init__(self, address: str):
        try:
            from distributed import Client
        except ImportError:
            raise ComoeError("--scheduler needs dask.distributed (pip install distributed)") from None
        try:
            self.client = Client(address, timeout="20s")
        except (OSError, TimeoutError, ValueError) as exc:
            raise ComoeError(f"cannot connect to the Dask scheduler at {address}: {exc}") from None
        workers = len(self.client.scheduler_info().get("workers", {}))
        self.description = f"Dask scheduler {address}, {workers} worker{'s' if workers != 1 else ''} now"
        self.submitted: list[Any] = []

    def submit(self, spec: RunSpec) -> Any:
        # pure=False: a run's timings differ between executions, so Dask must not reuse a result
        future = self.client.submit(run_one, spec, pure=False)
        self.submitted.append(future)
        return future

    def wait(self, futures: Collection[Any], timeout: float) -> set[Any]:
        from distributed import wait

        with contextlib.suppress(TimeoutError):  # nothing finished yet: the runner checks for signals
            wait(list(futures), timeout=timeout, return_when="FIRST_COMPLETED")
        return {f for f in futures if f.done()}

    def close(self, *, abort: bool) -> None:
        if abort:
            self.client.cancel([f for f in self.submitted if not f.done()])
        self.client.close()


def make_executor(jobs: int, scheduler: str | None) -> Executor:
    return DaskCluster(scheduler) if scheduler else LocalPool(jobs)
