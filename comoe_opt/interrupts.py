"""Every verb stops on SIGINT or SIGTERM within about a second: one line on stderr, exit 130 / 143.

Python runs a signal handler only between bytecodes of the main thread, so a handler alone would
wait for whatever long call is running: HiGHS releases the GIL but does not return until its
solve ends. `handled()` therefore pairs the usual handler (it raises `Interrupted`, a
`KeyboardInterrupt`, so that `finally` blocks run and the CLI prints its line) with a watchdog
thread that the signal itself wakes (`signal.set_wakeup_fd`): if the command has not ended
`GRACE_S` after the signal, the watchdog prints the line and ends the process (`os._exit`, no
cleanup to hang on). Worker processes ignore SIGINT and exit when their parent is gone
(parallel.py). A verb that stops on signals by itself (`bench`: it stores the finished runs
first) holds `graceful()` meanwhile, and the watchdog leaves it be.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)
GRACE_S = 1.0  # after a signal, the command's own handling has this long before the watchdog ends it
MESSAGE = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}
STATUSES = frozenset(128 + int(sig) for sig in SIGNALS)  # the exit statuses of a stopped command


class Interrupted(KeyboardInterrupt):
    """A signal stopped the command; `exit_status` is 128 + its number (130, 143)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


def exit_status(exc: KeyboardInterrupt) -> int:
    return exc.exit_status if isinstance(exc, Interrupted) else 128 + signal.SIGINT


def message(exc: KeyboardInterrupt) -> str:
    """The one line a stopped command prints."""
    signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
    return f"comoe-opt: {MESSAGE.get(signal.Signals(signum), 'stopped')}"


class _State:
    """What the handler, the watchdog and the command share."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reported = False  # the line was printed (by either side)
        self.graceful = 0  # depth of `graceful()` blocks
        self.done = threading.Event()  # the command ended


_state: _State | None = None


def report_once(text: str, *, raw: bool = False) -> bool:
    """Print `text` on stderr unless a stopped command's line was printed already; whether printed.
    `raw` writes to descriptor 2 itself (the watchdog, which ends the process without flushing)."""
    state = _state
    if state is not None:
        with state.lock:
            if state.reported:
                return False
            state.reported = True
    if raw:
        os.write(2, (text + "\n").encode())
    else:
        print(text, file=sys.stderr, flush=True)
    return True


@contextlib.contextmanager
def graceful() -> Iterator[None]:
    """A block that stops on signals by itself: the watchdog does not end the process meanwhile."""
    state = _state
    if state is None:
        yield
        return
    with state.lock:
        state.graceful += 1
    try:
        yield
    finally:
        with state.lock:
            state.graceful -= 1


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """Signals stop the block as described above; outside the main thread, a no-op."""
    global _state
    if threading.current_thread() is not threading.main_thread() or _state is not None:
        yield
        return
    state = _State()
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
    old_wakeup = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    watchdog = threading.Thread(target=_watch, args=(read_fd, state), daemon=True, name="signal-watchdog")
    _state = state
    for sig in SIGNALS:
        signal.signal(sig, _raise)
    watchdog.start()
    try:
        yield
    finally:
        state.done.set()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(old_wakeup)
        with contextlib.suppress(OSError):
            os.write(write_fd, b"\0")  # wakes the watchdog, which sees `done` and returns
        watchdog.join()
        os.close(read_fd)
        os.close(write_fd)
        _state = None


def _raise(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signum)


def _watch(read_fd: int, state: _State) -> None:
    spared = False  # a graceful block was left to stop by itself once; a second signal ends it
    while True:
        data = os.read(read_fd, 64)
        if state.done.is_set() or not data:
            return
        signums = [b for b in data if b in (int(signal.SIGINT), int(signal.SIGTERM))]
        if not signums:
            continue
        if state.done.wait(GRACE_S):
            return
        with state.lock:
            spare = state.graceful > 0 and not spared
        if spare:
            spared = True
            continue
        report_once(message(Interrupted(signums[0])), raw=True)
        os._exit(128 + signums[0])
