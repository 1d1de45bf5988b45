"""Slow-loop benchmark: proven gaps and times of `milp` and `exact`, heuristics' gaps, at three scales.

For the first window of each instance (paper baseline: 100 micro-batches,
seed 0, on the mean load and with 32 balance scenarios; DeepSeek-V3 scale: 20
micro-batches of 4096 tokens, on the mean load and with 16 scenarios;
GPT-OSS-20B decode steps with 32 scenarios: 32 steps), solves with every
method and reports objective, the gap to the best proven bound on the part of
the objective a placement changes, and time (median over --runs; `exact`
runs once, to its time limit). Also probes the plain x[l,e,c] MILP at paper
scale. Writes `benchmarks/results/residency.md`.

    .venv/bin/python benchmarks/bench_residency.py [--runs 3] [--skip-full]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

from machine import describe

from comoe_opt.instance import load_instance, with_overrides
from comoe_opt.residency.heuristics import HEURISTICS
from comoe_opt.residency.problem import residency_problem
from comoe_opt.residency.solve import solve
from comoe_opt.results import relative_gap
from comoe_opt.stats.demand import window_demand
from comoe_opt.trace import instance_batches

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "benchmarks" / "results" / "residency.md"
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
    builds = [r.report["build_s"] for r in milp_runs]
    solver = [r.report["solver_s"] for r in milp_runs]
    shape = f"{problem.layers} layers x {problem.experts} experts x {problem.chiplets} chiplets"
    lines = [
        f"## {name} ({shape}, window of {problem.batches} micro-batches)",
        "",
        f"MILP: status **{milp.status.value}**, objective {milp.objective:.6g} ms, proven bound"
        f" {milp.bound:.6g} ms, gap **{100 * milp.gap:.4f}%** on what a placement changes (the other"
        f" {problem.constant_ms:.6g} ms are every token's least NoP; target <= {100 * gap:g}% in"
        f" {limit:g} s); time median {statistics.median(times):.2f} s over {runs} runs (min {min(times):.2f},"
        f" max {max(times):.2f}); Pyomo build {statistics.median(builds):.2f} s; HiGHS incl. model"
        f" hand-over {statistics.median(solver):.2f} s; placement from {milp.report['placement_from']}.",
        "",
    ]
    if problem.scenarios:
        lines += [
            f"Exact: status **{exact.status.value}**, objective {exact.objective:.6g} ms, proven bound"
            f" {exact.bound:.6g} ms, gap **{100 * exact.gap:.4f}%**, time {exact.runtime_s:.1f} s;"
            f" {exact.report.get('cut_rounds') or 0} rounds, {exact.report.get('cuts') or 0} cuts;"
            f" placement from {exact.report['placement_from']}.",
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--skip-full", action="store_true", help="skip the plain-model probe")
    parser.add_argument("--output", type=Path, default=RESULT)
    args = parser.parse_args(argv)
    lines = [
        "# Slow loop: residency MILP and heuristics",
        "",
        "Objective: window objective in ms (formulations/residency.md); gap = (objective - bound) /"
        " (objective - constant), the constant being every token's least NoP, against the best proven"
        " lower bound. `.venv/bin/python benchmarks/bench_residency.py`.",
        "",
    ]
    for name, path, limit, gap, overrides in CASES:
        lines += bench_case(name, path, limit, gap, overrides, args.runs)
        print("\n".join(lines), file=sys.stderr)
    if not args.skip_full:
        lines += bench_full_probe(CASES[0][2])
    lines += [describe(), ""]
    text = "\n".join(lines)
    print(text)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
