"""Balance-scenario benchmark: the cut enumeration against the share LP, and the local search.

For one planning window of each instance (balance scenarios on), times:

* the best-routing makespans of every scenario of one layer, by the cut
  enumeration (`layer_makespans`) and by one share LP per scenario (the
  fallback for many chiplets), and checks that both agree;
* the local search (`refine`) over all layers at the instance's move budget,
  and what it gains on the scenario objective.

Medians over --runs, ratios measured in the same run. Writes
`benchmarks/results/scenarios.md`.

    .venv/bin/python benchmarks/bench_scenarios.py [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
from _common import describe, script_args

from comoe_opt.best_split.cut_condition import layer_makespans, makespan_lp
from comoe_opt.instance import Instance, load_instance, with_overrides
from comoe_opt.residency.objective import score
from comoe_opt.residency.problem import ResidencyProblem, residency_problem
from comoe_opt.residency.search.refine import refine
from comoe_opt.residency.solve import solve_heuristic
from comoe_opt.stats.demand import window_demand
from comoe_opt.trace import instance_batches

ROOT = Path(__file__).resolve().parent.parent
CASES = [
    ("real-gptoss20b (32 scenarios of 128 steps)", ROOT / "instances" / "real-gptoss20b.toml", {}),
    (
        "paper-baseline (100 scenarios, 400 moves)",
        ROOT / "instances" / "paper-baseline.toml",
        {"policy.balance_scenarios": 100, "policy.search_moves": 400},
    ),
]


def planning_problem(instance: Instance) -> ResidencyProblem:
    """The problem of the runtime's fifth window: planned on the history before it."""
    policy = instance.policy
    batches = instance_batches(instance)
    stop = 4 * policy.window_batches
    start = max(0, stop - policy.history_windows * policy.window_batches)
    return residency_problem(instance, window_demand(batches.window(start, stop), policy))


def timed(fn, runs: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def bench_case(name: str, path: Path, overrides: dict, runs: int) -> list[str]:
    instance = with_overrides(load_instance(path), overrides)
    problem = planning_problem(instance)
    start = solve_heuristic(problem, "eplb" if problem.all_resident else "greedy").solution
    layer = 0
    work, resident = problem.scenario_work_ms[:, layer], start.resident[layer]
    cut_s, cut = timed(lambda: layer_makespans(work, resident), runs)
    lp_s, lp = timed(lambda: np.array([makespan_lp(w, resident) for w in work]), max(1, runs // 2))
    deviation = float(np.abs(cut - lp).max())
    search_s, found = timed(lambda: refine(problem, start), runs)
    before, after = score(problem, start).total, score(problem, found).total
    s, c = problem.scenarios, problem.chiplets
    return [
        f"| {name} | {s} x {problem.experts} x {c} | {1e3 * cut_s:.2f} | {1e3 * lp_s:.1f}"
        f" | {lp_s / cut_s:.0f}x | {deviation:.1e} | {problem.layers} x {problem.search_moves}"
        f" | {search_s:.2f} | {before:.6g} -> {after:.6g} ({100 * (before - after) / before:.1f}%) |"
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    script_args(parser, ROOT / "benchmarks" / "results" / "scenarios.md")
    args = parser.parse_args(argv)
    cases = CASES[:1] if args.smoke else CASES  # the smoke: one case, one run
    args.runs = 1 if args.smoke else args.runs
    lines = [
        "# Balance scenarios: cut enumeration, share LP, local search",
        "",
        "One planning window per instance (the runtime's fifth, planned on its history), balance scenarios"
        ' on (formulations/residency.md, "Balance scenarios"). *cuts*: best-routing makespans of every'
        " scenario of layer 0 by enumerating the 2^C - 1 chiplet sets; *LP*: the same by one share LP per"
        " scenario (the fallback above 12 chiplets); *max deviation*: largest difference between the two"
        " (ms). *search*: `refine` over all layers from the EPLB (all-resident) or greedy placement, and"
        f" the window objective before and after. Medians over {args.runs} runs"
        " (LP: half as many). `.venv/bin/python benchmarks/bench_scenarios.py`.",
        "",
        "| window | scenarios x experts x chiplets | cuts ms | LP ms | LP / cuts | max deviation"
        " | search layers x moves | search s | objective ms (gain) |",
        "|---|---|---:|---:|---:|---:|---|---:|---|",
    ]
    for name, path, overrides in cases:
        lines += bench_case(name, path, overrides, args.runs)
    lines += ["", describe(), ""]
    text = "\n".join(lines)
    print(text)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
