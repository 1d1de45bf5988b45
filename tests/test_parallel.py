"""The process pool's map: order, progress ticks, and the progress line of long commands."""

from __future__ import annotations

import io
import threading

from comoe_opt.parallel import ProgressLine, parallel_map, process_pool, terminate


def square(x: int) -> int:
    return x * x


def test_map_keeps_order_and_ticks_once_per_item() -> None:
    for jobs in (1, 2):
        ticks = io.StringIO()
        assert parallel_map(square, list(range(7)), jobs, progress=lambda t=ticks: t.write(".")) == [
            x * x for x in range(7)
        ]
        assert ticks.getvalue() == "......."


def test_progress_line_without_a_terminal_prints_plain_lines() -> None:
    stream = io.StringIO()  # not a terminal: no bar, plain lines
    progress = ProgressLine(3, "paper", stream=stream, every_s=3600)
    for _ in range(3):
        progress()
    lines = stream.getvalue().splitlines()
    assert lines[0] == "paper: 3 runs"
    assert lines[-1].startswith("paper: 3/3 runs in ") and len(lines) == 2  # throttled: start and end


def _spin(n: int) -> int:
    return sum(range(20_000 * (n % 3 + 1)))


def test_terminate_mid_run_stops_every_worker_and_the_pool_thread_cleanly(monkeypatch) -> None:
    """Workers replaced after each task (as compare runs them) are stopped while tasks finish:
    the pool's manager thread must not die on the way, and no worker (a replacement neither)
    may outlive `terminate`, else the interpreter's exit waits for it."""
    errors: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda hook: errors.append(hook.exc_value))
    for finished in range(1, 7):
        pool = process_pool(2, tasks_per_worker=1)
        futures = [pool.submit(_spin, n) for n in range(100)]
        for future in futures[:finished]:
            future.result()
        workers = pool._processes
        manager = pool._executor_manager_thread
        terminate(pool)
        assert manager is not None and not manager.is_alive()
        assert not any(process.is_alive() for process in workers.values())
    assert errors == []
