"""The drop-in planning on multinomial scenarios at smoothed rates (stats/sparse.py, the smoothing
chosen by its own rolling-origin backtest on the history) instead of the raw history steps, on the
regime suite's drop-in replay: P95 even and best split against the EPLB port, moves.

A third way to plan the drop-in on sparse or noisy steps (after its defaults and its per-call
backtest, `calibrate=True`, benchmarks/results/regimes-dropin-notes.md): measured here, not the
default. Deterministic (the scenarios' seed is fixed; nothing reads the clock but the times shown).

    .venv/bin/python benchmarks/studies/dropin_scenarios.py [--only A,C]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common and studies

import argparse
from dataclasses import dataclass
from typing import Literal

import numpy as np
from _common import REGIMES, ROOT, describe, dropin_planners, dropin_runs, dropin_table

from comoe_opt.instance import load_instance
from comoe_opt.replay import DropIn, EplbLayout, Window
from comoe_opt.residency.placement import Placement
from comoe_opt.stats.sparse import smoothed_scenarios
from comoe_opt.trace import instance_batches
from comoe_opt.trace.batching import step_counts

OUTPUT = ROOT / "benchmarks" / "results" / "dropin-scenarios.md"


@dataclass(frozen=True)
class OnScenarios:
    """The drop-in planned on as many smoothed multinomial scenarios as the history has steps."""

    layout: EplbLayout
    dispatch: Literal["even", "lp"]

    @property
    def name(self) -> str:
        return f"ours, {self.dispatch}, on scenarios"

    def plan(self, steps: np.ndarray, window: Window, in_service: Placement | None) -> Placement:
        """The drop-in's own plan (replay.DropIn) with the history's steps replaced by as many
        scenarios drawn at their smoothed rates."""
        history = steps[window.planned_on].astype(np.float64)
        scenarios, _ = smoothed_scenarios(history, history.shape[0])
        drawn = steps.astype(np.float64)
        drawn[window.planned_on] = scenarios
        return DropIn(self.layout, self.dispatch).plan(drawn, window, in_service)


def run(key: str) -> list[str]:
    regime = next(r for r in REGIMES if r.key == key)
    instance = load_instance(regime.path)
    steps = step_counts(instance_batches(instance))[: regime.steps]
    layout = EplbLayout.of(instance, steps, "the drop-in replay")
    planners = dropin_planners(
        instance,
        steps,
        **{p.name: p for p in (OnScenarios(layout, "even"), OnScenarios(layout, "lp"))},
    )
    return [f"## {key}", "", *dropin_table(dropin_runs(instance, steps, planners), steps), ""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated regime keys (default: every one on 8 GPUs)")
    args = parser.parse_args(argv)
    keys = args.only.split(",") if args.only else [r.key for r in REGIMES if "DeepSeek" not in r.key]
    lines = [
        "# The drop-in on smoothed multinomial scenarios",
        "",
        "`benchmarks/studies/dropin_scenarios.py`: the regime suite's drop-in replay (the same steps as"
        " benchmarks/results/regimes.md) with two more rows: ours planned on multinomial scenarios at"
        " the history's smoothed rates (`stats/sparse.py`, smoothing chosen by its backtest) instead"
        " of the raw steps.",
        "",
        describe(),
        "",
    ]
    for key in keys:
        lines += run(key)
    OUTPUT.write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
