"""Is the hard windows' gap the incumbent's? A large-neighbourhood search on `exact`'s 60-s
incumbent: two layers at a time re-solved by `exact` with every other layer fixed (each chiplet's
capacity, the budget and the quotas less the fixed layers' pages: `fixed_others`), the result kept
where the whole window's objective falls. Pairs (0, 1), (2, 3), ... then (1, 2), (3, 4), ...

    .venv/bin/python benchmarks/studies/lns_gap.py [--case gptoss-0] [--exact-limit 60]
        [--sub-limit 20] [--warm] [--output FILE]

`--warm` starts each sub-solve's searches from the incumbent's two layers: they become the
sub-problem's previous plan, which the searches start from (only on a first window whose copies
cost nothing, where that leaves the objective as it is).

Times are wall-clock limits (a study of what the solvers reach, not a reproducible plan): the
machine it ran on is in the results file.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common and studies

import argparse
import dataclasses

import numpy as np
from _common import RESULTS, describe

from comoe_opt.residency.objective import score
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.problem import ResidencyProblem, Tenant, reduced_problem
from comoe_opt.residency.solve import solve
from studies.bench_bounds import CASES, window_problem

OUT = RESULTS / "lns-gap.md"


def fixed_others(problem: ResidencyProblem, resident: np.ndarray, layers: np.ndarray) -> ResidencyProblem:
    """`layers`' problem with every other layer held as `resident` [L, E, C] holds it: capacity,
    budget and quotas less the other layers' pages (their terms are constant, so a lower objective
    of the sub-problem is a lower objective of the window)."""
    others = np.setdiff1d(np.arange(problem.layers), layers)
    held = resident[others]
    sub = reduced_problem(problem, layers, np.arange(problem.scenarios))
    return dataclasses.replace(
        sub,
        capacity_pages=(problem.capacity_pages - held.sum(axis=(0, 1))).astype(np.int64),
        budget_pages=int(problem.budget_pages - held.sum()),
        tenants=tuple(
            Tenant(t.name, t.owns[layers], int(t.max_pages - held[t.owns[others]].sum()))
            for t in problem.tenants
        ),
    )


def objective(problem: ResidencyProblem, resident: np.ndarray) -> float:
    return score(problem, Placement(resident)).total


def lns(problem: ResidencyProblem, resident: np.ndarray, sub_limit: float, warm: bool = False) -> list[dict]:
    """Each pair's sub-solve and the window's objective after it (kept where it falls)."""
    current, rows = objective(problem, resident), []
    layers = problem.layers
    pairs = [np.arange(i, min(i + 2, layers)) for i in range(0, layers, 2)]
    pairs += [np.arange(i, i + 2) for i in range(1, layers - 1, 2)]
    for pair in pairs:
        sub = fixed_others(problem, resident, pair)
        if warm:
            sub = dataclasses.replace(sub, previous=Placement(resident[pair].copy()))
        result = solve(sub, "exact", time_limit_s=sub_limit, mip_gap=1e-4)
        trial = resident.copy()
        if result.solution is not None:
            trial[pair] = result.solution.resident
        value = objective(problem, trial)
        kept = value < current - 1e-9
        if kept:
            resident, current = trial, value
        rows.append({"layers": pair.tolist(), "status": str(result.status), "window": value, "kept": kept})
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="gptoss-0", choices=list(CASES))
    parser.add_argument("--exact-limit", type=float, default=60.0)
    parser.add_argument("--sub-limit", type=float, default=20.0)
    parser.add_argument("--warm", action="store_true", help="sub-solves start from the incumbent's layers")
    parser.add_argument("--output", type=Path, default=OUT)
    args = parser.parse_args()
    path, window, overrides = CASES[args.case]
    problem, _ = window_problem(path, window, overrides, 10.0, 1e-2)
    if args.warm and (problem.previous is not None or problem.copy_ms > 0):
        parser.error("--warm: the window has a previous plan or priced copies")
    start = solve(problem, "exact", time_limit_s=args.exact_limit, mip_gap=1e-2)
    assert start.solution is not None
    first = objective(problem, start.solution.resident)
    rows = lns(problem, start.solution.resident.copy(), args.sub_limit, args.warm)
    final = min([first] + [r["window"] for r in rows])
    bound = start.bound
    warm = " --warm" if args.warm else ""
    lines = [
        f"# Large-neighbourhood search on `exact`'s incumbent: {args.case}",
        "",
        f"`.venv/bin/python benchmarks/studies/lns_gap.py --case {args.case} --exact-limit"
        f" {args.exact_limit:g} --sub-limit {args.sub_limit:g}{warm}` ({describe()})",
        "",
        f"`exact` in {args.exact_limit:g} s: objective {first:.5f} ms, bound {bound:.5f}, gap"
        f" {100 * (first - bound) / first:.2f}% ((objective - bound) / objective). After {len(rows)}"
        " two-layer re-solves of"
        f" {args.sub_limit:g} s each (the other {problem.layers - 2} layers fixed): {final:.5f}, gap to"
        f" the same bound {100 * (final - bound) / final:.2f}%; {sum(r['kept'] for r in rows)} kept.",
        "",
        "| layers | sub-solve | window objective after | kept |",
        "|---|---|---:|---|",
    ]
    lines += [
        f"| {r['layers']} | {r['status']} | {r['window']:.5f} | {'yes' if r['kept'] else ''} |" for r in rows
    ]
    args.output.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
