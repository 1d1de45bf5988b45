"""The drop-in planning for modelled time (`rebalance_experts(..., timing=instance.layer_time)`,
balancers/dropin/timing.py) against its default token objective and EPLB, on the drop-in replay of
every regime of both suites, each drawn with the generator's seeds given: the MoE layer's modelled
time per step (mean and P95, costs.py: LayerTime) and the token P95 under the even split, each
against EPLB's, and copies per re-plan against EPLB's.

Plans are work-limited: the same numbers on any machine.

    .venv/bin/python benchmarks/studies/dropin_time.py [--suite regimes|scale|both] [--only A,B]
        [--seeds 0,1,2] [--jobs 2] [--output PATH]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common

import argparse

import numpy as np
from _common import RESULTS, SUITES, describe, drawn_steps, dropin_runs

from comoe_opt.instance import load_instance
from comoe_opt.parallel import parallel_map
from comoe_opt.replay import DropIn, EplbLayout, Planner, Rolling

DISPATCH = "even"
REPLAN_EVERY = 3000  # steps a re-plan's gain is summed over (compare's default, vLLM's interval)
VARIANTS = ("tokens", "time", "time over the interval")
Task = tuple[str, str, int, int | None]


def measures(task: Task) -> tuple[int, dict[str, tuple[float, ...]]]:
    """(GPUs, per variant: layer-time mean, layer-time P95, token P95, copies per re-plan, each
    against EPLB's, and net ms per re-plan as compare reckons it) of one instance drawn with `seed`
    (None: its own)."""
    _key, path, steps_run, seed = task
    instance, steps = drawn_steps(Path(path), steps_run, seed)
    layout = EplbLayout.of(instance, steps, "the drop-in time study")
    timing = instance.layer_time
    planners: dict[str, Planner] = {
        "EPLB": Rolling(instance, "eplb"),
        "tokens": DropIn(layout, DISPATCH, label="tokens"),
        "time": DropIn(layout, DISPATCH, options=(("timing", timing),), label="time"),
        "time over the interval": DropIn(
            layout, DISPATCH, options=(("timing", timing), ("replan_every", REPLAN_EVERY)), label="interval"
        ),
    }
    runs = dropin_runs(instance, steps, planners)
    served = {name: run.served(steps, DISPATCH, timing) for name, run in runs.items()}

    def figures(name: str) -> tuple[float, ...]:
        layer_ms = served[name].layer_ms
        assert layer_ms is not None
        return (
            float(layer_ms.mean()),
            float(np.percentile(layer_ms, 95)),
            float(np.percentile(served[name].imbalance, 95)),
            runs[name].copies_per_replan(),
            float(layer_ms.sum(axis=1).mean()),  # every MoE layer of a step, as compare's step_ms_mean
            runs[name].migration_ms(timing.replan_copy_ms),
        )

    eplb = figures("EPLB")
    out = {}
    for name in VARIANTS:
        ours = figures(name)
        against = [o / max(e, 1e-12) - 1 for o, e in zip(ours[:3], eplb[:3], strict=True)]
        net = (eplb[4] - ours[4]) * REPLAN_EVERY - ours[5]  # compare's net_ms_per_replan
        out[name] = (*against, ours[3] / max(eplb[3], 1.0), net)
    return instance.hardware.chiplets, out


def cell(values: list[tuple[float, ...]]) -> str:
    """Mean layer time, its P95 and the token P95 against EPLB's (%), copies against EPLB's, net
    ms per re-plan."""
    mean = np.mean(values, axis=0)
    shares = f"{100 * mean[0]:+.2f} / {100 * mean[1]:+.2f} / {100 * mean[2]:+.1f}"
    return f"{shares} ({mean[3]:.2f}) | {mean[4]:+,.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=("regimes", "scale", "both"), default="both")
    parser.add_argument("--only", help="comma-separated instance keys")
    parser.add_argument("--seeds", default="0,1,2", help="the generator's seeds ('own': each instance's)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes")
    parser.add_argument("--output", type=Path, default=RESULTS / "dropin-time.md")
    args = parser.parse_args()
    suites = ("regimes", "scale") if args.suite == "both" else (args.suite,)
    regimes = [r for s in suites for r in SUITES[s] if not args.only or r.key in args.only.split(",")]
    seeds = [None] if args.seeds == "own" else [int(x) for x in args.seeds.split(",")]
    # a real trace is drawn once: the seeds are the generator's
    tasks = [
        (r.key, str(r.path), r.steps, s)
        for r in regimes
        for s in (seeds if hasattr(load_instance(r.path).trace, "seed") else [None])
    ]
    done = parallel_map(measures, tasks, args.jobs)
    lines = [
        "# The drop-in planning for modelled time against its token objective and EPLB",
        "",
        f"`.venv/bin/python benchmarks/studies/dropin_time.py --suite {args.suite} --seeds {args.seeds}`"
        + (f" `--only {args.only}`" if args.only else "")
        + f" ({describe()}).",
        "",
        "Drop-in replay under the even split, mean over the generator's seeds: the MoE layer's"
        " modelled time per step, its mean / its P95 / the token P95 (max/mean GPU load), each against"
        " EPLB's (negative: below EPLB), copies per re-plan against EPLB's in parentheses, and the net ms"
        f" per re-plan as compare reckons it (time saved per step against EPLB over {REPLAN_EVERY:,}"
        " steps, less the re-plan's stall). 'tokens':"
        " the default (token max/mean); 'time': `timing=instance.layer_time`; 'time over the interval':"
        f" also `replan_every={REPLAN_EVERY}`, a move priced at its copy time spread over the interval.",
        "",
        "| regime | GPUs | " + " | ".join(f"{v} | {v} net ms" for v in VARIANTS) + " |",
        "|---|---:|" + "---|---:|" * len(VARIANTS),
    ]
    for regime in regimes:
        rows = [r for t, r in zip(tasks, done, strict=True) if t[0] == regime.key]
        cells = [cell([r[1][name] for r in rows]) for name in VARIANTS]
        lines.append(f"| {regime.key} | {rows[0][0]} | " + " | ".join(cells) + " |")
    lines.append(
        "| every regime and seed | | " + " | ".join(cell([r[1][n] for r in done]) for n in VARIANTS) + " |"
    )
    args.output.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
