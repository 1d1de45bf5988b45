"""Out of sample: planning on history, serving the next window, on the real GPT-OSS-20B trace.

CoMoE plans each window on balance scenarios sampled from its history (the
last 128 decode steps) and serves the next 32. This script sweeps the number
of scenarios S = 8, 32, 128 (sample-average approximation) for the local
search (`milp`), runs the exact scenario model (`exact`, to the gap or
`policy.time_limit_s` per window) at S = 32, and reports the served P95 token
imbalance beside the planning time per window, all in one run.

    .venv/bin/python benchmarks/scenario_sampling.py [--micro-batches 640] [--jobs 2]

`exact` stops on its time limit on these windows, so its placements, and the
numbers of its row, depend on the machine's speed; the other rows do not.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from _common import describe, script_args

from comoe_opt.evaluator.runs import eval_run, run_many
from comoe_opt.instance import load_instance, with_overrides

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "benchmarks" / "results" / "scenario-sampling.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--micro-batches", type=int, default=640, help="decode steps served (0 = all)")
    parser.add_argument("--jobs", type=int, default=2)
    script_args(parser, RESULT)
    args = parser.parse_args(argv)
    instance = load_instance(ROOT / "instances" / "real-gptoss20b.toml")
    if args.smoke:  # two windows, the smallest sample
        args.micro_batches, args.jobs = 64, 1
    runs = []
    for scenarios in (8,) if args.smoke else (8, 32, 128):
        swept = with_overrides(instance, {"policy.balance_scenarios": scenarios})
        runs.append(eval_run(swept, "comoe", args.micro_batches, method="milp (local search)", S=scenarios))
    if not args.smoke:
        swept = with_overrides(instance, {"policy.balance_scenarios": 32})
        runs.append(eval_run(swept, "comoe-exact", args.micro_batches, method="exact", S=32))
    runs.append(eval_run(instance, "eplb-flow", args.micro_batches, method="EPLB + flow routing", S=0))
    rows = run_many(runs, args.jobs)
    lines = [
        "# Out of sample: scenarios planned on history, served on the next window",
        "",
        f"`instances/real-gptoss20b.toml`, first {rows[0]['micro_batches']} decode steps: plan on the last"
        " 128 steps, serve the next 32. Planning time is the runtime's total over its windows divided"
        " by the windows (it includes serving, which is the same for every row).",
        "",
        "| slow loop | scenarios S | P95 token imbalance | mean token imbalance | pages migrated"
        " | seconds per window |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    windows = max(1, -(-rows[0]["micro_batches"] // instance.policy.window_batches))
    for r in rows:
        lines.append(
            f"| {r['method']} | {r['S']} | {r['token_imbalance_p95']:.3f} | {r['token_imbalance_mean']:.3f}"
            f" | {r['pages_migrated']} | {r['runtime_s'] / windows:.2f} |"
        )
    lines += ["", describe(), ""]
    text = "\n".join(lines)
    print(text)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
