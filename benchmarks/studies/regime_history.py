"""CoMoE's history length on the regime suite: `policy.history_windows` swept with the migration
weight as the instance sets it (the backtest) and at 0 (copies free), P95 under the best routing,
copies per re-plan and each window's P95. Measures whether planning on less or more of the past
closes the gap to hindsight where the load turns (OLMoE's domains, A's topics, Switch-128).

    .venv/bin/python benchmarks/studies/regime_history.py [--only OLMoE,A] [--histories 1,2,4,8]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common and studies

import argparse

import numpy as np
from _common import REGIMES, ROOT, describe

from comoe_opt.evaluator.frontier import best_point
from comoe_opt.instance import load_instance, with_overrides
from comoe_opt.replay import Rolling, replay
from comoe_opt.trace import instance_batches, load_trace
from comoe_opt.trace.batching import step_counts, windows

OUTPUT = ROOT / "benchmarks" / "results" / "regime-history.md"


def point(key: str, history: int, weight: float | None) -> str:
    regime = next(r for r in REGIMES if r.key == key)
    instance, trace = load_trace(load_instance(regime.path))
    steps = step_counts(instance_batches(instance, trace))[: regime.steps]
    overrides: dict[str, float] = {"policy.history_windows": history}
    if weight is not None:
        overrides["policy.migration_weight"] = weight
    chosen = with_overrides(instance, overrides, "regime_history")
    spans = windows(steps.shape[0], chosen.policy.window_batches)
    run = replay(Rolling(chosen, "comoe"), steps, spans, chosen.policy.history_windows)
    best = best_point("comoe", "history_windows", history, steps, run)
    ratio = run.served(steps, best.routing).imbalance  # from window 1 (window 0: the warm-up)
    first = spans[1][0]
    per_window = " ".join(f"{np.percentile(ratio[a - first : b - first], 95):.3f}" for a, b in spans[1:])
    setting = "the instance's (backtest)" if weight is None else f"{weight:g}"
    own = " (the instance's)" if history == instance.policy.history_windows else ""
    return f"| {key} | {history}{own} | {setting} | {best.p95:.3f} | {best.copies:.1f} | {per_window} |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="OLMoE,A,Switch-128", help="comma-separated regime keys")
    parser.add_argument("--histories", default="1,2,4,8", help="policy.history_windows values")
    args = parser.parse_args(argv)
    lines = [
        "# CoMoE's history length on the regime suite",
        "",
        "`benchmarks/studies/regime_history.py`: CoMoE planned with each `policy.history_windows`, at the"
        " instance's migration weight (-1: chosen per window by backtest) and at 0, on the suite's"
        " steps (benchmarks/results/regimes.md). P95 of per-(step, layer) max/mean device load under"
        " the best routing; each window's P95 in order.",
        "",
        describe(),
        "",
        "| regime | history windows | migration weight | P95 | copies / re-plan | P95 per window |",
        "|---|---:|---|---:|---:|---|",
    ]
    for key in args.only.split(","):
        for history in (int(h) for h in args.histories.split(",")):
            for weight in (None, 0.0):
                lines.append(point(key, history, weight))
                print(lines[-1], flush=True)
    OUTPUT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
