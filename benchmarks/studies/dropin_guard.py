"""The drop-in's guard against EPLB (balancers/dropin/guard.py) on a suite's drop-in replay: P95
of the drop-in (even, lp) against EPLB's under the same dispatch, and its copies against EPLB's,
without the guard and with EPLB's lead on the newest steps required to exceed z standard errors
of its noise, z in 0, 1, 2 (`SearchConfig.guard_z`; 0 is the default, chosen here).

Plans are work-limited: the same numbers on any machine.

    .venv/bin/python benchmarks/studies/dropin_guard.py [--suite regimes|scale] [--only A,C] [--z 0,1,2]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common

import argparse
from dataclasses import replace

import numpy as np
from _common import RESULTS, SUITES, describe, dropin_runs

from comoe_opt.balancers.dropin.config import DEFAULT
from comoe_opt.instance import load_instance
from comoe_opt.replay import DropIn, EplbLayout, Planner, Rolling
from comoe_opt.trace import instance_batches, load_trace
from comoe_opt.trace.batching import step_counts

DISPATCHES = ("even", "lp")


def variants(zs: list[float]) -> dict[str, object]:
    """Each variant's config: no guard, then the guard at each z."""
    out: dict[str, object] = {"no guard": replace(DEFAULT, eplb_guard=False)}
    out.update({f"z={z:g}": replace(DEFAULT, guard_z=z) for z in zs})
    return out


def row(key: str, path: Path, steps_run: int, zs: list[float]) -> str:
    instance, trace = load_trace(load_instance(path))
    steps = step_counts(instance_batches(instance, trace))[:steps_run]
    layout = EplbLayout.of(instance, steps, "the guard study")
    planners: dict[str, Planner] = {"EPLB": Rolling(instance, "eplb")}
    for name, config in variants(zs).items():
        for d in DISPATCHES:
            planners[f"{d} {name}"] = DropIn(layout, d, options=(("config", config),), label=f"{d} {name}")
    runs = dropin_runs(instance, steps, planners)
    eplb = {d: float(np.percentile(runs["EPLB"].served(steps, d).imbalance, 95)) for d in DISPATCHES}
    copies = runs["EPLB"].copies_per_replan() or 1.0
    cells = []
    for name in variants(zs):
        for d in DISPATCHES:
            run = runs[f"{d} {name}"]
            p95 = float(np.percentile(run.served(steps, d).imbalance, 95))
            cells.append(f"{100 * (p95 / eplb[d] - 1):+.1f}% ({run.copies_per_replan() / copies:.2f})")
    return f"| {key} | " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=sorted(SUITES), default="regimes")
    parser.add_argument("--only", help="comma-separated regime keys (default: all)")
    parser.add_argument("--z", default="0,1,2", help="the z values (comma-separated)")
    parser.add_argument("--output", type=Path, default=RESULTS / "dropin-guard.md")
    args = parser.parse_args()
    zs = [float(z) for z in args.z.split(",")]
    names = list(variants(zs))
    lines = [
        f"# The drop-in's guard against EPLB: {args.suite} suite",
        "",
        describe(),
        "",
        "P95 of the drop-in against EPLB's under the same dispatch (EPLB + lp for lp), its copies per"
        " re-plan against EPLB's in brackets.",
        "",
        "| regime | " + " | ".join(f"{d}, {n}" for n in names for d in DISPATCHES) + " |",
        "|---|" + "---:|" * (len(names) * len(DISPATCHES)),
    ]
    for regime in SUITES[args.suite]:
        if args.only and regime.key not in args.only.split(","):
            continue
        lines.append(row(regime.key, regime.path, regime.steps, zs))
        print(lines[-1], flush=True)
    args.output.write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
