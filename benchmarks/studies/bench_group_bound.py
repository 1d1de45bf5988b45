"""Scenario-group bounds against the Lagrangian over layers, group by group (formulations/residency.md,
"Scenario-group bound").

For one window (built as `comoe-opt solve INSTANCE --window W` builds it): the class LP's prices,
the Lagrangian's layer values at them (every layer's class MILP, on `--lagrangian-seconds`; a layer
stopped short gives its dual bound), `milp`'s placement
at `--milp-seconds` and each layer's priced value there. Then, on the `--layers` layers with the
largest share of the gap, for each group size and group solver, the first `--groups` groups of a
seeded partition, each with `--group-seconds`: its proven bound, whether it closed, its best
placement's value. A partition lifts a layer only when its groups' bounds average above the
layer's class value (each group's share of the layer is |G|/S), so that average is the column to
read. Bound values do not depend on the machine's speed when the groups close; times do. First, for
the same layers, the class model's layer value with the co-location rows (colocation.py) on the
`--colocation` burstiest experts, solved to optimality.

    .venv/bin/python benchmarks/studies/bench_group_bound.py --window 0 --layers 2 --sizes 32 8 1
    .venv/bin/python benchmarks/studies/bench_group_bound.py --instance instances/paper-baseline.toml \
        --scenarios 32 --window 0 --layers 2
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common and studies

import argparse
import os
import time

import numpy as np
from _common import GPTOSS, window_problem

from comoe_opt.deadline import Deadline
from comoe_opt.highs import mip_work
from comoe_opt.residency.bounds.decompose import (
    ClassModel,
    Prices,
    class_lp_certificate,
    device_classes,
    lagrangian_value,
)
from comoe_opt.residency.bounds.group_bound import (
    group_value,
    layer_problem,
    page_prices,
    reduced_layer_values,
    scenario_groups,
)
from comoe_opt.residency.objective import score
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.search.anneal import anneal
from comoe_opt.residency.solve import solve
from studies.colocation import add_colocation


def group_ceiling(problem, prices: Prices, placement, layer: int, size: int, proposals: int = 4000) -> float:
    """Σ_G (|G|/S) g_lG at each group's placement annealed from `placement`'s layer (its pages per
    chiplet kept): above each group's optimum, so a ceiling of what exact group solves of that
    partition could prove (formulations/residency.md, "Scenario-group bound")."""
    classes = device_classes(problem)
    resident = placement.resident[layer]
    total = float((page_prices(problem, classes, prices, layer) * resident).sum())
    for group in scenario_groups(problem.scenarios, size, 0):
        sub = layer_problem(problem, layer, group)
        found = anneal(sub, Placement(resident[None]), proposals=proposals, seed=1)
        total += len(group) / problem.scenarios * (score(sub, found).total - sub.constant_ms)
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--instance", type=Path, default=GPTOSS)
    ap.add_argument("--window", type=int, default=0)
    ap.add_argument("--scenarios", type=int, default=None)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--sizes", type=int, nargs="*", default=[32, 8, 1])
    ap.add_argument("--solvers", nargs="+", default=["cuts", "cpsat"])
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--group-seconds", type=float, default=10.0)
    ap.add_argument("--milp-seconds", type=float, default=10.0)
    ap.add_argument("--lagrangian-seconds", type=float, default=120.0)
    ap.add_argument("--anneal-sizes", type=int, nargs="*", default=[],
                    help="group sizes annealed from the placement's layer (a ceiling)")  # fmt: skip
    ap.add_argument("--colocation", type=int, nargs="*", default=[8, 16],
                    help="bursty experts of the co-location rows (colocation.py)")  # fmt: skip
    args = ap.parse_args(argv)
    overrides = {} if args.scenarios is None else {"policy.balance_scenarios": args.scenarios}
    problem = window_problem(args.instance, args.window, overrides)
    cert = class_lp_certificate(problem)
    prices = Prices.of_duals(cert.coupling_duals)
    layers = lagrangian_value(problem, prices, deadline=Deadline(args.lagrangian_seconds))
    placement = solve(problem, "milp", time_limit_s=args.milp_seconds, mip_gap=1e-2).solution
    reduced = reduced_layer_values(problem, prices, placement)
    gaps = reduced - layers.layer_bounds
    closed = bool(layers.closed.all())
    print(f"# {args.instance.name} window {args.window}: class LP {cert.bound:.4f}, Lagrangian "
          f"{layers.bound:.4f} (every layer closed: {closed}); load {os.getloadavg()}")  # fmt: skip
    print("| layer | size | solver | groups | closed | mean proven bound | class value | mean best placement "
          "| placement's layer value | s per group |")  # fmt: skip
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    classes = device_classes(problem)
    worst = [int(layer) for layer in np.argsort(-gaps)[: args.layers]]
    for layer in worst:
        for experts in args.colocation:
            model = ClassModel(problem, classes, [layer], prices)
            cuts, began = add_colocation(model, layer, experts), time.perf_counter()
            outcome = model.lp.solve(mip_gap=0.0, options=mip_work(100_000))
            seconds = time.perf_counter() - began
            print(f"layer {layer}: class value {layers.layer_bounds[layer]:.4f}, with co-location rows "
                  f"on the {experts} burstiest experts ({cuts} pair cuts) {outcome.bound:.4f} "
                  f"({outcome.status.value}, {seconds:.1f} s)", flush=True)  # fmt: skip
    for layer in worst:
        for size in args.anneal_sizes:
            ceiling = group_ceiling(problem, prices, placement, layer, size)
            print(f"layer {layer}: groups of {size} annealed from the placement sum to {ceiling:.4f} "
                  f"(class value {layers.layer_bounds[layer]:.4f}, placement {reduced[layer]:.4f})",
                  flush=True)  # fmt: skip
    for layer in worst:
        for size in args.sizes:
            for solver in args.solvers:
                found, began = [], time.perf_counter()
                for group in scenario_groups(problem.scenarios, size, 0)[: args.groups]:
                    found.append(group_value(problem, classes, prices, int(layer), group, args.group_seconds,
                                             solver))  # fmt: skip
                per = (time.perf_counter() - began) / len(found)
                proven, placed = np.mean([g.bound for g in found]), np.mean([g.witness_value for g in found])
                print(f"| {layer} | {size} | {solver} | {len(found)} | {sum(g.closed for g in found)} "
                      f"| {proven:.4f} | {layers.layer_bounds[layer]:.4f} | {placed:.4f} "
                      f"| {reduced[layer]:.4f} | {per:.1f} |", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
