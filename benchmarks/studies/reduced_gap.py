"""Which side of the hard windows' gap is loose, the placement or the bound: reduced instances of
GPT-OSS window 0 and the paper baseline (32 scenarios), the first K layers on the first S balance
scenarios (`residency.problem.reduced_problem`: capacity, budget and quotas cut to the layers'
share), each solved by `exact` in `--short` seconds and again in `--long` seconds. Where the long
run proves its optimum, the short run's incumbent excess and bound deficit say which side held
the short run's gap; the table shows how the three move as the instance grows towards the full one.

    .venv/bin/python benchmarks/studies/reduced_gap.py [--cases gptoss-0,paper] [--layers 1,2]
        [--scenarios 1,2,4,8] [--short 60] [--long 600] [--output FILE]

Times are wall-clock limits (this is a study of what the solvers reach, not a reproducible plan):
the machine they ran on is in the results file.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common and studies

import argparse
import json

import numpy as np
from _common import RESULTS, describe

from comoe_opt.residency.bounds.nop_floor import nop_excess_bound
from comoe_opt.residency.objective import score
from comoe_opt.residency.problem import ResidencyProblem, reduced_problem
from comoe_opt.residency.solve import solve
from comoe_opt.results import SolveResult
from studies.bench_bounds import CASES, window_problem

OUT = RESULTS / "reduced-gap.md"


def run(problem: ResidencyProblem, layers: int, scenarios: int, short: float, long: float) -> dict:
    sub = reduced_problem(problem, np.arange(layers), np.arange(scenarios))
    quick = solve(sub, "exact", time_limit_s=short, mip_gap=1e-4)
    slow = solve(sub, "exact", time_limit_s=long, mip_gap=1e-4)
    row = {"layers": layers, "scenarios": scenarios, "short": _result(quick), "long": _result(slow)}
    # the NoP every placement pays above the constant (the bound's term) against the incumbent's
    row["nop_bound"] = nop_excess_bound(sub)
    row["nop_incumbent"] = score(sub, quick.solution).nop_ms - sub.constant_ms if quick.solution else None
    if slow.status == "optimal":  # the proven optimum splits the short run's gap in two
        span = max(quick.objective - sub.constant_ms, 1e-12)
        row["incumbent_excess"] = (quick.objective - slow.objective) / span
        row["bound_deficit"] = (slow.objective - quick.bound) / span
    return row


def _result(r: SolveResult) -> dict:
    return {
        "status": str(r.status),
        "objective": r.objective,
        "bound": r.bound,
        "gap": r.gap,
        "s": r.runtime_s,
    }


def _nop(row: dict) -> str:
    if row.get("nop_incumbent") is None:
        return "–"
    return f"{row['nop_bound']:.5f} / {row['nop_incumbent']:.5f}"


def markdown(case: str, rows: list[dict]) -> list[str]:
    lines = [
        f"## {case}",
        "",
        "| layers | scenarios | short: incumbent | short: bound | short gap | long: status | long: incumbent"
        " | long: bound | incumbent excess | bound deficit | NoP above the constant: bound / incumbent |",
        "|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        q, s = r["short"], r["long"]
        split = (
            f"{100 * r['incumbent_excess']:.2f}% | {100 * r['bound_deficit']:.2f}%"
            if "incumbent_excess" in r
            else "– | –"
        )
        lines.append(
            f"| {r['layers']} | {r['scenarios']} | {q['objective']:.6g} | {q['bound']:.6g}"
            f" | {100 * q['gap']:.2f}% | {s['status']} | {s['objective']:.6g} | {s['bound']:.6g} | {split}"
            f" | {_nop(r)} |"
        )
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="gptoss-0,paper")
    parser.add_argument("--layers", default="1,2")
    parser.add_argument("--scenarios", default="1,2,4,8")
    parser.add_argument("--short", type=float, default=60.0)
    parser.add_argument("--long", type=float, default=600.0)
    parser.add_argument("--output", type=Path, default=OUT, help=f"results file (default {OUT.name})")
    args = parser.parse_args()
    lines = [
        "# The hard windows' gap on reduced instances",
        "",
        f"{describe()} The first K layers on the first S scenarios,"
        f" `exact` in {args.short:g} s (short) and {args.long:g} s (long); where the long run proves its"
        " optimum, the short run's gap splits into the incumbent's excess over it and the optimum's excess"
        " over the short bound (both as shares of the short incumbent, without the constant).",
        "",
    ]
    for case in args.cases.split(","):
        path, window, overrides = CASES[case]
        problem, _ = window_problem(path, window, overrides, 10.0, 1e-2)
        rows = []
        for layers in (int(k) for k in args.layers.split(",")):
            for scenarios in (int(s) for s in args.scenarios.split(",")):
                rows.append(run(problem, layers, scenarios, args.short, args.long))
                print(json.dumps(rows[-1]), flush=True)
        lines += markdown(case, rows)
        (RESULTS / "reduced-gap").mkdir(exist_ok=True)
        (RESULTS / "reduced-gap" / f"{args.output.stem}-{case}.json").write_text(
            json.dumps(rows, indent=1) + "\n"
        )
    args.output.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
