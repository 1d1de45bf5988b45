"""CoMoE with `policy.migration_weight = -1` (chosen per window by the backtest, planning/backtest.py)
against the peers, CoMoE at the fixed 0.2 and hindsight, per regime of the suite.

The peers' and hindsight points are read from the suite's committed parts
(`benchmarks/results/regimes/<regime>.json`, the same steps; every planner there runs on work
limits, so the numbers do not depend on the machine). CoMoE is planned here at the fixed 0.2 (the
parts hold the instances' default, the backtest) and with the backtest at each copy share of
`--shares`: 1 charges each copy its whole link time (the policy's default), 0 counts copies without
timing them. `--check` re-plans the fixed 0.2 on one regime against this script's saved result;
`--collect` writes the table from the results present; `--whole INSTANCE` plans CoMoE on the
instance's whole trace as the instance sets it.

    .venv/bin/python benchmarks/studies/regimes_backtest.py [--only A,C] [--shares 1,0] [--check C]
        [--collect]; --whole INSTANCE [--weight 0.2] plans CoMoE on an instance's whole trace
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common and studies

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import REGIMES, RESULTS, ROOT, describe, slug

from comoe_opt.evaluator.frontier import FrontierPoint, best_point, peer_points
from comoe_opt.instance import Instance, load_instance, with_overrides
from comoe_opt.planning import backtest
from comoe_opt.replay import Rolling, replay
from comoe_opt.trace import instance_batches, load_trace
from comoe_opt.trace.batching import step_counts, windows

OUT = ROOT / "benchmarks" / "results" / "regimes-backtest"
PARTS = RESULTS / "regimes"
FIXED = 0.2  # the weight every regime used before the backtest (set on GPT-OSS)


def committed(key: str) -> dict[str, Any]:
    """The suite's points for the regime: each peer's best routing and hindsight."""
    part = json.loads((PARTS / f"{slug(key)}.json").read_text(encoding="utf-8"))
    result = part["compare"]
    peers = [p for p in peer_points(result) if p.planner != "comoe"]
    hindsight = next(r["p95"] for r in result["rows"] if r["peer"] == "hindsight")
    return {"steps": result["steps"], "peers": peers, "hindsight": hindsight}


def planned(instance: Instance, steps: np.ndarray, overrides: dict[str, Any]) -> dict[str, Any]:
    """CoMoE's point, plan time and weight report under `overrides`."""
    chosen = with_overrides(instance, overrides, "regimes_backtest")
    spans = windows(steps.shape[0], chosen.policy.window_batches)
    began, cpu = time.perf_counter(), time.process_time()
    planner = Rolling(chosen, "comoe")
    run = replay(planner, steps, spans, chosen.policy.history_windows)
    seconds, cpu_seconds = time.perf_counter() - began, time.process_time() - cpu
    point = best_point("comoe", "migration_weight", None, steps, run)
    report = planner.weight_report()
    backtests = len(report["backtests"])
    return {
        "p95": point.p95,
        "copies": point.copies,
        "routing": point.routing,
        "plan_s": seconds,
        "plan_cpu_s": cpu_seconds,  # this process's CPU time: less sensitive to others' load
        "windows": len(spans),
        # solves: one per window, and each backtest re-plans the origin at every candidate but the
        # weight it was planned with (a work count, free of the machine's load)
        "solves": len(spans) + backtests * (len(backtest.WEIGHTS) - 1),
        "weights": report,
    }


def verdict(point: dict[str, Any], peers: list[FrontierPoint], hindsight: float) -> dict[str, Any]:
    best = min(peers, key=lambda p: (p.p95, p.copies))
    beaten = [p.planner for p in peers if point["p95"] <= p.p95 and point["copies"] <= p.copies]
    half = best.p95 - (best.p95 - hindsight) / 2 if hindsight < best.p95 else None
    return {
        "beats": len(beaten),
        "of": len(peers),
        "not_beaten": [p.planner for p in peers if p.planner not in beaten],
        "half_gap_target": half,
        "half_gap_met": None if half is None else point["p95"] <= half + 1e-12,
    }


def run_regime(key: str, shares: tuple[float, ...], path: Path) -> dict[str, Any]:
    """The regime's committed points and CoMoE with the backtest at each copy share (added to the
    regime's earlier results in `path`, if any)."""
    regime = next(r for r in REGIMES if r.key == key)
    points = committed(key)
    instance, trace = load_trace(load_instance(regime.path))
    steps = step_counts(instance_batches(instance, trace))[: points["steps"]]
    out: dict[str, Any] = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    out.update(key=key, instance=str(regime.path.relative_to(ROOT)), steps=points["steps"])
    out["peers"] = [p.__dict__ for p in points["peers"]]
    out["fixed"] = planned(instance, steps, {"policy.migration_weight": FIXED})
    out["hindsight"] = points["hindsight"]
    out["fixed_verdict"] = verdict(out["fixed"], points["peers"], points["hindsight"])
    for share in shares:
        load = os.getloadavg()[0]
        result = planned(
            instance, steps, {"policy.migration_weight": backtest.AUTO, "policy.backtest_copy_share": share}
        )
        result["load"] = load
        result["verdict"] = verdict(result, points["peers"], points["hindsight"])
        out[f"share {share:g}"] = result
        print(key, share, {k: v for k, v in result.items() if k != "weights"}, flush=True)
    return out


def check(key: str) -> dict[str, Any]:
    """CoMoE at the fixed weight re-planned now, beside this script's saved point."""
    regime = next(r for r in REGIMES if r.key == key)
    saved = json.loads((OUT / f"{slug(key)}.json").read_text(encoding="utf-8"))
    instance, trace = load_trace(load_instance(regime.path))
    steps = step_counts(instance_batches(instance, trace))[: saved["steps"]]
    now = planned(instance, steps, {"policy.migration_weight": FIXED})
    pick = ("p95", "copies")
    return {"key": key, "saved": {k: saved["fixed"][k] for k in pick}, "now": {k: now[k] for k in pick}}


def whole_trace(path: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    """CoMoE on every step of an instance's trace, planned as the instance says (or `overrides`)."""
    instance, trace = load_trace(load_instance(path))
    steps = step_counts(instance_batches(instance, trace))
    load = os.getloadavg()[0]
    return {**planned(instance, steps, overrides), "load": load, "steps": int(steps.shape[0])}


def table(results: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| regime | best peer: P95 (copies) | hindsight | CoMoE | P95 | copies / re-plan | peers beaten"
        " at no more copies | half the gap to hindsight | weight per window | solves / window |",
        "|---|---|---:|---|---:|---:|---|---|---|---:|",
    ]
    for r in results:
        best = min(r["peers"], key=lambda p: (p["p95"], p["copies"]))
        head = [
            r["key"],
            f"{best['planner']} {best['p95']:.3f} ({best['copies']:.0f})",
            f"{r['hindsight']:.3f}",
        ]
        rows = [(f"fixed {FIXED:g}", r["fixed"], r["fixed_verdict"], None)]
        for key in sorted((k for k in r if k.startswith("share ")), key=lambda k: -float(k.split()[1])):
            s = r[key]
            rows.append((f"backtest, copy share {key.split()[1]}", s, s["verdict"], s))
        for label, point, v, run in rows:
            half = "–" if v["half_gap_met"] is None else ("met" if v["half_gap_met"] else "missed")
            beaten = f"{v['beats']}/{v['of']}" + (
                f" (not {', '.join(v['not_beaten'])})" if v["not_beaten"] else ""
            )
            per_window = [FIXED] if run is None else run["weights"]["per_window"]
            weights = " ".join(f"{w:g}" for w in per_window)
            solves = "1.00" if run is None else f"{run['solves'] / run['windows']:.2f}"
            cells = [
                *head,
                label,
                f"{point['p95']:.3f}",
                f"{point['copies']:.1f}",
                beaten,
                half,
                weights,
                solves,
            ]
            lines.append("| " + " | ".join(cells) + " |")
            head = ["", "", ""]
    return lines


def _compared(path: Path) -> bool:
    """Whether the suite's part for a regime holds a `compare` table (DeepSeek-V3's does not)."""
    return path.is_file() and bool(json.loads(path.read_text(encoding="utf-8")).get("compare"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated regime keys")
    parser.add_argument("--check", help="a regime whose fixed-0.2 point is re-planned against the saved one")
    parser.add_argument("--shares", default="1,0", help="policy.backtest_copy_share values to run")
    parser.add_argument("--whole", type=Path, help="an instance: CoMoE on its whole trace, as it is set")
    parser.add_argument("--weight", type=float, help="--whole: a fixed policy.migration_weight instead")
    parser.add_argument("--collect", action="store_true", help="only the table, from the results present")
    args = parser.parse_args(argv)
    if args.whole:
        fixed = {} if args.weight is None else {"policy.migration_weight": args.weight}
        whole = whole_trace(args.whole, fixed)
        name = f"{args.whole.stem}-whole" + ("" if args.weight is None else f"-fixed-{args.weight:g}")
        (OUT / f"{name}.json").write_text(json.dumps(whole, indent=1) + "\n", encoding="utf-8")
        print(json.dumps({k: v for k, v in whole.items() if k != "weights"}))
        return 0
    suite = [r.key for r in REGIMES if _compared(PARTS / f"{slug(r.key)}.json")]
    keys = args.only.split(",") if args.only else suite
    OUT.mkdir(parents=True, exist_ok=True)
    results = []
    for key in keys:
        path = OUT / f"{slug(key)}.json"
        if args.collect:
            if path.is_file():
                results.append(json.loads(path.read_text(encoding="utf-8")))
            continue
        result = run_regime(key, tuple(float(x) for x in args.shares.split(",")), path)
        path.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        results.append(result)
    if args.check:
        checked = check(args.check)
        (OUT / "check.json").write_text(json.dumps(checked, indent=1) + "\n", encoding="utf-8")
        print("check", checked, flush=True)
    print("\n".join(table(results)))
    loads = [
        f"{r['key']} share {k.split()[1]}: {r[k]['load']:.1f} ({r[k]['plan_s']:.0f} s planning)"
        for r in results
        for k in sorted(r)
        if k.startswith("share ")
    ]
    print("\nLoad average (2 cores) when each run began, and its planning seconds: " + "; ".join(loads) + ".")
    print(describe())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
