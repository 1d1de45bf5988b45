"""Dantzig–Wolfe over chiplet contents against the class model, layer by layer
(formulations/residency.md, "Dantzig–Wolfe over chiplet contents"; device_columns.py).

For one window (built as `comoe-opt solve INSTANCE --window W` builds it): the class LP's prices,
`milp`'s placement at `--milp-seconds` and each layer's priced value there; on the `--layers`
layers with the largest share of the gap, each layer's class MILP at the prices (its value and its
per-scenario makespans z*), then:

* `root`: the level bound's first box (floors to the incumbent's room), column generation to
  convergence or `--iterations` rounds (its Lagrangian bound, valid when stopped);
* `boxes`: the level bound after `--boxes` content bounds;
* `at z*`: (W/S) Σ z* + the restricted master's value at the cap z* — an upper side of the
  content LP there, so **no** level bound (however many boxes) can exceed it: if it is at most
  the class value, the family cannot lift the layer without branching on the columns;
* `at placement`: the same at the placement's own makespans, against the placement's value
  (what the content LP loses to integrality there).

    .venv/bin/python benchmarks/studies/bench_device_columns.py --window 0 --layers 3
    .venv/bin/python benchmarks/studies/bench_device_columns.py --instance instances/paper-baseline.toml \
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

from comoe_opt.residency.bounds.decompose import ClassModel, Prices, class_lp_certificate, device_classes
from comoe_opt.residency.bounds.group_bound import layer_problem, reduced_layer_values, scenario_groups
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.solve import solve
from studies.device_columns import (
    content_bound,
    layer_data,
    level_bound,
    placement_columns,
)


def class_layer(
    problem, classes, prices: Prices, layer: int, seconds: float
) -> tuple[float, np.ndarray, bool]:
    """The layer's class MILP at the prices: its proven bound, its solution's makespans [S], closed."""
    model = ClassModel(problem, classes, [layer], prices)
    outcome = model.lp.solve(time_limit_s=seconds, mip_gap=0.0)
    z = model.lp.values()[model.cols[layer].z]
    return float(outcome.bound), z, outcome.status.value == "optimal"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--instance", type=Path, default=GPTOSS)
    ap.add_argument("--window", type=int, default=0)
    ap.add_argument("--scenarios", type=int, default=None)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--milp-seconds", type=float, default=10.0)
    ap.add_argument("--class-seconds", type=float, default=30.0)
    ap.add_argument("--iterations", type=int, default=300, help="column generation rounds per box")
    ap.add_argument("--boxes", type=int, default=8, help="content bounds of the level search per layer")
    ap.add_argument("--box-seconds", type=float, default=120.0, help="time of the level search per layer")
    ap.add_argument("--group-sizes", type=int, nargs="*", default=[], help="level search per scenario group")
    ap.add_argument("--groups", type=int, default=2, help="groups of a seeded partition per size")
    args = ap.parse_args(argv)
    overrides = {} if args.scenarios is None else {"policy.balance_scenarios": args.scenarios}
    problem = window_problem(args.instance, args.window, overrides)
    classes = device_classes(problem)
    cert = class_lp_certificate(problem)
    prices = Prices.of_duals(cert.coupling_duals)
    placement = solve(problem, "milp", time_limit_s=args.milp_seconds, mip_gap=1e-2).solution
    reduced = reduced_layer_values(problem, prices, placement)
    W, S = problem.batches, problem.scenarios
    print(f"# {args.instance.name} window {args.window}: class LP {cert.bound:.4f}; load {os.getloadavg()}")
    print("| layer | class value | root box | level bound (boxes, s) | at z* | at placement | placement |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    candidates = np.argsort(-reduced)[: args.layers * 3]  # the layers of largest priced value
    rows = []
    for layer in candidates:  # the class values first, then the layers with the largest gap
        value, z_star, closed = class_layer(problem, classes, prices, int(layer), args.class_seconds)
        rows.append((reduced[layer] - value, int(layer), value, z_star, closed))
    rows.sort(reverse=True)
    for _, layer, value, z_star, closed in rows[: args.layers]:
        d = layer_data(problem, classes, prices, layer)
        began = time.perf_counter()
        root = level_bound(
            problem, prices, layer, incumbent=reduced[layer], boxes=1, iterations=args.iterations
        )
        root_s = time.perf_counter() - began
        began = time.perf_counter()
        stop = began + args.box_seconds
        searched = level_bound(
            problem,
            prices,
            layer,
            incumbent=reduced[layer],
            boxes=args.boxes,
            iterations=args.iterations,
            stop_at=stop,
        )
        search_s = time.perf_counter() - began
        at_star = content_bound(d, z_star, iterations=args.iterations)
        z_placed, columns = placement_columns(problem, classes, layer, placement.resident[layer])
        at_placed = content_bound(d, z_placed * (1 + 1e-9), iterations=args.iterations, start=columns)
        own = reduced[layer] - W / S * z_placed.sum()
        ended = "converged" if at_placed.converged else "open"
        print(f"layer {layer} at the placement's makespans, its chiplets as starting columns: content LP "
              f"{at_placed.bound:.4f} .. {at_placed.master:.4f} ({ended}, {at_placed.iterations} rounds), "
              f"the placement's content {own:.4f}", flush=True)  # fmt: skip
        star = W / S * z_star.sum() + at_star.master
        placed = W / S * z_placed.sum() + at_placed.master
        state = "converged" if at_star.converged else f"{at_star.iterations} rounds"
        print(
            f"| {layer} | {value:.4f}{'' if closed else ' (open)'} | {root.root:.4f} ({root_s:.0f} s) "
            f"| {searched.bound:.4f} ({searched.boxes}, {search_s:.0f} s) | {star:.4f} ({state}) "
            f"| {placed:.4f} | {reduced[layer]:.4f} |",
            flush=True,
        )
        for size in args.group_sizes:
            group_rows(problem, prices, placement, layer, value, size, args)
    return 0


def group_rows(problem, prices: Prices, placement, layer: int, value: float, size: int, args) -> None:
    """The level search as a scenario group's solver (group_bound.py): the first `--groups` groups
    of a seeded partition, each one layer on its scenarios, boxed by the placement's group value."""
    found, placed, began = [], [], time.perf_counter()
    for group in scenario_groups(problem.scenarios, size, 0)[: args.groups]:
        sub = layer_problem(problem, layer, group)
        own = float(reduced_layer_values(sub, prices, Placement(placement.resident[[layer]]))[0])
        stop = time.perf_counter() + args.box_seconds
        result = level_bound(
            sub, prices, 0, incumbent=own, boxes=args.boxes, iterations=args.iterations, stop_at=stop
        )
        found.append(result)
        placed.append(own)
    per = (time.perf_counter() - began) / len(found)
    closed = sum(r.closed for r in found)
    mean = np.mean([r.bound for r in found])
    print(
        f"layer {layer}, groups of {size}: mean proven {mean:.4f} (closed {closed} of {len(found)}, "
        f"boxes {[r.boxes for r in found]}), class value {value:.4f}, mean placement {np.mean(placed):.4f}, "
        f"{per:.0f} s per group",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
