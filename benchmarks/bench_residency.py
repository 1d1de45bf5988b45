"""Slow-loop benchmark: proven gaps and times of `milp` and `exact`, heuristics' gaps, at three scales.

For the first window of each instance (paper baseline: 100 micro-batches,
seed 0, on the mean load and with 32 balance scenarios; DeepSeek-V3 scale: 20
micro-batches of 4096 tokens, on the mean load and with 16 scenarios;
GPT-OSS-20B decode steps with 32 scenarios: 32 steps), solves with every
method and reports objective, the gap to the best proven bound on the part of
the objective a placement changes, and time (median over --runs; `exact`
runs once, to its time limit). Also probes the plain x[l,e,c] MILP at paper
scale. Writes `benchmarks/results/residency.md`.

Then how far each solve overruns its time limit (wall time − limit, with the
time of every phase) at limits of 2 and 10 s, for GPT-OSS, the paper
baseline (mean load and 32 scenarios) and a small instance shaped like the
one that overran (5 layers x 60 experts, top-4, 16 scenarios): written to
`benchmarks/results/time-limits.md`; `--overrun-only` runs just that table.

    .venv/bin/python benchmarks/bench_residency.py [--runs 3] [--skip-full] [--overrun-only]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import statistics
import sys
import time
from pathlib import Path

from _common import describe, script_args

from comoe_opt.instance import load_instance, with_overrides
from comoe_opt.residency.heuristics import HEURISTICS
from comoe_opt.residency.problem import residency_problem
from comoe_opt.residency.solve import solve
from comoe_opt.results import relative_gap
from comoe_opt.stats.demand import window_demand
from comoe_opt.trace import instance_batches

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "benchmarks" / "results" / "residency.md"
OVERRUN_RESULT = ROOT / "benchmarks" / "results" / "time-limits.md"
PAPER = ROOT / "instances" / "paper-baseline.toml"
DEEPSEEK = ROOT / "instances" / "deepseek-v3-ep32.toml"
# name, instance, time limit (s), target gap, overrides
CASES = [
    ("paper-baseline", PAPER, 10.0, 1e-3, {}),
    ("paper-baseline, 32 balance scenarios", PAPER, 30.0, 1e-2, {"policy.balance_scenarios": 32}),
    ("deepseek-v3-ep32", DEEPSEEK, 60.0, 1e-2, {}),
    ("deepseek-v3-ep32, 16 balance scenarios", DEEPSEEK, 120.0, 1e-2, {"policy.balance_scenarios": 16}),
    ("real-gptoss20b, balance scenarios", ROOT / "instances" / "real-gptoss20b.toml", 10.0, 1e-2, {}),
]
SCENARIO_NOTE = (
    "Balance is scored on {s} scenarios (sampled micro-batches, each routed at its best). `milp`'s bound"
    " is the replica-count relaxation with per-scenario cuts; `exact` adds the exact scenario model"
    " (row generation on the cut condition) where chiplets are related (every set enumerated up to 12"
    " chiplets, by min cut beyond; the cut model itself only up to 131,072 binaries, else `exact`"
    " searches longer) (formulations/residency.md). Without the scenario search, `milp` returns {m:.6g} ms."
)


def first_window_problem(path: Path, overrides: dict):
    instance = with_overrides(load_instance(path), overrides)
    batches = instance_batches(instance)
    window = batches.window(0, min(instance.policy.window_batches, batches.batches))
    return instance, residency_problem(instance, window_demand(window, instance.policy))


def bench_case(name: str, path: Path, limit: float, gap: float, overrides: dict, runs: int) -> list[str]:
    _, problem = first_window_problem(path, overrides)
    milp_runs = [solve(problem, "milp", time_limit_s=limit, mip_gap=gap) for _ in range(runs)]
    milp = milp_runs[0]
    exact = solve(problem, "exact", time_limit_s=limit, mip_gap=gap) if problem.scenarios else milp
    bound = max(milp.bound, exact.bound)
    times = [r.runtime_s for r in milp_runs]
    builds = [r.report.build_s for r in milp_runs]
    solver = [r.report.solver_s for r in milp_runs]
    shape = f"{problem.layers} layers x {problem.experts} experts x {problem.chiplets} chiplets"
    lines = [
        f"## {name} ({shape}, window of {problem.batches} micro-batches)",
        "",
        f"MILP: status **{milp.status.value}**, objective {milp.objective:.6g} ms, proven bound"
        f" {milp.bound:.6g} ms, gap **{100 * milp.gap:.4f}%** on what a placement changes (the other"
        f" {problem.constant_ms:.6g} ms are every token's least NoP; target <= {100 * gap:g}% in"
        f" {limit:g} s); time median {statistics.median(times):.2f} s over {runs} runs (min {min(times):.2f},"
        f" max {max(times):.2f}); Pyomo build {statistics.median(builds):.2f} s; HiGHS incl. model"
        f" hand-over {statistics.median(solver):.2f} s; placement from {milp.report.placement_from}.",
        "",
    ]
    if problem.scenarios:
        lines += [
            f"Exact: status **{exact.status.value}**, objective {exact.objective:.6g} ms, proven bound"
            f" {exact.bound:.6g} ms, gap **{100 * exact.gap:.4f}%**, time {exact.runtime_s:.1f} s;"
            f" {exact.report.cut_rounds or 0} rounds, {exact.report.cuts or 0} cuts;"
            f" placement from {exact.report.placement_from}.",
            "",
        ]
    if problem.scenarios:
        lines += [SCENARIO_NOTE.format(s=problem.scenarios, m=_before_search(problem, milp)), ""]
    lines += [
        "| method | status | objective ms | gap to best bound | time s (median) | pages | replica factor |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for method in ("milp", "exact", *HEURISTICS, "lp"):
        if method == "exact" and not problem.scenarios:
            continue
        results = {"milp": milp_runs, "exact": [exact]}.get(method) or [
            solve(problem, method) for _ in range(runs)
        ]
        r = results[0]
        t = statistics.median(x.runtime_s for x in results)
        g = relative_gap(r.objective, bound, problem.constant_ms)
        pages = r.solution.pages if r.solution is not None else "-"
        factor = f"{r.solution.replica_factor():.3f}" if r.solution is not None else "-"
        row = [method, r.status.value, f"{r.objective:.6g}", f"{100 * g:.3f}%", f"{t:.4f}", pages, factor]
        lines.append("| " + " | ".join(map(str, row)) + " |")
    lines.append("")
    return lines


def _before_search(problem, milp) -> float:
    """Objective of the MILP's placement without the scenario search."""
    unsearched = dataclasses.replace(problem, search_moves=0)
    return solve(unsearched, "milp", time_limit_s=10.0, mip_gap=1e-3).objective


def bench_full_probe(limit: float) -> list[str]:
    _, problem = first_window_problem(CASES[0][1], {})
    start = time.perf_counter()
    r = solve(problem, "full", time_limit_s=limit, mip_gap=1e-3)
    wall = time.perf_counter() - start
    return [
        "## The plain x[l,e,c] MILP at paper scale, for comparison",
        "",
        f"Same window, `--method full`, time limit {limit:g} s: status {r.status.value}, objective"
        f" {r.objective:.6g}, bound {r.bound:.6g}, gap {100 * r.gap:.3f}%, wall {wall:.1f} s"
        " (Pyomo build included).",
        "",
    ]


# name, instance, overrides, methods: the time-limit overrun table
OVERRUN_CASES = [
    ("real-gptoss20b, 32 scenarios", ROOT / "instances" / "real-gptoss20b.toml", {}, ("milp", "exact")),
    ("paper-baseline", PAPER, {}, ("milp",)),
    ("paper-baseline, 32 scenarios", PAPER, {"policy.balance_scenarios": 32}, ("milp", "exact")),
    (
        "paper-baseline as 5 x 60, top-4, 16 scenarios",
        PAPER,
        {
            "model.layers": 5,
            "model.experts_per_layer": 60,
            "model.top_k": 4,
            "trace.tokens_per_batch": 25,
            "hardware.capacity_gb": 50,
            "policy.all_resident": True,
            "policy.balance_scenarios": 16,
        },
        ("milp", "exact"),
    ),
]
OVERRUN_LIMITS = (2.0, 10.0)


def bench_overrun() -> list[str]:
    """Wall time past the limit of each solve, with its phases (one run each: a busy machine
    shows in the spread between rows more than a median would hide)."""
    lines = [
        "# Time limits: how far a solve overruns",
        "",
        'Every phase of `solve` draws on one deadline (formulations/residency.md, "Time limit"):'
        " overrun = wall time of `solve` − the limit (negative: finished early). First window of each"
        " instance, one run each, target gap 1e-3 (never reached with scenarios, so those solves"
        " run to the limit). Phases in seconds; `stopped` lists what the deadline skipped or cut"
        " short. `.venv/bin/python benchmarks/bench_residency.py --overrun-only`.",
        "",
        "| instance | method | limit s | status | wall s | overrun s | phases s | stopped |",
        "|---|---|---:|---|---:|---:|---|---|",
    ]
    load = os.getloadavg()[0]
    worst: tuple[float, str] = (-math.inf, "")
    for name, path, overrides, methods in OVERRUN_CASES:
        _, problem = first_window_problem(path, overrides)
        for method in methods:
            for limit in OVERRUN_LIMITS:
                start = time.perf_counter()
                r = solve(problem, method, time_limit_s=limit, mip_gap=1e-3)
                wall = time.perf_counter() - start
                phases = ", ".join(f"{k} {v:.2f}" for k, v in r.report.timing.phases.items())
                stopped = "; ".join(r.report.timing.stopped_by_time_limit) or "-"
                row = [name, method, f"{limit:g}", r.status.value, f"{wall:.2f}", f"{wall - limit:+.2f}",
                       phases, stopped]  # fmt: skip
                lines.append("| " + " | ".join(row) + " |")
                print(lines[-1], file=sys.stderr)
                worst = max(worst, (wall - limit, f"{name}, {method}, {limit:g} s"))
    return [
        *lines,
        "",
        f"Largest overrun: {worst[0]:+.2f} s ({worst[1]}). Load average {load:.1f} when the table"
        f" started, {os.getloadavg()[0]:.1f} when it ended, on 2 cores.",
        "",
    ]


def write_overrun(path: Path) -> None:
    lines = bench_overrun()
    lines += [describe() + " Machine shared with other engineers' jobs while this ran.", ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--skip-full", action="store_true", help="skip the plain-model probe")
    parser.add_argument("--overrun-only", action="store_true", help="only the time-limit overrun table")
    parser.add_argument("--overrun-output", type=Path, default=OVERRUN_RESULT)
    script_args(parser, RESULT)
    args = parser.parse_args(argv)
    cases = CASES
    if args.smoke:  # the paper baseline once on a short limit; no plain-model probe, no overrun table
        cases, args.runs, args.skip_full = [("paper-baseline", PAPER, 2.0, 1e-2, {})], 1, True
    if args.overrun_only:
        write_overrun(args.overrun_output)
        return 0
    lines = [
        "# Slow loop: residency MILP and heuristics",
        "",
        "Objective: window objective in ms (formulations/residency.md); gap = (objective - bound) /"
        " (objective - constant), the constant being every token's least NoP, against the best proven"
        " lower bound. `.venv/bin/python benchmarks/bench_residency.py`.",
        "",
    ]
    for name, path, limit, gap, overrides in cases:
        lines += bench_case(name, path, limit, gap, overrides, args.runs)
        print("\n".join(lines), file=sys.stderr)
    if not args.skip_full:
        lines += bench_full_probe(CASES[0][2])
    lines += [describe(), ""]
    text = "\n".join(lines)
    print(text)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text, encoding="utf-8")
    if not args.smoke:
        write_overrun(args.overrun_output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
