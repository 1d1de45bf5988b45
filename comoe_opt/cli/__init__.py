"""The `comoe-opt` command: every verb is a thin call into the library.

Every verb accepts `--json` and then prints one JSON object on stdout: while a
verb runs, everything else (library warnings, solver output, worker processes)
goes to stderr. User errors print one line on stderr and exit with status 2.
Nothing outside this package imports it.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterator, Sequence
from typing import NoReturn, TextIO

from comoe_opt import interrupts
from comoe_opt.cli.common import USER_ERROR, emit
from comoe_opt.cli.parser import build_parser
from comoe_opt.errors import ComoeError


def run() -> NoReturn:
    """The program's entry (`comoe-opt`, `python -m comoe_opt.cli`): `main`, then exit. After a
    signal the process ends at once once its line is printed: the interpreter's own exit would
    wait for threads and child processes a stopped command may leave behind."""
    status = main()
    if status in interrupts.STATUSES:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


def main(argv: Sequence[str] | None = None) -> int:
    with interrupts.handled():  # SIGINT / SIGTERM: one line, exit 130 / 143, within about a second
        try:
            return _run(argv)
        except BrokenPipeError:  # the reader went away (`... | head`): nothing more to say
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        except KeyboardInterrupt as stop:  # arrived outside the verb (parsing, printing the result)
            interrupts.report_once(interrupts.message(stop))
            return interrupts.exit_status(stop)


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "handler"):
        parser.print_help()
        return USER_ERROR
    try:
        with _stdout_for_the_result_only():
            result = args.handler(args)
    except ComoeError as exc:
        print(f"comoe-opt: error: {one_line(str(exc))}", file=sys.stderr)
        return USER_ERROR
    except KeyboardInterrupt as stop:  # a signal (comoe_opt/interrupts.py)
        sys.stderr.flush()
        interrupts.report_once(interrupts.message(stop))
        return interrupts.exit_status(stop)
    emit(result, args.json)
    sys.stdout.flush()
    return int(result.get("_exit", 0))  # a verb whose output stands but is incomplete (bench)


@contextlib.contextmanager
def _stdout_for_the_result_only() -> Iterator[None]:
    """While a verb runs, anything else bound for stdout (a library's print or log record, a
    solver's own output, a worker process started meanwhile) goes to stderr: stdout carries the
    result only. The descriptor is moved, not `sys.stdout`: libraries that capture output
    (Pyomo's solver interfaces) need stdout and stderr to stay distinct streams."""
    out = sys.stdout
    swapped = _point_fd(out, sys.stderr)
    if swapped is None:  # no descriptor (the CLI called in-process): Python's writes at least
        sys.stdout = _ToStderr()
    try:
        yield
    finally:
        if swapped is None:
            sys.stdout = out
        else:
            fd, saved = swapped
            out.flush()  # what was written meanwhile goes to stderr, not later to stdout
            os.dup2(saved, fd)
            os.close(saved)


def _point_fd(out: TextIO, err: TextIO) -> tuple[int, int] | None:
    """Point `out`'s file descriptor at `err`'s; (descriptor, saved copy) to restore it, or None
    when either stream has none."""
    try:
        fd, target = out.fileno(), err.fileno()
        out.flush()
    except (AttributeError, OSError, ValueError):
        return None
    saved = os.dup(fd)
    os.dup2(target, fd)
    return fd, saved


class _ToStderr(io.TextIOBase):
    """Stdout for Python's writes when it has no descriptor to move: forwards to stderr."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def one_line(message: str) -> str:
    """A user error on one line: messages quoted from libraries may span several."""
    return " ".join(message.split())
