"""The machine a benchmark ran on, for the headers of result tables."""

from __future__ import annotations

import datetime as dt

import numpy as np

from comoe_opt.bench.provenance import commit, machine


def describe() -> str:
    """One line: date, commit, cores, CPU, Python and NumPy versions."""
    return f"Date {dt.date.today().isoformat()}; commit {commit()}; {machine()}; NumPy {np.__version__}."
