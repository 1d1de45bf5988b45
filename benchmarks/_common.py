"""What the benchmark scripts share: the machine line of every result, the regime suite's
instances, the GPT-OSS window problem, and the drop-in replay's planners and table. Scripts import
this module and the package, never each other (tests/test_benchmarks.py runs every script).

Every script takes `--output FILE` (its results file by default) and `--smoke` (a tiny input that
ends in seconds: the test's run; it writes only to `--output`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from comoe_opt.bench.provenance import commit, machine
from comoe_opt.instance import Instance, load_instance, with_overrides
from comoe_opt.planning import plan_window
from comoe_opt.replay import DropIn, EplbLayout, Planner, Rolling, Run, replay
from comoe_opt.replay.planners import EplbOnSteps
from comoe_opt.residency.problem import ResidencyProblem
from comoe_opt.trace import instance_batches

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
GPTOSS = ROOT / "instances" / "real-gptoss20b.toml"
PORT = "EPLB port"  # the drop-in replay's timing reference: our EPLB port called directly
REGIMES_DIR = ROOT / "instances" / "regimes"


def describe() -> str:
    """One line: the command that ran, date, commit, cores, CPU, Python and NumPy versions."""
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    command = " ".join([".venv/bin/python", str(shown), *sys.argv[1:]])
    when = dt.date.today().isoformat()
    return f"Command `{command}`. Date {when}; commit {commit()}; {machine()}; NumPy {np.__version__}."


def script_args(parser: argparse.ArgumentParser, result: Path) -> None:
    """The two arguments every script takes."""
    parser.add_argument("--output", type=Path, default=result, help=f"results file (default {result.name})")
    parser.add_argument(
        "--smoke", action="store_true", help="a tiny input that ends in seconds (the test's run)"
    )


def window_problem(path: Path, window: int, overrides: dict | None = None) -> ResidencyProblem:
    """The window's problem through the project's planning path (as `solve --window` builds it)."""
    instance = with_overrides(load_instance(path), overrides or {})
    part = instance_batches(instance).planning_window(window, instance.policy.window_batches)
    return plan_window(instance, part, method="static").problem


# ---- the regime suite's instances


@dataclass(frozen=True)
class Regime:
    key: str
    path: Path
    steps: int  # the first N steps are run (bounded: the suite must end in well under an hour)
    target: str  # the figures the regime is calibrated to (or "assumed")
    frontier: bool = True  # False where the sweep would not fit the suite's time
    # policy.migration_weight values the suite sweeps (the instance's own default is added: -1, the
    # weight chosen per window by backtest): fewer than `compare --frontier` (each point re-plans
    # every window), from free copies to the copies' whole time
    weights: tuple[float, ...] = (0.0, 0.05, 1.0)


REGIMES = (
    Regime(
        "A",
        REGIMES_DIR / "a-128x-top1-decode.toml",
        192,
        "0.5 selections/expert/step; per-layer alpha 0.73-1.13, hottest 4-26%; one layer 99.9% on one"
        " expert; predictability 0.24 vs popularity 0.17; 3 topics in turn",
    ),
    Regime(
        "B",
        REGIMES_DIR / "b-64x-top6-prefill.toml",
        128,
        "48 selections/expert/step; all-selection alpha 0.14-0.27, rank-1 alpha ~0.95, hottest ~3%;"
        " short prompts of changing content",
    ),
    Regime(
        "C",
        REGIMES_DIR / "c-60x-top4-decode.toml",
        64,
        "1.7 selections/expert/step (skew assumed)",
        weights=(0.0, 1.0),
    ),
    Regime(
        "GPT-OSS (real)",
        GPTOSS,
        192,
        "the real trace: alpha 0.60 (0.41-0.82), predictability 0.41 vs 0.13",
        weights=(0.0, 1.0),
    ),
    Regime(
        "GPT-OSS (synthetic)",
        REGIMES_DIR / "gptoss-synthetic.toml",
        128,
        "alpha 0.60 (0.41-0.82), predictability 0.41 vs popularity 0.13",
    ),
    Regime(
        "OLMoE",
        REGIMES_DIR / "olmoe-5-domains.toml",
        64,
        "pooled alpha 0.39 (0.27-0.87 per domain), predictability 0.26 vs 0.12; 5 domains",
    ),
    Regime("Switch-128", REGIMES_DIR / "switch-128x-top1.toml", 64, "alpha 0.89 (0.51-1.18)"),
    Regime(
        "Mixtral",
        REGIMES_DIR / "mixtral-8x-top2.toml",
        128,
        "alpha 0.12 (0.06-0.16), predictability 0.21 vs 0.14",
    ),
    Regime(
        "DeepSeek-V3",
        REGIMES_DIR / "deepseek-v3-ep32.toml",
        64,
        "shape only (58 x 256, top-8, 32 GPUs); skew assumed",
    ),
)


SCALE_DIR = ROOT / "instances" / "scale"
# The scale suite: the deployments where expert balancing pays (32-144 GPUs, 128-384 experts), on
# the same generator; DeepSeek-V3 EP32 calibrated to TensorRT-LLM's published EP32 statistics, the
# rest take its routing constants (each instance file says which figures are assumed)
SCALE = (
    Regime(
        "DeepSeek-V3 EP32",
        SCALE_DIR / "deepseek-v3-ep32-prefill.toml",
        64,
        "TensorRT-LLM's DeepSeek-R1 at EP32: static (max - mean)/mean 1.56 (per layer 0.46-2.46);"
        " EPLB 0.115 (EP36, 288 slots)",
        frontier=False,
    ),
    Regime(
        "DeepSeek-V3 EP144",
        SCALE_DIR / "deepseek-v3-ep144-decode.toml",
        64,
        "EP32's constants",
        frontier=False,
    ),
    Regime("Kimi-K2 EP64", SCALE_DIR / "kimi-k2-ep64.toml", 64, "EP32's constants (assumed)", frontier=False),
    Regime(
        "Qwen3-235B EP16",
        SCALE_DIR / "qwen3-235b-ep16.toml",
        64,
        "EP32's constants (assumed)",
        frontier=False,
    ),
    Regime(
        "Qwen3-235B EP32",
        SCALE_DIR / "qwen3-235b-ep32.toml",
        64,
        "EP32's constants (assumed)",
        frontier=False,
    ),
)
SUITES = {"regimes": REGIMES, "scale": SCALE}


def slug(key: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in key.lower()).strip("-")


# ---- the drop-in replay: EPLB's port and the drop-in, re-planned as the instance's policy re-plans


def dropin_planners(instance: Instance, steps: np.ndarray, **extra: Planner) -> dict[str, Planner]:
    """EPLB (the `eplb` heuristic through the rolling horizon, as compare's peer), the EPLB port
    called as an engine calls it (`deepseek_eplb` on the history's sum: the same plans, and the
    time the drop-in's planning time is measured against), the drop-in with each dispatch at its
    defaults, and any `extra` planners under their own names."""
    layout = EplbLayout.of(instance, steps, "the drop-in replay")
    return {
        "EPLB": Rolling(instance, "eplb"),
        PORT: EplbOnSteps(layout),
        "ours, even": DropIn(layout, "even", label="ours, even"),
        "ours, lp": DropIn(layout, "lp", label="ours, lp"),
        **extra,
    }


def drawn_steps(path: Path, steps: int, seed: int | None) -> tuple[Instance, np.ndarray]:
    """(the instance, its first `steps` per-step counts) of an instance file whose generator is
    drawn with `seed` (None: the file's own): the same regime, another draw."""
    from comoe_opt.trace import load_trace
    from comoe_opt.trace.batching import step_counts

    instance = load_instance(path)
    if seed is not None:
        instance = with_overrides(instance, {"trace.seed": seed})
    instance, trace = load_trace(instance)
    return instance, step_counts(instance_batches(instance, trace))[:steps]


def dropin_runs(
    instance: Instance, steps: np.ndarray, planners: dict[str, Planner], foresight: str = "history"
) -> dict[str, Run]:
    """Each planner replayed on `steps` with the instance's windows and history."""
    from comoe_opt.trace.batching import windows

    spans = windows(steps.shape[0], instance.policy.window_batches)
    history = instance.policy.history_windows
    return {name: replay(p, steps, spans, history, foresight) for name, p in planners.items()}  # type: ignore[arg-type]


def dropin_table(runs: dict[str, Run], steps: np.ndarray) -> list[str]:
    """P95/P99 under the even split and the best split (SGLang's `lp`), each against EPLB's, median
    planning time, copies per re-plan and against EPLB's."""
    scores = {
        name: (run.served(steps, "even").imbalance, run.served(steps, "lp").imbalance)
        for name, run in runs.items()
    }
    ep_even, ep_best = (float(np.percentile(x, 95)) for x in scores["EPLB"])
    ep_copies = runs["EPLB"].copies_per_replan()
    lines = [
        "| balancer | P95 even | P99 even | P95 best split | P99 best split | P95 even vs EPLB"
        " | P95 best vs EPLB | median plan ms | copies / re-plan | copies vs EPLB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, run in runs.items():
        even, best = scores[name]
        p95e, p99e, p95b, p99b = (float(np.percentile(x, q)) for x in (even, best) for q in (95, 99))
        copies = run.copies_per_replan()
        lines.append(
            f"| {name} | {p95e:.4f} | {p99e:.4f} | {p95b:.4f} | {p99b:.4f}"
            f" | {100 * (p95e / ep_even - 1):+.1f}% | {100 * (p95b / ep_best - 1):+.1f}%"
            f" | {1e3 * float(np.median(run.plan_s)):.1f} | {copies:.1f}"
            f" | {f'{copies / ep_copies:.3f}' if ep_copies else '–'} |"
        )
    return lines


def p95(run: Run, steps: np.ndarray, dispatch: str) -> float:
    return float(np.percentile(run.served(steps, dispatch).imbalance, 95))
