"""The drop-in's search by steps (balancers/dropin/step_search.py, opted in by
`SearchConfig.step_search_gpus`) against its default search (by moments for `even`, pooled cuts for
`lp`), on the drop-in replay of every instance past 12 GPUs of both suites: P95 against EPLB's
under the dispatch, copies per re-plan against EPLB's in brackets, the steps' partners
(`SearchConfig.step_partners`) at 2, 4 and 8.

Plans are work-limited: the same numbers on any machine.

    .venv/bin/python benchmarks/studies/step_search.py [--dispatch even|lp] [--only "Kimi-K2 EP64,..."]
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

VARIANTS = {
    "moments": DEFAULT,
    **{f"steps, {m} partners": replace(DEFAULT, step_search_gpus=12, step_partners=m) for m in (2, 4, 8)},
}


def row(key: str, path: Path, steps_run: int, dispatch: str, names: list[str]) -> str:
    instance, trace = load_trace(load_instance(path))
    steps = step_counts(instance_batches(instance, trace))[:steps_run]
    layout = EplbLayout.of(instance, steps, "the step search study")
    planners: dict[str, Planner] = {"EPLB": Rolling(instance, "eplb")}
    for name in names:
        config = VARIANTS[name]
        planners[name] = DropIn(layout, dispatch, options=(("config", config),), label=name)
    runs = dropin_runs(instance, steps, planners)
    eplb = float(np.percentile(runs["EPLB"].served(steps, dispatch).imbalance, 95))
    copies = runs["EPLB"].copies_per_replan() or 1.0
    cells = []
    for name in names:
        p95 = float(np.percentile(runs[name].served(steps, dispatch).imbalance, 95))
        cells.append(f"{100 * (p95 / eplb - 1):+.1f}% ({runs[name].copies_per_replan() / copies:.2f})")
    return f"| {key} | {instance.hardware.chiplets} | {eplb:.3f} | " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated instance keys (default: all past 12 GPUs)")
    parser.add_argument("--dispatch", choices=("even", "lp"), default="even")
    parser.add_argument("--variants", help=f"separated by ';', of: {'; '.join(VARIANTS)} (default: all)")
    parser.add_argument("--output", type=Path, help="default: results/scale-step-search[-lp].md")
    args = parser.parse_args()
    names = args.variants.split(";") if args.variants else list(VARIANTS)
    if unknown := [n for n in names if n not in VARIANTS]:
        parser.error(f"--variants: unknown {', '.join(unknown)}")
    suffix = "" if args.dispatch == "even" else f"-{args.dispatch}"
    args.output = args.output or RESULTS / f"scale-step-search{suffix}.md"
    lines = [
        f"# The search by steps against the drop-in's default search: {args.dispatch}",
        "",
        describe(),
        "",
        f"P95 of the drop-in against EPLB's under `{args.dispatch}` dispatch, its copies per re-plan against"
        " EPLB's in brackets ('moments': the default search, by moments for even, pooled cuts for lp).",
        "",
        "| instance | GPUs | EPLB P95 | " + " | ".join(names) + " |",
        "|---|---:|---:|" + "---:|" * len(names),
    ]
    for regime in (*SUITES["scale"], *SUITES["regimes"]):
        if args.only and regime.key not in args.only.split(","):
            continue
        if load_instance(regime.path).hardware.chiplets <= 12:
            continue
        lines.append(row(regime.key, regime.path, regime.steps, args.dispatch, names))
        print(lines[-1], flush=True)
    args.output.write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
