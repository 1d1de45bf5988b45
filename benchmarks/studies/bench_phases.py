"""Where `milp` (10 s) and `exact` (60 s) spend their time, and what each step gives, per shape.

For each shape (below) and balance-scenario count, one window is planned as `solve` plans it
(`planning.plan_window`), and the report's phase times (`report.timing.phases`) and step gains
(`report.gains`: objective lowered, bound raised, in ms) are written with the final gap on what a
placement changes. Shapes: the 5 x 60 x 8 stand-in (instances/standin-5x60x8.toml), GPT-OSS-20B
24 x 32 x 8 (real trace, window 13), 24 x 128 x 8 top-1 and 26 x 64 x 8 top-6 (the stand-in's
synthetic trace and serving policy at those sizes), the paper baseline 32 x 64 x 8 top-2, and
DeepSeek-V3 58 x 256 x 32 (its instance has 20 steps: at most 20 scenarios).

Each case is one JSON file in benchmarks/results/phases/ (so that cases can be run one at a
time, and by an older checkout with `--label`); `--table` collects them into
benchmarks/results/phases.md.

    .venv/bin/python benchmarks/studies/bench_phases.py --shapes standin gptoss --scenarios 0 16 32
    .venv/bin/python benchmarks/studies/bench_phases.py --table
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common and studies

import argparse
import json
import math
import os
import time

from _common import describe

from comoe_opt.instance import load_instance, with_overrides
from comoe_opt.planning import plan_window
from comoe_opt.trace import instance_batches

ROOT = Path(__file__).resolve().parents[2]
CASE_DIR = ROOT / "benchmarks" / "results" / "phases"
RESULT = ROOT / "benchmarks" / "results" / "phases.md"
STANDIN = ROOT / "instances" / "standin-5x60x8.toml"
METHODS = (("milp", 10.0), ("exact", 60.0))


def _serving(layers: int, experts: int, top_k: int) -> dict:
    """The stand-in's trace and policy at another size: 1.25 slots per expert, all resident."""
    budget = math.ceil(1.25 * layers * experts)
    pages = math.ceil(budget / 8) + 1  # per device, one spare
    return {
        "model.layers": layers,
        "model.experts_per_layer": experts,
        "model.top_k": top_k,
        "hardware.capacity_gb": round(pages * 0.0133 + 0.0001, 4),
        "policy.replica_budget_pages": budget,
    }


# name: (instance, window, overrides); windows 4 and later of the 8-step instances plan on 32 steps
SHAPES: dict[str, tuple[Path, int, dict]] = {
    "standin": (STANDIN, 4, {}),
    "gptoss": (ROOT / "instances" / "real-gptoss20b.toml", 13, {}),
    "top1-128": (STANDIN, 4, _serving(24, 128, 1)),
    "top6-64": (STANDIN, 4, _serving(26, 64, 6)),
    "paper": (ROOT / "instances" / "paper-baseline.toml", 0, {}),
    "deepseek-v3": (ROOT / "instances" / "deepseek-v3-ep32.toml", 0, {}),
}


def run_case(shape: str, scenarios: int, method: str, limit_s: float, label: str) -> dict:
    path, window, overrides = SHAPES[shape]
    instance = with_overrides(load_instance(path), {**overrides, "policy.balance_scenarios": scenarios})
    part = instance_batches(instance).planning_window(window, instance.policy.window_batches)
    load = os.getloadavg()[0]
    began = time.perf_counter()
    result = plan_window(instance, part, method=method, time_limit_s=limit_s).result
    report = result.report
    return {
        "label": label,
        "shape": shape,
        "window": window,
        "scenarios": scenarios,
        "method": method,
        "time_limit_s": limit_s,
        "wall_s": time.perf_counter() - began,
        "load_before": load,
        "status": result.status.value,
        "gap": result.gap,
        "objective": result.objective,
        "bound": result.bound,
        "phases": report.timing.phases,
        "gains": getattr(report, "gains", None),
        "notes": list(report.timing.stopped_by_time_limit),
    }


def case_path(case: dict) -> Path:
    name = f"{case['label']}-{case['shape']}-s{case['scenarios']}-{case['method']}.json"
    return CASE_DIR / name


def table() -> str:
    cases = [json.loads(p.read_text()) for p in sorted(CASE_DIR.glob("*.json"))]
    lines = [
        "| pipeline | shape | scenarios | method | gap | status | time (s) | load | phases: time s (objective"
        " lowered / bound raised, µs) |",
        "|---|---|---:|---|---:|---|---:|---:|---|",
    ]
    order = {name: k for k, name in enumerate(SHAPES)}
    cases.sort(key=lambda c: (order[c["shape"]], c["scenarios"], c["method"], c["label"]))
    for c in cases:
        lines.append(
            f"| {c['label']} | {c['shape']} | {c['scenarios']} | {c['method']} {c['time_limit_s']:g} s"
            f" | {100 * c['gap']:.2f}% | {c['status']} | {c['wall_s']:.1f} | {c['load_before']:.1f}"
            f" | {_phases(c)} |"
        )
    return "\n".join(lines)


def _phases(case: dict) -> str:
    """Each phase's time, with its step's gain beside it (the step `search` spans fill and search)."""
    gains = case.get("gains") or {}
    parts = []
    for name, seconds in case["phases"].items():
        gain = gains.get(name)
        lowered = (
            ""
            if gain is None
            else f" ({1e3 * gain['objective_lowered_ms']:.0f} / {1e3 * gain['bound_raised_ms']:.0f})"
        )
        parts.append(f"{name} {seconds:.2f}{lowered}")
    return "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--scenarios", nargs="*", type=int, default=[0, 16, 32])
    parser.add_argument("--methods", nargs="*", default=[m for m, _ in METHODS])
    parser.add_argument("--label", default="scheduled", help="name of the pipeline measured")
    parser.add_argument("--table", action="store_true", help="only collect the cases into phases.md")
    args = parser.parse_args(argv)
    CASE_DIR.mkdir(parents=True, exist_ok=True)
    if not args.table:
        limits = dict(METHODS)
        for shape in args.shapes:
            for scenarios in args.scenarios:
                for method in args.methods:
                    case = run_case(shape, scenarios, method, limits[method], args.label)
                    case_path(case).write_text(json.dumps(case, indent=1))
                    gap, wall = 100 * case["gap"], case["wall_s"]
                    print(f"{shape} s{scenarios} {method}: gap {gap:.2f}% in {wall:.1f} s", flush=True)
    text = RESULT.read_text() if RESULT.is_file() else ""
    head = text.split("<!-- table -->")[0] if "<!-- table -->" in text else _header()
    RESULT.write_text(f"{head}<!-- table -->\n\n{table()}\n")
    return 0


def _header() -> str:
    return f"# Phases of `milp` (10 s) and `exact` (60 s) per shape\n\n{describe()}\n\n"


if __name__ == "__main__":
    sys.exit(main())
