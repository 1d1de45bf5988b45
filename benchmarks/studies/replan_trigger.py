"""The re-plan trigger (balancers/dropin/trigger.py) against fixed re-plan intervals (vLLM's default
3,000 steps, SGLang's 1,000, and 250) on long drift traces: the drop-in (`even`) planning on the
last 1,000 steps (vLLM's default window) or, for the trigger, on those since its change point
(at three prices of a moved expert: `MOVE_COSTS`);
P95 of the per-step max/mean GPU load (even split) in the 250 steps after each drift, the mean over
every scored step, re-plans and copies (expert, GPU pairs moved).

The traces are two regimes' generators run longer: regime C (60 experts, top-4, decode) and regime
B (64 experts, top-6, prefill), 4,000 steps with a drift every 1,000. (The scale suite's shapes do
not fit: 4,000 steps of Qwen3-235B EP16's 2,048 tokens are 6 x 10^9 routes, over 24 GB to
generate.) Plans are work-limited.

    .venv/bin/python benchmarks/studies/replan_trigger.py [--steps 4000] [--drift 1000]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common

import argparse
from dataclasses import replace

import numpy as np
from _common import RESULTS, ROOT, describe

from comoe_opt.balancers.dropin.trigger import ReplanTrigger
from comoe_opt.instance import load_instance
from comoe_opt.replay import DropIn, EplbLayout, replay
from comoe_opt.replay.triggered import Recent, interval_spans, trigger_spans
from comoe_opt.trace import instance_batches, load_trace
from comoe_opt.trace.batching import step_counts

INSTANCES = {
    "C (60 x top-4, decode, 8 GPUs)": ROOT / "instances" / "regimes" / "c-60x-top4-decode.toml",
    "B (64 x top-6, prefill, 8 GPUs)": ROOT / "instances" / "regimes" / "b-64x-top6-prefill.toml",
}
INTERVALS = (3000, 1000, 250)
HISTORY = 1000  # steps a plan is made on: vLLM's default window
WARMUP = 64  # the first plan's steps (not scored)
AFTER = 250  # steps after each drift scored for its P95
# the trigger's price of a moved expert, in layer-steps of max/mean: the drop-in's default
# (backtest.MOVE_PRICE, a balance/copies trade-off) and ten and a hundred times it, the frontier
MOVE_COSTS = (0.002, 0.02, 0.2)


def rows(key: str, path: Path, n: int, drift: int) -> list[str]:
    instance = load_instance(path)
    instance = replace(instance, trace=replace(instance.trace, micro_batches=n, drift_every=drift))
    instance, trace = load_trace(instance)
    steps = step_counts(instance_batches(instance, trace))
    layout = EplbLayout.of(instance, steps, "the re-plan trigger study")
    runs = {}
    for interval in INTERVALS:
        planner = Recent(DropIn(layout, "even"), HISTORY)
        runs[f"every {interval} steps"] = (planner, interval_spans(n, WARMUP, interval))
    for cost in MOVE_COSTS:
        planner = Recent(DropIn(layout, "even"), HISTORY)
        trigger = ReplanTrigger(instance.hardware.chiplets, move_cost=cost)
        runs[f"trigger, move cost {cost:g}"] = (planner, trigger_spans(planner, steps, WARMUP, trigger))
    out = []
    for name, (planner, spans) in runs.items():
        run = replay(planner, steps, spans, 1)
        peaks = run.served(steps, "even").imbalance  # steps WARMUP.. in order
        starts = range(drift - WARMUP, n - WARMUP, drift)
        after = [float(np.percentile(peaks[d : d + AFTER], 95)) for d in starts]
        cells = " / ".join(f"{x:.3f}" for x in after)
        out.append(
            f"| {key} | {name} | {cells} | {peaks.mean():.3f} | {len(spans) - 1} | {sum(run.copies):,} |"
        )
        print(out[-1], flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--drift", type=int, default=1000)
    parser.add_argument("--output", type=Path, default=RESULTS / "replan-trigger.md")
    args = parser.parse_args()
    lines = [
        "# The re-plan trigger against fixed intervals",
        "",
        describe(),
        "",
        f"{args.steps:,} steps, a drift every {args.drift:,}; P95 of the {AFTER} steps after each drift,"
        " the mean over every scored step, re-plans (the first after the warm-up included) and copies.",
        "",
        "| instance | re-plans | P95 after each drift | mean | re-plans | copies |",
        "|---|---|---|---:|---:|---:|",
    ]
    for key, path in INSTANCES.items():
        lines += rows(key, path, args.steps, args.drift)
    args.output.write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
