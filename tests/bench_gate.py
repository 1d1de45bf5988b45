"""A suite run that is interrupted at a chosen point, for the runner's SIGTERM test.

`python tests/bench_gate.py GATE ARGS...` runs `comoe-opt bench ARGS...` in which the first run
goes through and every later run waits on the FIFO `GATE`, which nothing ever writes to, and
the runner sends itself SIGTERM as it stores the first run. So exactly one run has finished
when the signal lands, whatever the machine's speed: no race, no sleep.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from comoe_opt.bench import kinds
from comoe_opt.bench.spec import RunSpec

GATE_ENV = "COMOE_TEST_GATE"


def gated_run_one(spec: RunSpec):
    """The first run to claim the marker runs; the others block on the gate until killed."""
    gate = Path(os.environ[GATE_ENV])
    try:
        os.close(os.open(gate.with_suffix(".first"), os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        with open(gate, "rb"):  # a FIFO's open blocks until a writer opens it: never
            pass
    return kinds.run_one(spec)


def main() -> int:
    from comoe_opt.bench import executors, runner
    from comoe_opt.cli import main as cli_main

    gate = sys.argv[1]
    os.environ[GATE_ENV] = gate
    os.mkfifo(gate)
    import bench_gate  # by its module name, so that workers unpickle it (tests/ on PYTHONPATH)

    executors.run_one = bench_gate.gated_run_one
    real_store = runner._store

    def store_then_stop(*args, **kwargs):
        stored = real_store(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # the handler only sets the runner's flag
        return stored

    runner._store = store_then_stop
    return cli_main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
