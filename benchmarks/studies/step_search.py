"""The drop-in's search by steps (balancers/dropin/step_search.py, its default past
`SearchConfig.step_search_gpus`) against its search by moments (`even`) or pooled cuts (`lp`), on
the drop-in replay of every instance past 12 GPUs of both suites, each drawn with the
generator's seeds given: P95 against EPLB's under the dispatch, copies per re-plan against EPLB's,
the steps' partners (`SearchConfig.step_partners`) at 2 and 8 (default 4), the held-back check
(`SearchConfig.held_back`) and the steps the guard judges (`SearchConfig.guard_steps`).

Plans are work-limited: the same numbers on any machine.

    .venv/bin/python benchmarks/studies/step_search.py [--dispatch even|lp] [--only "Kimi-K2 EP64,..."]
        [--seeds 0,1,2] [--jobs 2]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common

import argparse
from dataclasses import replace

import numpy as np
from _common import RESULTS, SUITES, describe, drawn_steps, dropin_runs

from comoe_opt.balancers.dropin.config import DEFAULT
from comoe_opt.instance import load_instance
from comoe_opt.parallel import parallel_map
from comoe_opt.replay import DropIn, EplbLayout, Planner, Rolling

VARIANTS = {
    "moments": replace(DEFAULT, step_search_gpus=None),
    "moments, guard on all": replace(DEFAULT, step_search_gpus=None, guard_steps="all"),
    "steps, guard on newest": replace(DEFAULT, guard_steps="newest"),
    "steps": DEFAULT,
    **{f"steps, {m} partners": replace(DEFAULT, step_partners=m) for m in (2, 8)},
    "steps, held back": replace(DEFAULT, held_back=True),
}


def deltas(
    task: tuple[str, str, int, str, tuple[str, ...], int | None],
) -> tuple[int, float, list[tuple[float, float]]]:
    """(GPUs, EPLB's P95, [(P95 against EPLB's, copies per re-plan against EPLB's)] per variant) of
    one instance drawn with `seed` (None: its own)."""
    _key, path, steps_run, dispatch, names, seed = task
    instance, steps = drawn_steps(Path(path), steps_run, seed)
    layout = EplbLayout.of(instance, steps, "the step search study")
    planners: dict[str, Planner] = {"EPLB": Rolling(instance, "eplb")}
    for name in names:
        planners[name] = DropIn(layout, dispatch, options=(("config", VARIANTS[name]),), label=name)
    runs = dropin_runs(instance, steps, planners)
    eplb = float(np.percentile(runs["EPLB"].served(steps, dispatch).imbalance, 95))
    copies = runs["EPLB"].copies_per_replan() or 1.0
    out = []
    for name in names:
        p95 = float(np.percentile(runs[name].served(steps, dispatch).imbalance, 95))
        out.append((p95 / eplb - 1, runs[name].copies_per_replan() / copies))
    return instance.hardware.chiplets, eplb, out


def cell(values: list[tuple[float, float]], each: bool = True) -> str:
    """Mean P95 against EPLB's, each value's in brackets, mean copies against EPLB's."""
    p95 = [100 * v for v, _ in values]
    listed = "/".join(f"{v:+.1f}" for v in p95)
    shown = f"{np.mean(p95):+.1f}%" + (f" [{listed}]" if each and len(p95) > 1 else "")
    return f"{shown} ({np.mean([c for _, c in values]):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated instance keys (default: all past 12 GPUs)")
    parser.add_argument("--dispatch", choices=("even", "lp"), default="even")
    parser.add_argument("--variants", help=f"separated by ';', of: {'; '.join(VARIANTS)} (default: all)")
    parser.add_argument("--output", type=Path, help="default: results/scale-step-search[-lp].md")
    parser.add_argument(
        "--seeds", default="own", help="the generator's seeds, e.g. 0,1,2 ('own': each instance's)"
    )
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    args = parser.parse_args()
    names = tuple(args.variants.split(";") if args.variants else VARIANTS)
    if unknown := [n for n in names if n not in VARIANTS]:
        parser.error(f"--variants: unknown {', '.join(unknown)}")
    seeds = [None] if args.seeds == "own" else [int(x) for x in args.seeds.split(",")]
    suffix = "" if args.dispatch == "even" else f"-{args.dispatch}"
    args.output = args.output or RESULTS / f"scale-step-search{suffix}.md"
    regimes = [
        r
        for r in (*SUITES["scale"], *SUITES["regimes"])
        if (not args.only or r.key in args.only.split(",")) and load_instance(r.path).hardware.chiplets > 12
    ]
    tasks = [(r.key, str(r.path), r.steps, args.dispatch, names, s) for r in regimes for s in seeds]
    done = parallel_map(deltas, tasks, args.jobs)
    lines = [
        f"# The drop-in's search by steps against its search by moments or pooled cuts: {args.dispatch}",
        "",
        describe(),
        "",
        f"P95 of the drop-in against EPLB's under `{args.dispatch}` dispatch, mean over the generator's"
        f" seeds {args.seeds} (each seed's in brackets), its copies per re-plan against EPLB's in"
        " parentheses ('moments': the search by moments for even, by pooled cuts for lp; 'steps': the"
        " search by steps, the default past 12 GPUs, its guard judging every step).",
        "",
        "| instance | GPUs | EPLB P95 | " + " | ".join(names) + " |",
        "|---|---:|---:|" + "---:|" * len(names),
    ]
    for i, regime in enumerate(regimes):
        rows = done[i * len(seeds) : (i + 1) * len(seeds)]
        eplb = np.mean([r[1] for r in rows])
        cells = [cell([r[2][k] for r in rows]) for k in range(len(names))]
        lines.append(f"| {regime.key} | {rows[0][0]} | {eplb:.3f} | " + " | ".join(cells) + " |")
    every = [cell([r[2][k] for r in done], each=False) for k in range(len(names))]
    lines.append("| every instance and seed | | | " + " | ".join(every) + " |")
    args.output.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
