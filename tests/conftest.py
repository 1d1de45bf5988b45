"""Shared fixtures: small instance tables, a CLI runner, and the real traces.

Real traces live in `../shared/traces` relative to the project root; tests
that need them skip (with the reason) when they are absent. The 36 MB GPT-OSS
routing file is read once per session.
"""

from __future__ import annotations

import copy
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tomli_w
from hypothesis import HealthCheck, settings

from comoe_opt import highs
from comoe_opt.cli import main
from comoe_opt.deadline import Deadline
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.problem import ResidencyProblem

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))  # the studies' modules (benchmarks/studies/) and scripts
BASELINE = ROOT / "instances" / "paper-baseline.toml"
TRACES = ROOT / ".." / "shared" / "traces"
GPTOSS = TRACES / "gptoss20b" / "gptoss20b_routing.npz"

# No test depends on wall-clock speed: hypothesis deadlines off.
settings.register_profile(
    "comoe", deadline=None, max_examples=40, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("thorough", parent=settings.get_profile("comoe"), max_examples=1000)
settings.load_profile("comoe")  # `pytest --hypothesis-profile=thorough` for a longer search


@pytest.fixture(autouse=True)
def _off_the_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test's result may depend on the wall clock: a deadline with a finite limit on the real
    clock fails the test the moment anything asks it how much time is left. Tests of time-limit
    behaviour drive `Deadline` with a fake clock; solves without a clock end on work limits."""

    def guarded(method: Callable[..., Any]) -> Callable[..., Any]:
        def call(self: Deadline, *args: Any, **kwargs: Any) -> Any:
            if math.isfinite(self.limit_s) and self.clock is time.perf_counter:
                raise AssertionError(
                    f"a result under a wall-clock limit ({self.limit_s:g} s): use work limits"
                    " (solve --work-limits, time_limit_s=None) or a Deadline with a fake clock"
                )
            return method(self, *args, **kwargs)

        return call

    for name in ("expired", "remaining", "share"):
        monkeypatch.setattr(Deadline, name, guarded(getattr(Deadline, name)))
    # HiGHS measures real seconds: in tests it gets no time limit (its calls then end on their work
    # limits), and the limit the code meant to hand it is recorded for the tests of deadlines
    _HANDED.clear()

    def handed(seconds: float) -> float:
        _HANDED.append(seconds)
        return math.inf

    monkeypatch.setattr(highs, "handed_time_limit", handed)


_HANDED: list[float] = []


@pytest.fixture
def highs_limits() -> list[float]:
    """The time limits the code handed HiGHS in this test (HiGHS itself ran on work limits)."""
    return _HANDED


def small_table() -> dict[str, Any]:
    """A valid instance table, small enough to generate in milliseconds."""
    return {
        "name": "small",
        "model": {
            "layers": 3,
            "experts_per_layer": 8,
            "top_k": 2,
            "page_gb": 1.0,
            "hidden_size": 16,
            "bytes_per_element": 2,
        },
        "hardware": {
            "chiplets": 4,
            "capacity_gb": 4,
            "local_bandwidth_gb_s": 100,
            "peak_tflops": 10,
            "d2d_bandwidth_gb_s": 50,
            "nop_hops": [1, 1, 2, 2],
            "hop_latency_ns": 20,
            "prefetch_buffer_gb": 1,
        },
        "trace": {
            "kind": "synthetic",
            "zipf_alpha": 1.1,
            "rho": 0.65,
            "drift_every": 5,
            "tokens_per_batch": 8,
            "micro_batches": 12,
            "seed": 3,
        },
        "policy": {"window_batches": 4},
    }


@pytest.fixture
def table() -> dict[str, Any]:
    """A fresh copy of the small valid instance table (mutate freely)."""
    return copy.deepcopy(small_table())


@pytest.fixture
def write_toml(tmp_path: Path) -> Callable[..., Path]:
    """Write a table (or raw text) to `tmp_path/<name>.toml` and return the path."""

    def write(content: dict[str, Any] | str, name: str = "inst") -> Path:
        path = tmp_path / f"{name}.toml"
        text = content if isinstance(content, str) else tomli_w.dumps(content)
        path.write_text(text, encoding="utf-8")
        return path

    return write


@dataclass
class CliResult:
    code: int
    out: str
    err: str

    def json(self) -> dict[str, Any]:
        """The single JSON object on stdout (fails if there is anything else)."""
        lines = self.out.strip().splitlines()
        assert len(lines) == 1, f"expected one line of JSON, got {len(lines)}"
        obj = json.loads(lines[0])
        assert isinstance(obj, dict)
        return obj

    def assert_user_error(self, *needles: str) -> str:
        """Exit 2, exactly one stderr line, no traceback, mentioning every needle."""
        assert self.code == 2, (self.code, self.err)
        assert "Traceback" not in self.err
        lines = self.err.strip().splitlines()
        assert len(lines) == 1, self.err
        for needle in needles:
            assert needle in lines[0], (needle, lines[0])
        return lines[0]


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., CliResult]:
    """Run `comoe_opt.cli.main` in-process; argparse exits are turned into codes."""

    def run(*args: str | Path) -> CliResult:
        capsys.readouterr()
        try:
            code = main([str(a) for a in args])
        except SystemExit as exc:  # argparse usage errors
            code = exc.code if isinstance(exc.code, int) else 1
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


@pytest.fixture(scope="session")
def traces_dir() -> Path:
    if not TRACES.is_dir():
        pytest.skip(f"real traces not present at {TRACES}")
    return TRACES


@pytest.fixture(scope="session")
def gptoss_trace():
    """The GPT-OSS-20B per-token routing trace, read once per session."""
    from comoe_opt.trace import read_trace

    if not GPTOSS.is_file():
        pytest.skip(f"GPT-OSS routing trace not present at {GPTOSS}")
    return read_trace(GPTOSS)


@pytest.fixture(scope="session")
def gptoss_stats(gptoss_trace):
    from comoe_opt.stats import trace_stats

    return trace_stats(gptoss_trace)


def make_problem(
    miss,
    work,
    capacity,
    *,
    tokens=None,
    nop=None,
    copy_ms=0.0,
    batches=1,
    previous=None,
    leased=None,
    budget=None,
    max_replicas=None,
    tenants=(),
    all_resident=False,
) -> ResidencyProblem:
    """A slow-loop problem from plain lists (work [L, E] is the same on every chiplet)."""
    miss = np.asarray(miss, dtype=float)
    work = np.asarray(work, dtype=float)
    if work.ndim == 2:  # same work on every chiplet
        work = np.repeat(work[:, :, None], len(capacity), axis=2)
    capacity = np.asarray(capacity, dtype=np.int64)
    return ResidencyProblem(
        miss_ms=miss,
        work_ms=work,
        tokens=np.ones_like(miss) if tokens is None else np.asarray(tokens, dtype=float),
        peak_tokens=np.ones_like(miss) if tokens is None else np.asarray(tokens, dtype=float),
        nop_ms_per_token=np.zeros(capacity.size) if nop is None else np.asarray(nop, dtype=float),
        capacity_pages=capacity,
        budget_pages=int(capacity.sum()) if budget is None else budget,
        max_replicas=capacity.size if max_replicas is None else max_replicas,
        copy_ms=copy_ms,
        batches=batches,
        previous=None if previous is None else Placement(np.asarray(previous, dtype=bool)),
        leased=None if leased is None else np.asarray(leased, dtype=bool),
        tenants=tenants,
        all_resident=all_resident,
    )
