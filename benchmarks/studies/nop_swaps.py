"""The incumbent side of a hard window's gap: how much of the plan's NoP above the least
(residency/bounds/nop_floor.py) a near/far replica swap recovers. Per layer, the best swap of a
replica on a nearer chiplet with one on a farther chiplet that lowers the layer's objective
(`W · (scenario makespan + NoP)`, residency/objective.py: layer_terms) is applied until none does.
A probe for a move the slow loop's searches lack, not a method: every swap is scored in full.

`milp` plans the window on work limits (the same plan on any machine).

    .venv/bin/python benchmarks/studies/nop_swaps.py [--cases gptoss-0]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common and studies

import argparse

import numpy as np
from _common import RESULTS, describe

from comoe_opt.residency.bounds.nop_floor import nop_excess_bound
from comoe_opt.residency.objective import layer_terms, score
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.problem import ResidencyProblem
from studies.bench_bounds import CASES, window_problem

OUT = RESULTS / "nop-swaps.md"


def layer_value(problem: ResidencyProblem, held: np.ndarray, layer: int) -> float:
    makespan, nop, _ = layer_terms(problem, held, layer)
    return problem.batches * (makespan + nop)


def best_swap(problem: ResidencyProblem, held: np.ndarray, layer: int) -> tuple[float, np.ndarray | None]:
    """(gain, the layer's map after it) of the best near/far swap; (0, None) when none gains."""
    nop = problem.nop_ms_per_token
    now = layer_value(problem, held, layer)
    best: tuple[float, np.ndarray | None] = (0.0, None)
    experts, chiplets = np.nonzero(held)
    for e, near in zip(experts, chiplets, strict=True):
        for f, far in zip(experts, chiplets, strict=True):
            if e == f or nop[near] >= nop[far] or held[e, far] or held[f, near]:
                continue
            trial = held.copy()
            trial[e, near], trial[f, far], trial[e, far], trial[f, near] = False, False, True, True
            gain = now - layer_value(problem, trial, layer)
            if gain > 1e-9 and gain > best[0]:
                best = (gain, trial)
    return best


def run(case: str) -> str:
    path, window, overrides = CASES[case]
    problem, result = window_problem(path, window, overrides, None, 1e-2)
    resident = result.solution.resident.copy()
    before = score(problem, Placement(resident.copy()))
    swaps = 0
    for layer in range(problem.layers):
        while True:
            _, after = best_swap(problem, resident[layer], layer)
            if after is None:
                break
            resident[layer] = after
            swaps += 1
    after_terms = score(problem, Placement(resident.copy()))
    constant = problem.constant_ms
    return (
        f"| {case} | {result.bound - constant:.3f} | {before.total - constant:.3f}"
        f" | {after_terms.total - constant:.3f} | {swaps} | {nop_excess_bound(problem):.3f}"
        f" | {before.nop_ms - constant:.3f} | {after_terms.nop_ms - constant:.3f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="gptoss-0")
    parser.add_argument("--output", type=Path, default=OUT)
    args = parser.parse_args()
    lines = [
        "# Near/far replica swaps on `milp`'s plan",
        "",
        f"{describe()} ms without the constant (every token's least NoP).",
        "",
        "| case | milp bound | milp plan | after the swaps | swaps | NoP above the least: bound"
        " | milp plan's | after |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        *(run(case) for case in args.cases.split(",")),
        "",
    ]
    args.output.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
