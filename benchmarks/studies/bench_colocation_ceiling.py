"""How much a co-location relaxation could prove at most: the pair view of a placement
(formulations/residency.md, "Scenario-group bound", co-location).

A relaxation of the window objective whose makespan cuts are each at most one cut ratio of the
exact condition (cut_condition.py: z*_s = max over chiplet sets D of the work confined to D over D's
speed) cannot prove more than the objective with each scenario's makespan replaced by the largest
of those ratios at any one placement: that placement is feasible for the relaxation. For the class
model plus pair co-location (items m_ij = chiplets hosting both i and j, with the pair cut
z_s ≥ (w_is + w_js) / V(R_i ∪ R_j)), the ratios are those of the sets D = all chiplets (floor),
each class union (class-union cuts), each expert's replica set (count cuts), the union of the q
busiest experts' sets for every q (union and rigid cuts are below these) and each pair's union
(the pair cut). Evaluated at `milp`'s placement, their mean over scenarios replaces the true
makespan; the result is a **ceiling** of that relaxation's bound, and `(objective − ceiling) /
(objective − constant)` the least gap it could leave for that placement. Each family's column
shows what it sees on its own beside the floor, the class unions and the experts' own sets (the
busiest unions stand in, from above, for the union and rigid cuts, which are weaker).

    .venv/bin/python benchmarks/studies/bench_colocation_ceiling.py --windows 0 16
    .venv/bin/python benchmarks/studies/bench_colocation_ceiling.py --instance instances/paper-baseline.toml \
        --scenarios 32 --windows 0
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common and studies

import argparse
import os

import numpy as np
from _common import GPTOSS, window_problem

from comoe_opt.best_split.cut_condition import layer_makespans, related_speeds
from comoe_opt.residency.bounds.decompose import device_classes
from comoe_opt.residency.objective import score
from comoe_opt.residency.solve import solve

COLUMNS = ("floor", "class unions, own sets", "+ pairs", "+ busiest unions", "all", "exact")


def views(problem, resident: np.ndarray) -> dict[str, float]:
    """W Σ_l mean_s of the makespan seen by each family of cuts at the replica map [L, E, C]."""
    speeds = related_speeds(problem.scenario_work_ms)
    of = device_classes(problem).of
    W = problem.batches
    out = dict.fromkeys(COLUMNS, 0.0)
    for layer in range(problem.layers):
        work = problem.scenario_work_ms[:, layer, :, 0]  # [S, E] at speed 1
        sets = resident[layer] | ~resident[layer].any(axis=1)[:, None]  # no replica: anywhere
        floor = work.sum(axis=1) / speeds.sum()
        basic = floor.copy()
        for k in np.unique(of):  # class unions (with two classes: each class alone)
            inside = ~sets[:, of != k].any(axis=1)
            basic = np.maximum(basic, work[:, inside].sum(axis=1) / speeds[of == k].sum())
        basic = np.maximum(basic, (work / (sets @ speeds)).max(axis=1))  # each expert's own set
        prefix = np.zeros_like(floor)
        for s in range(work.shape[0]):  # the q busiest experts' union, every q
            union = np.zeros(sets.shape[1], dtype=bool)
            for e in np.argsort(-work[s]):
                union |= sets[e]
                inside = ~sets[:, ~union].any(axis=1)
                prefix[s] = max(prefix[s], work[s, inside].sum() / speeds[union].sum())
        pair_cap = (sets[:, None, :] | sets[None, :, :]) @ speeds  # [E, E]
        pair = (work[:, :, None] + work[:, None, :]) / pair_cap[None]
        pair[:, np.arange(pair.shape[1]), np.arange(pair.shape[1])] = 0.0  # an expert with itself
        pair = pair.max(axis=(1, 2))
        seen = {
            "floor": floor,
            "class unions, own sets": basic,
            "+ pairs": np.maximum(basic, pair),
            "+ busiest unions": np.maximum(basic, prefix),
            "all": np.maximum.reduce([basic, pair, prefix]),
            "exact": layer_makespans(problem.scenario_work_ms[:, layer], resident[layer]),
        }
        for name, z in seen.items():
            out[name] += W * float(z.mean())
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--instance", type=Path, default=GPTOSS)
    ap.add_argument("--windows", type=int, nargs="+", default=[0])
    ap.add_argument("--scenarios", type=int, default=None)
    ap.add_argument("--milp-seconds", type=float, default=10.0)
    args = ap.parse_args(argv)
    overrides = {} if args.scenarios is None else {"policy.balance_scenarios": args.scenarios}
    print(f"load {os.getloadavg()}")
    header = " | ".join(COLUMNS)
    print(f"| window | objective | {header} | ceiling (all) | least gap at this placement |")
    print("|---:|---:|" + "---:|" * (len(COLUMNS) + 2))
    for window in args.windows:
        problem = window_problem(args.instance, window, overrides)
        placement = solve(problem, "milp", time_limit_s=args.milp_seconds, mip_gap=1e-2).solution
        objective = score(problem, placement).total
        seen = views(problem, placement.resident)
        ceiling = objective - (seen["exact"] - seen["all"])
        gap = (objective - ceiling) / (objective - problem.constant_ms)
        cells = " | ".join(f"{seen[name]:.4f}" for name in COLUMNS)
        print(f"| {window} | {objective:.4f} | {cells} | {ceiling:.4f} | {gap:.2%} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
