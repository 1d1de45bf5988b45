"""Progress of a suite: a tqdm bar with ETA on a terminal, one plain line per finished run otherwise."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from comoe_opt.parallel import is_terminal


class Progress:
    def __init__(self, total: int, already: int, stream: TextIO | None = None, bar: bool | None = None):
        self.stream = stream if stream is not None else sys.stderr
        self.total = total
        self.done = already
        self.start_done = already
        self.failed = 0
        self.start = time.perf_counter()
        use_bar = bar if bar is not None else is_terminal(self.stream)
        self.bar = None
        if use_bar:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=already, unit="run", file=self.stream, dynamic_ncols=True)

    def note(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def update(self, row: dict[str, Any]) -> None:
        self.done += 1
        failed = row.get("run_status") != "ok"
        self.failed += failed
        if self.bar is not None:
            if failed:
                self.bar.write(f"error {_describe(row)}: {row.get('error')}", file=self.stream)
            self.bar.set_postfix_str(f"{self.failed} failed" if self.failed else "", refresh=False)
            self.bar.update(1)
            return
        status = "error" if failed else "ok"
        line = f"[{self.done}/{self.total}] {status:<5} {_describe(row)}  {row.get('wall_s', 0.0):.1f}s"
        if failed:
            line += f": {row.get('error')}"
        print(f"{line}  (ETA {self._eta()})", file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def _eta(self) -> str:
        finished = self.done - self.start_done
        if finished == 0:
            return "?"
        rate = (time.perf_counter() - self.start) / finished
        return _duration(rate * (self.total - self.done))


def _describe(row: dict[str, Any]) -> str:
    where = f"{row['group']} {row['point']} {row['method']} seed {row['seed']} window {row['window']}"
    return f"{row['run_id']} {where}"


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    minutes, s = divmod(seconds, 60)
    hours, m = divmod(minutes, 60)
    return f"{hours}h{m:02d}m{s:02d}s" if hours else f"{m}m{s:02d}s" if m else f"{s}s"
