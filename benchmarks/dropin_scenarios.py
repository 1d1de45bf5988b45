"""The drop-in planning on multinomial scenarios at smoothed rates (stats/sparse.py, the smoothing
chosen by its own rolling-origin backtest on the history) instead of the raw history steps, on the
regime suite's drop-in replay: P95 even and best split against the EPLB port, moves.

A third way to plan the drop-in on sparse or noisy steps (after its defaults and its per-call
backtest, `calibrate=True`, benchmarks/results/regimes-dropin-notes.md): measured here, not the
default. Deterministic (the scenarios' seed is fixed; nothing reads the clock but the times shown).

    .venv/bin/python benchmarks/dropin_scenarios.py [--only A,C]
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
from bench_dropin import Setup, _ours, core_balancers, replay
from bench_dropin import table as dropin_table
from machine import describe
from regimes import REGIMES, ROOT, replay_setup

from comoe_opt.evaluator import compare as cmp
from comoe_opt.instance import load_instance
from comoe_opt.stats.sparse import smoothed_scenarios
from comoe_opt.trace import instance_batches

OUTPUT = ROOT / "benchmarks" / "results" / "dropin-scenarios.md"


def on_scenarios(setup: Setup, dispatch: str) -> Any:
    """Ours planned on as many smoothed multinomial scenarios as the history has steps."""

    def plan(history: np.ndarray, previous: np.ndarray | None) -> np.ndarray:
        scenarios, _ = smoothed_scenarios(history, history.shape[0])
        return _ours(scenarios, previous, dispatch, setup=setup)

    return plan


def run(key: str) -> list[str]:
    regime = next(r for r in REGIMES if r.key == key)
    instance = load_instance(regime.path)
    steps = cmp.step_counts(instance_batches(instance))[: regime.steps]
    setup = replay_setup(instance, steps)
    plans = core_balancers(setup)
    plans["ours, even, on scenarios"] = on_scenarios(setup, "even")
    plans["ours, lp, on scenarios"] = on_scenarios(setup, "lp")
    rows = replay(steps, plans, 0, setup)
    return [f"## {key}", "", *dropin_table(rows, 1), ""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated regime keys (default: every one on 8 GPUs)")
    args = parser.parse_args(argv)
    keys = args.only.split(",") if args.only else [r.key for r in REGIMES if "DeepSeek" not in r.key]
    lines = [
        "# The drop-in on smoothed multinomial scenarios",
        "",
        "`benchmarks/dropin_scenarios.py`: the regime suite's drop-in replay (the same steps as"
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
