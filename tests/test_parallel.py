"""The process pool's map: order, progress ticks, and the progress line of long commands."""

from __future__ import annotations

import io

from comoe_opt.parallel import ProgressLine, parallel_map


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
