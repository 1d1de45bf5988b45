"""`compare` judged by modelled MoE time (formulations/serving-time.md) on the regime suites: per
regime and dispatch, the balancer of least net time over a re-plan interval, whether token P95
would have named another, whether re-balancing pays against the static plan, and whether CoMoE's
layer P95 is at or below every peer that copies at least as much.

    .venv/bin/python benchmarks/studies/time_yardstick.py [--suite regimes|scale] [--only A,B]
        [--steps N] [--replan-every 3000] [--jobs 2] [--balance tokens|work|auto]

`--balance` overrides every regime's `policy.balance` (what CoMoE's slow loop balances), so that
the modes can be compared on the same suite.

Each regime runs on its suite's bounded steps (`--steps` caps them), compare's peers, no bound
windows (the bound is not what this measures); plans are work-limited, so the table is the same on
any machine.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common

import argparse
import json
from typing import Any

from _common import RESULTS, SUITES, describe, slug

from comoe_opt.evaluator.compare import STATIC, CompareSettings, compare
from comoe_opt.instance import load_instance, with_overrides
from comoe_opt.trace.source import instance_step_counts

DISPATCHES = ("even", "lp")
OURS = "comoe"


def run_regime(path: Path, steps: int, every: int, jobs: int, balance: str | None = None) -> dict[str, Any]:
    instance = load_instance(path)
    if balance is not None:
        instance = with_overrides(instance, {"policy.balance": balance}, "--balance")
    counts = instance_step_counts(instance)[:steps]
    settings = CompareSettings(bound_windows=0, jobs=jobs, replan_every=every)
    return compare(instance, counts, settings)


def verdicts(result: dict[str, Any], dispatch: str) -> dict[str, Any]:
    """What the table says under `dispatch`."""
    rows = [r for r in result["rows"] if r["routing"] == dispatch and r.get("net_ms_per_replan") is not None]
    planners = [r for r in rows if r["peer"] != STATIC]
    by_time = max(planners, key=lambda r: (r["net_ms_per_replan"], r["peer"] == OURS))
    by_tokens = min(planners, key=lambda r: (r["p95"], r["peer"]))
    static = next(r for r in rows if r["peer"] == STATIC)
    ours = next(r for r in planners if r["peer"] == OURS)
    peers = [r for r in planners if r["peer"] != OURS and r["copies_per_replan"] >= ours["copies_per_replan"]]
    beaten = [r["peer"] for r in peers if r["layer_ms_p95"] < ours["layer_ms_p95"] * (1 - 1e-9)]
    best = min(peers, key=lambda r: (r["p95"], r["peer"]), default=None)
    return {
        "tokens_vs_best": None if best is None else (ours["p95"] / best["p95"] - 1, best),
        "by_time": by_time["peer"],
        "by_tokens": by_tokens["peer"],
        "pays_ms": by_time["net_ms_per_replan"] - static["net_ms_per_replan"],
        "ours": ours,
        "eplb": next(r for r in planners if r["peer"] == "eplb"),
        "peers_copying_more": [r["peer"] for r in peers],
        "below_ours": beaten,
    }


def lines_of(key: str, result: dict[str, Any], every: int) -> list[str]:
    out = []
    for dispatch in DISPATCHES:
        v = verdicts(result, dispatch)
        ours, eplb = v["ours"], v["eplb"]
        out.append(
            f"| {key} | {dispatch} | {v['by_time']} | {v['by_tokens']} | {v['pays_ms']:+,.1f}"
            f" | {ours['layer_ms_p95']:.4g} | {eplb['layer_ms_p95']:.4g} | {ours['net_ms_per_replan']:+,.1f}"
            f" | {ours['copies_per_replan']:,.0f} | {', '.join(v['peers_copying_more']) or '–'}"
            f" | {', '.join(v['below_ours']) or 'none'} | {_tokens_cell(v['tokens_vs_best'], ours)} |"
        )
    return out


def _tokens_cell(versus: tuple[float, dict[str, Any]] | None, ours: dict[str, Any]) -> str:
    """CoMoE's token P95 against the lowest of the peers copying at least as much."""
    if versus is None:
        return "–"
    change, peer = versus
    return f"{ours['p95']:.4f} vs {peer['peer']} {peer['p95']:.4f} ({100 * change:+.2f}%)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", choices=tuple(SUITES), default="regimes")
    parser.add_argument("--only", help="regime keys, comma-separated")
    parser.add_argument("--steps", type=int, default=0, help="cap each regime's steps (0: the suite's)")
    parser.add_argument("--replan-every", type=int, default=3000)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--balance", choices=("tokens", "work", "auto"), help="override policy.balance")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    wanted = None if args.only is None else set(args.only.split(","))
    tag = f"-{args.balance}" if args.balance else ""
    out = args.out or RESULTS / f"time-yardstick-{args.suite}{tag}.md"
    lines = [
        f"# compare by modelled time: the {args.suite} suite",
        "",
        f"Command `.venv/bin/python benchmarks/studies/time_yardstick.py --suite {args.suite}"
        + (f" --only {args.only}" if args.only else "")
        + (f" --steps {args.steps}" if args.steps else "")
        + (f" --balance {args.balance}" if args.balance else "")
        + f"` ({describe()}). Re-plan interval {args.replan_every:,} steps. Per regime and dispatch:"
        " the balancer of least net time (time saved per step against EPLB over the interval, less"
        " its re-plan stall), the one token P95 names, how much re-balancing gains over EPLB's first"
        " plan kept (ms per interval; negative: it does not pay), CoMoE's and EPLB's layer P95 (ms),"
        " CoMoE's net time and copies per re-plan, the peers that copy at least as much as CoMoE, and"
        " those of them whose layer P95 is below CoMoE's, and CoMoE's token P95 against the lowest of"
        " theirs. CoMoE's even-split rows are its plan for the even split (policy.split = even), its lp"
        " rows its plan for the best split.",
        "",
        "| regime | dispatch | least time | least token P95 | re-balancing pays (ms) | CoMoE layer P95"
        " | EPLB layer P95 | CoMoE net (ms) | CoMoE copies | peers copying as much | below CoMoE"
        " | token P95: CoMoE vs best of them |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---|---|---|",
    ]
    chosen: dict[str, str] = {}  # CoMoE's policy.balance per window, per regime
    for regime in SUITES[args.suite]:
        if wanted is not None and regime.key not in wanted:
            continue
        steps = min(regime.steps, args.steps) if args.steps else regime.steps
        print(f"{regime.key}: {steps} steps", file=sys.stderr, flush=True)
        result = run_regime(regime.path, steps, args.replan_every, args.jobs, args.balance)
        lines += lines_of(regime.key, result, args.replan_every)
        modes = (result.get("migration_weight") or {}).get("balance_per_window")
        if modes:
            chosen[regime.key] = " ".join(modes)
        rows = out.with_suffix("")  # every row of each regime's table, as compare --json gives it
        rows.mkdir(exist_ok=True)
        (rows / f"{slug(regime.key)}.json").write_text(json.dumps(result["rows"], indent=1) + "\n")
    if args.balance == "auto":
        lines += ["", "CoMoE's policy.balance per window (the backtest's choice):", ""]
        lines += [f"- {key}: {modes}" for key, modes in chosen.items()]
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {out} and {out.with_suffix('')}/", file=sys.stderr)


if __name__ == "__main__":
    main()
