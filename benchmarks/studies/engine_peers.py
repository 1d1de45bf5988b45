"""The engines' balancers beside CoMoE on the real GPT-OSS-20B trace (`comoe-opt compare`).

Writes `benchmarks/results/engine-peers.md`, `.json` and two figures: every peer (EPLB, SGLang
deepseek_vec, vLLM default, vLLM-Ascend SwiftBalancer and FlashLB, CoMoE) re-planned every window
under even split, SGLang's LP dispatch and our flow, beside the oracle, hindsight and the milp
bound; then the redundant-slot sweep (0, 8, 16, 24) on the first `--sweep-steps` steps.

    .venv/bin/python benchmarks/studies/engine_peers.py [--steps 0] [--sweep-steps 1024]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common and studies

import argparse
import json
from pathlib import Path

from _common import describe

from comoe_opt.evaluator import compare as cmp
from comoe_opt.evaluator import plots
from comoe_opt.evaluator import sweep as sweep_
from comoe_opt.instance import load_instance
from comoe_opt.trace import instance_batches
from comoe_opt.trace.batching import step_counts

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "benchmarks" / "results"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=0, help="first N steps of the comparison (0 = all)")
    parser.add_argument("--sweep-steps", type=int, default=1024, help="first N steps of the sweep")
    parser.add_argument("--redundant", default="0,8,16,24")
    parser.add_argument("--keep-sweep", action="store_true", help="reuse the sweep in engine-peers.json")
    args = parser.parse_args(argv)
    instance = load_instance(ROOT / "instances" / "real-gptoss20b.toml")
    steps = step_counts(instance_batches(instance))
    result = cmp.compare(instance, steps, cmp.CompareSettings(steps=args.steps))
    plots.plot_cdf(result, OUT / "engine-peers-cdf.png")
    redundant = [int(r) for r in args.redundant.split(",")]
    if args.keep_sweep:
        sweep = json.loads((OUT / "engine-peers.json").read_text())["redundant"]
    else:
        sweep = sweep_.redundancy_sweep(
            instance, steps, redundant, cmp.CompareSettings(steps=args.sweep_steps)
        )
    plots.plot_redundancy(sweep, OUT / "engine-peers-redundant.png")
    shown = {k: v for k, v in result.items() if k != "imbalance"}
    (OUT / "engine-peers.json").write_text(json.dumps({"compare": shown, "redundant": sweep}, indent=1))
    text = "\n".join(
        [
            "# The engines' balancers beside CoMoE: GPT-OSS-20B",
            "",
            "`.venv/bin/python benchmarks/studies/engine_peers.py` (`comoe-opt compare"
            " instances/real-gptoss20b.toml`; the sweep: `--redundant 0,8,16,24 --steps 1024`)."
            " Figures: `engine-peers-cdf.png`,"
            " `engine-peers-redundant.png`.",
            "",
            cmp.markdown(result),
            "",
            f"## Redundant slots (first {args.sweep_steps} steps)",
            "",
            sweep_.redundancy_markdown(sweep),
            "",
            describe(),
            "",
        ]
    )
    print(text)
    (OUT / "engine-peers.md").write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
