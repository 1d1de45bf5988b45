"""The machine a benchmark ran on, for the headers of result tables."""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
from pathlib import Path

import numpy as np


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def nproc() -> int:
    """Processors available to this process, as `nproc` reports."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def describe() -> str:
    """One line: date, commit, cores, CPU, Python and NumPy versions."""
    return (
        f"Date {dt.date.today().isoformat()}; commit {commit()}; nproc {nproc()}; CPU {cpu_model()};"
        f" Python {platform.python_version()}; NumPy {np.__version__}."
    )
