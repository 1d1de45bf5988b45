"""`exact` (or `milp`) layer by layer against the same method on the whole window, where the
per-layer slots separate the layers (residency/exact/by_layer.py): objective, bound, gap and
seconds of each.

    .venv/bin/python benchmarks/studies/by_layer.py [--method exact|milp] [--cases gptoss-0,gptoss-13]
        [--instances FILE,...] [--limit SECONDS | --limit work] [--mip-gap 0.001] [--output FILE]

`--limit work` (the default) solves on work limits, as evaluations do: the same plans and bounds on
any machine; a number is a wall-clock limit (a study of what each reaches in that time). Cases are
bench_bounds.py's (a window of a trace with its overrides); instances are solved on window 0.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common and studies

import argparse
import math
import time

from _common import RESULTS, describe

from comoe_opt.deadline import Deadline
from comoe_opt.residency.exact.by_layer import applies
from comoe_opt.residency.exact.pipeline import solve_milp
from comoe_opt.residency.layer_slots import laid_out
from comoe_opt.residency.problem import ResidencyProblem
from comoe_opt.residency.report import ResidencyResult
from comoe_opt.residency.solve import solve
from comoe_opt.results import relative_gap
from studies.bench_bounds import CASES, window_problem

OUT = RESULTS / "by-layer.md"


def whole_window(problem: ResidencyProblem, method: str, limit: float, gap: float) -> ResidencyResult:
    """`method` as it solved every window before: one pipeline for all layers, then the layout."""
    exact = method == "exact"
    return laid_out(problem, solve_milp(problem, deadline=Deadline(limit), mip_gap=gap, exact=exact))


def timed(run) -> tuple[ResidencyResult, float]:
    began = time.perf_counter()
    result = run()
    return result, time.perf_counter() - began


def cell(result: ResidencyResult, seconds: float) -> str:
    gap = 100 * relative_gap(result.objective, result.bound, result.constant)
    return f"{result.objective:.5f} / {result.bound:.5f} / {gap:.2f}% / {seconds:.1f} s"


def row(name: str, problem: ResidencyProblem, method: str, limit: float, gap: float) -> str:
    whole, whole_s = timed(lambda: whole_window(problem, method, limit, gap))
    layered, layered_s = timed(lambda: solve(problem, method, time_limit_s=limit, mip_gap=gap))
    p = problem
    shape = f"{p.layers} x {p.experts} x {p.chiplets}, {p.scenarios} scenarios, {p.layer_slots} slots"
    line = f"| {name} | {shape} | {cell(whole, whole_s)} | {cell(layered, layered_s)} |"
    print(line, flush=True)
    return line


def problems(cases: list[str], instances: list[str]):
    for case in cases:
        path, window, overrides = CASES[case]
        yield case, window_problem(path, window, overrides, 10.0, 1e-2)[0]
    for path in instances:
        yield Path(path).stem, window_problem(Path(path), 0, {}, 10.0, 1e-2)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", choices=["exact", "milp"], default="exact")
    parser.add_argument("--cases", default="gptoss-0,gptoss-13")
    parser.add_argument("--instances", default="")
    parser.add_argument("--limit", default="work")
    parser.add_argument("--mip-gap", type=float, default=1e-3, help="target gap (policy.mip_gap's default)")
    parser.add_argument("--output", type=Path, default=OUT)
    args = parser.parse_args()
    limit = math.inf if args.limit == "work" else float(args.limit)
    cases = [c for c in args.cases.split(",") if c]
    instances = [i for i in args.instances.split(",") if i]
    budget = "work limits" if args.limit == "work" else f"{limit:g} s"
    lines = [
        f"# `{args.method}` layer by layer against the whole window ({budget}, target gap {args.mip_gap:g})",
        "",
        f"`{' '.join(['.venv/bin/python', *sys.argv])}` ({describe()})",
        "",
        "objective / bound / gap on what a placement changes / seconds",
        "",
        "| case | layers x experts x chiplets | whole window | layer by layer |",
        "|---|---|---|---|",
    ]
    for name, problem in problems(cases, instances):
        if not applies(problem):
            print(f"{name}: the slots do not separate its layers, skipped", flush=True)
            continue
        lines.append(row(name, problem, args.method, limit, args.mip_gap))
    args.output.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
