"""CoMoE with raw steps as balance scenarios against smoothed multinomial scenarios
(`policy.balance_scenario_model`), on regimes of the suite: P95 imbalance under the best routing,
copies per re-plan, and the smoothing each re-plan's backtest chose (stats/sparse.py).

    .venv/bin/python benchmarks/studies/sparse_scenarios.py [--only A,C]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common and studies

import argparse
from collections import Counter

from _common import REGIMES, ROOT, describe

from comoe_opt.evaluator.frontier import best_point
from comoe_opt.instance import load_instance, with_overrides
from comoe_opt.planning.window import steps_demand
from comoe_opt.replay import Rolling, replay
from comoe_opt.trace import instance_batches
from comoe_opt.trace.batching import history_span, step_counts, windows


def run(key: str) -> list[str]:
    regime = next(r for r in REGIMES if r.key == key)
    instance = load_instance(regime.path)
    steps = step_counts(instance_batches(instance))[: regime.steps]
    spans = windows(steps.shape[0], instance.policy.window_batches)
    lines = []
    for model in ("steps", "smoothed"):
        chosen = with_overrides(instance, {"policy.balance_scenario_model": model}, "sparse_scenarios")
        run_ = replay(Rolling(chosen, "comoe"), steps, spans, chosen.policy.history_windows)
        point = best_point("comoe", "", None, steps, run_)
        kappas = (
            Counter(
                steps_demand(chosen, steps[a:b]).smoothing.pseudo_steps  # type: ignore[union-attr]
                for a, b in (
                    history_span(spans, w, instance.policy.history_windows) for w in range(len(spans))
                )
            )
            if model == "smoothed"
            else None
        )
        lines.append(
            f"| {key} | {model} | {point.p95:.3f} | {point.routing} | {point.copies:.1f} |"
            f" {dict(sorted(kappas.items())) if kappas else '–'} |"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="A,C")
    args = parser.parse_args()
    lines = [
        "| regime | scenarios | P95 | routing | copies / re-plan | pseudo-steps chosen (re-plans) |",
        "|---|---|---:|---|---:|---|",
    ]
    for key in args.only.split(","):
        lines += run(key)
        print("\n".join(lines), flush=True)
    text = "\n".join(["# Smoothed balance scenarios on the regime suite", "", *lines, "", describe(), ""])
    (ROOT / "benchmarks" / "results" / "sparse-scenarios.md").write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
