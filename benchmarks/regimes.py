"""The regime suite: every regime's own statistics, `compare`'s table, the drop-in replay and the
copies–balance frontier, per regime, with the issue's targets marked met or missed.

Regimes are the instances in `instances/regimes/` (synthetic, each calibrated to a trace's measured
figures; the calibrated constants say which) and the real GPT-OSS-20B trace
(`instances/real-gptoss20b.toml`). Each run is bounded (the first `steps` steps of each regime) so
that the suite ends in well under an hour on two shared cores.

    .venv/bin/python benchmarks/regimes.py [--suite scale] [--only A,B] [--no-frontier] [--steps N]

`--suite scale` runs the scale suite (instances/scale/: 16-144 GPUs, 128-384 experts) into
results/regimes-scale.md, its parts in results/regimes-scale/ and its drop-in replay in
results/regimes-scale-dropin.md.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import (
    PORT,
    RESULTS,
    ROOT,
    SUITES,
    Regime,
    describe,
    dropin_planners,
    dropin_runs,
    dropin_table,
    p95,
    script_args,
    slug,
)

from comoe_opt.evaluator import compare as cmp
from comoe_opt.evaluator import frontier as front_
from comoe_opt.instance import Instance, load_instance
from comoe_opt.replay import FORESIGHTS, Run
from comoe_opt.stats import trace_stats, window_alpha
from comoe_opt.trace import Trace, instance_batches, load_trace
from comoe_opt.trace.batching import MicroBatches, step_counts
from comoe_opt.trace.source import batched_part

# ---- the regime's own statistics


def regime_stats(instance: Instance, trace: Trace, batches: MicroBatches) -> dict[str, Any]:
    """Statistics of the tokens the run uses (the project's `trace_stats`)."""
    layers = trace_stats(batched_part(trace, batches)).layers
    degenerate = layers["hottest_share"].to_numpy() > 0.9
    normal = layers[~degenerate]
    steps = step_counts(batches)
    return {
        "steps": int(batches.batches),
        "selections_per_expert_step": float(steps.mean()),
        "idle_share": float((steps == 0).mean()),  # (step, layer, expert) cells with no selection
        "alpha": [float(normal["alpha"].min()), float(normal["alpha"].max()), float(normal["alpha"].mean())],
        "alpha_top1_mean": float(normal["alpha_top1"].mean()),
        "hottest": [float(normal["hottest_share"].min()), float(normal["hottest_share"].max())],
        "degenerate_layers": int(degenerate.sum()),
        "degenerate_share": float(layers["hottest_share"].max()) if degenerate.any() else None,
        "predictability": float(layers["predictability"].mean()),
        "popularity_guess": float(layers["popularity_guess"].mean()),
        **window_alpha(batches.experts, batches.num_experts, instance.policy.window_batches),
    }


def stats_lines(s: dict[str, Any], target: str) -> list[str]:
    a = s["alpha"]
    deg = (
        f"; {s['degenerate_layers']} degenerate layer(s), hottest share {s['degenerate_share']:.4f}"
        if s["degenerate_layers"]
        else ""
    )
    return [
        f"- target: {target}",
        f"- measured ({s['steps']} steps): {s['selections_per_expert_step']:.2f} selections per expert"
        " per step"
        f" ({100 * s['idle_share']:.0f}% of (step, layer, expert) idle); all-selection alpha"
        f" {a[0]:.2f}-{a[1]:.2f} (mean {a[2]:.2f}), rank-1 alpha {s['alpha_top1_mean']:.2f}, hottest"
        f" {100 * s['hottest'][0]:.1f}-{100 * s['hottest'][1]:.1f}%{deg}; predictability"
        f" {s['predictability']:.3f} vs popularity {s['popularity_guess']:.3f}; within windows alpha"
        f" {s['alpha_window_mean']:.2f}",
    ]


# ---- the drop-in replay


def dropin(instance: Instance, steps: np.ndarray) -> dict[str, Run]:
    """EPLB's port and ours (even, lp) re-planned as the instance's policy re-plans, and each
    planned in hindsight and cross-fitted (the room a prediction has)."""
    runs = dropin_runs(instance, steps, dropin_planners(instance, steps))
    for foresight in FORESIGHTS[1:]:
        planners = {k: v for k, v in dropin_planners(instance, steps).items() if k != PORT}  # timing only
        more = dropin_runs(instance, steps, planners, foresight)
        runs.update({f"{name} ({foresight})": run for name, run in more.items()})
    return runs


def dropin_targets(runs: dict[str, Run], steps: np.ndarray) -> list[str]:
    if not {"EPLB", "ours, even", "ours, lp"} <= set(runs):
        return ["- drop-in: a balancer is missing"]
    even = p95(runs["ours, even"], steps, "even") / p95(runs["EPLB"], steps, "even") - 1
    lp = p95(runs["ours, lp"], steps, "lp") / p95(runs["EPLB"], steps, "lp") - 1
    out = [
        f"- drop-in even: {100 * even:+.1f}% vs EPLB (target -3% or better): {_mark(even <= -0.03)}",
        f"- drop-in lp: {100 * lp:+.1f}% vs EPLB + lp (target -10% or better): {_mark(lp <= -0.10)}",
    ]
    for foresight, what in zip(
        FORESIGHTS[1:], ("the steps it serves", "the window's other steps"), strict=True
    ):
        names = {name: f"{name} ({foresight})" for name in ("EPLB", "ours, even", "ours, lp")}
        if not set(names.values()) <= set(runs):
            continue
        room = {
            (n, split): p95(runs[names[n]], steps, split) / p95(runs["EPLB"], steps, split) - 1
            for n in names
            for split in ("even", "lp")
        }
        out.append(
            f"- room, {foresight} (each planned on {what}, vs EPLB planned on its history):"
            f" even: EPLB {100 * room['EPLB', 'even']:+.1f}%, ours {100 * room['ours, even', 'even']:+.1f}%;"
            f" best split: EPLB {100 * room['EPLB', 'lp']:+.1f}%,"
            f" ours lp {100 * room['ours, lp', 'lp']:+.1f}%"
        )
    port_s = float(np.median(runs[PORT].plan_s))  # the port called directly, as an engine does
    for name in ("ours, even", "ours, lp"):
        copies = runs[name].copies_per_replan() / max(runs["EPLB"].copies_per_replan(), 1e-12)
        slower = float(np.median(runs[name].plan_s)) / port_s
        out.append(
            f"- {name}: copies {copies:.3f} of EPLB's (target 0.1): {_mark(copies <= 0.1)}; median plan time"
            f" {slower:.1f}x the EPLB port (called directly on the same history)"
        )
    return out


# ---- compare and the frontier


def ranked(
    result: dict[str, Any],
) -> tuple[front_.FrontierPoint, list[front_.FrontierPoint], front_.FrontierPoint]:
    """CoMoE's point, the other peers' points and the best of them (lowest P95), from compare's rows."""
    peers = front_.peer_points(result)
    comoe = next(p for p in peers if p.planner == "comoe")
    others = [p for p in peers if p.planner != "comoe"]
    return comoe, others, min(others, key=lambda p: p.p95)


def compare_targets(result: dict[str, Any], front: dict[str, Any] | None) -> list[str]:
    rows = result["rows"]
    comoe, others, best = ranked(result)
    hindsight = next(r["p95"] for r in rows if r["peer"] == "hindsight")
    oracle = next(r["p95"] for r in rows if r["peer"] == "oracle")
    out = [
        f"- CoMoE default: P95 {comoe.p95:.3f} ({comoe.routing}) at {comoe.copies:.1f} copies per re-plan;"
        f" best peer {best.planner} {best.p95:.3f} ({best.routing}) at {best.copies:.1f} copies; hindsight"
        f" {hindsight:.3f}; oracle {oracle:.3f}.",
    ]
    if hindsight < best.p95:
        half = (best.p95 + hindsight) / 2
        out.append(
            f"- half the gap from the best peer to hindsight: at most {half:.3f}:"
            f" {_mark(comoe.p95 <= half + 1e-12)}"
        )
    else:
        half = (best.p95 + oracle) / 2
        out.append(
            f"- hindsight (`exact` on the window's steps) is not below the best peer here: no limit. Half the"
            f" gap to the oracle instead: at most {half:.3f}: {_mark(comoe.p95 <= half + 1e-12)}"
        )
    cross = crossfit_p95(result)
    if cross is not None:
        out.append(
            f"- hindsight cross-fitted (each window's even steps planned for its odd steps and back: the"
            f" window's load known, not the steps it is scored on): {cross:.3f}; CoMoE"
            f" {comoe.p95 - cross:+.3f} from it, hindsight {hindsight - cross:+.3f}"
        )
    out += window_lines(result, comoe, best)
    equal = [p.planner for p in others if comoe.dominates(p)]
    out.append(
        f"- CoMoE's default at or below a peer's P95 with no more copies: {len(equal)} of {len(others)} peers"
        f" ({', '.join(equal) or 'none'})"
    )
    if front is not None:
        names = {p.planner for p in others}
        beaten = [n for n, w in front["beaten"].items() if n in names and w is not None]
        missing = sorted(names - set(beaten))
        out.append(
            f"- CoMoE's frontier at or below every peer's P95 at no more copies: {len(beaten)} of"
            f" {len(names)} peers: {_mark(not missing)}"
            + (f" (not beaten: {', '.join(missing)})" if missing else "")
        )
        gap = front["default_to_frontier"]
        if gap is not None:
            out.append(
                f"- default within 1% of the frontier at its copies: {100 * gap:.2f}%: {_mark(gap <= 0.01)}"
            )
    return out


def window_p95(result: dict[str, Any], window: int) -> dict[str, list[float]]:
    """Each planner/routing's P95 over each scored re-plan window's (step, layer) imbalances (the
    oracle's sampled steps left out)."""
    out = {}
    scored = result["steps"] - result["scored_from"]
    for key, ratio in result["imbalance"].items():
        per_step = np.asarray(ratio).reshape(ratio.shape[0], -1)
        if per_step.shape[0] != scored:
            continue
        out[key] = [
            float(np.percentile(per_step[i : i + window], 95)) for i in range(0, len(per_step), window)
        ]
    return out


def window_lines(
    result: dict[str, Any], comoe: front_.FrontierPoint, best: front_.FrontierPoint
) -> list[str]:
    """Where the gap lives: P95 per window of CoMoE, the best peer and hindsight."""
    per = result.get("window_p95")
    if not per:
        return []
    keys = {
        "CoMoE": f"comoe/{comoe.routing}",
        best.planner: f"{best.planner}/{best.routing}",
        "hindsight": "hindsight/flow",
        "cross-fitted": f"{cmp.CROSSFIT}/flow",
    }
    cells = "; ".join(
        f"{name} " + " ".join(f"{v:.3f}" for v in per[key]) for name, key in keys.items() if key in per
    )
    return [f"- P95 per re-plan window: {cells}"]


def crossfit_p95(result: dict[str, Any]) -> float | None:
    return next((r["p95"] for r in result["rows"] if r["peer"] == cmp.CROSSFIT), None)


def summary_row(key: str, result: dict[str, Any], front: dict[str, Any] | None) -> str:
    """One regime's line of the suite's summary: the targets of `compare_targets`, in figures."""
    comoe, others, best = ranked(result)
    hindsight = next(r["p95"] for r in result["rows"] if r["peer"] == "hindsight")
    limit = (best.p95 + hindsight) / 2
    half = f"{limit:.3f}: {_mark(comoe.p95 <= limit + 1e-12)}" if hindsight < best.p95 else "–"
    beaten = sum(comoe.dominates(p) for p in others)
    cross = crossfit_p95(result)
    gap = front["default_to_frontier"] if front is not None else None
    near = "not swept" if gap is None else f"{100 * gap:.2f}%: {_mark(gap <= 0.01)}"
    return (
        f"| {key} | {best.planner} {best.p95:.3f} ({best.copies:.1f}) | {comoe.p95:.3f} ({comoe.copies:.1f})"
        f" | {beaten} of {len(others)} | {hindsight:.3f} | {'–' if cross is None else f'{cross:.3f}'}"
        f" | {half} | {near} |"
    )


def summary(parts: Path, regimes: tuple[Regime, ...]) -> list[str]:
    """The suite's targets per regime, from the parts present (compared regimes only)."""
    rows = []
    for regime in regimes:
        path = parts / f"{slug(regime.key)}.json"
        raw = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        if raw.get("compare"):
            rows.append(summary_row(regime.key, raw["compare"], raw.get("frontier")))
    return [
        "P95 of per-(step, layer) max/mean device load under each planner's best routing; copies per"
        " re-plan in brackets; CoMoE at the instance's default. Peers beaten: peers whose P95 the"
        " default is at or below with no more copies. Half the gap: at most the best peer's P95 minus"
        " half its gap to hindsight (– where hindsight, `exact` on the window's own steps, is not below"
        " the best peer). Cross-fitted: hindsight planned on each window's other steps (its even steps"
        " for its odd ones and back), what knowing the window's load without its step-to-step noise"
        " reaches. Frontier: the default's P95 above the CoMoE frontier's best at no more copies"
        " (target 1%).",
        "",
        "| regime | best peer: P95 (copies) | CoMoE default: P95 (copies) | peers beaten at no more copies"
        " | hindsight | cross-fitted | half the gap to hindsight | default vs frontier |",
        "|---|---|---|---|---:|---:|---|---|",
        *rows,
        "",
        "Every regime is compared, DeepSeek-V3's 32 GPUs included: past 12 devices the lp and flow"
        " routings and the drop-in's lp scores take each step's bottleneck device set by parametric min"
        " cut (best_split/min_cut.py), not from a table of the 2^C sets. Hindsight runs `exact` on work"
        " limits, like every planner here: the same numbers on any machine and load.",
        "",
    ]


def retarget(parts: Path, key: str) -> None:
    """Rewrite a saved part's compare and frontier target lines from its JSON (the drop-in lines kept)."""
    text = (parts / f"{key}.md").read_text(encoding="utf-8")
    raw = json.loads((parts / f"{key}.json").read_text(encoding="utf-8"))
    head, rest = text.split("### Targets\n\n", 1)
    kept = rest[rest.index("- drop-in") :]
    lines = compare_targets(raw["compare"], raw["frontier"])
    (parts / f"{key}.md").write_text(
        head + "### Targets\n\n" + "\n".join(lines) + "\n" + kept, encoding="utf-8"
    )


def _mark(ok: bool) -> str:
    return "met" if ok else "**missed**"


def run_regime(regime: Regime, steps_override: int, with_frontier: bool) -> dict[str, Any]:
    instance, trace = load_trace(load_instance(regime.path))
    batches = instance_batches(instance, trace)
    limit = steps_override or regime.steps
    steps = step_counts(batches)[:limit]
    seconds: dict[str, float] = {}
    began = time.perf_counter()
    stats = regime_stats(instance, trace, batches.window(0, min(limit, batches.batches)))
    seconds["stats"] = time.perf_counter() - began
    # hindsight (and cross-fitted) on work limits: machine-independent
    settings = cmp.CompareSettings(bound_windows=0, crossfit=True)
    began = time.perf_counter()
    result = cmp.compare(instance, steps, settings)
    result["window_p95"] = window_p95(result, instance.policy.window_batches)
    seconds["compare"] = time.perf_counter() - began
    began = time.perf_counter()
    runs = dropin(instance, steps)
    seconds["drop-in"] = time.perf_counter() - began
    front = None
    if with_frontier and regime.frontier:
        began = time.perf_counter()
        front = front_.frontier(
            instance,
            steps,
            settings,
            peers=front_.peer_points(result),
            weights=regime.weights,
            move_costs=SUITE_MOVE_COSTS,
        )
        seconds["frontier"] = time.perf_counter() - began
    lines = [
        f"## {regime.key}: `{regime.path.relative_to(ROOT)}`",
        "",
        *stats_lines(stats, regime.target),
        "",
        "### Targets",
        "",
        *compare_targets(result, front),
        *dropin_targets(runs, steps),
        "",
        "### compare",
        "",
        cmp.markdown(result),
        "",
        dropin_heading(instance),
        "",
        *dropin_table(runs, steps),
        "",
    ]
    if front is not None:
        lines += ["### Frontier", "", front_.frontier_markdown(front), ""]
    elif regime.frontier is False:
        lines += [
            "### Frontier",
            "",
            "Not swept for this regime in the suite (bounded time; `compare --frontier` sweeps it).",
            "",
        ]
    lines.append("Seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in seconds.items()) + ".")
    compact = {k: v for k, v in result.items() if k != "imbalance"}
    return {
        "key": regime.key,
        "stats": stats,
        "compare": compact,
        "frontier": front,
        "text": "\n".join(lines),
    }


# The drop-in's move cost in the suite's frontier: free, its default, 8x its default.
SUITE_MOVE_COSTS = (0.0, 0.002, 0.016)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--suite", choices=sorted(SUITES), default="regimes", help="which suite (default: regimes)"
    )
    parser.add_argument("--only", help="comma-separated regime keys (default: all)")
    parser.add_argument(
        "--steps", type=int, default=0, help="first N steps of every regime (0: each its own)"
    )
    parser.add_argument("--no-frontier", action="store_true")
    parser.add_argument("--collect", action="store_true", help="only rebuild the output from the parts")
    parser.add_argument(
        "--dropin-only",
        action="store_true",
        help="only the drop-in replay (to results/regimes-dropin.md and into the saved parts)",
    )
    script_args(parser, RESULTS / "regimes.md")
    args = parser.parse_args(argv)
    regimes, name = SUITES[args.suite], "regimes" if args.suite == "regimes" else f"regimes-{args.suite}"
    if args.output == RESULTS / "regimes.md":
        args.output = RESULTS / f"{name}.md"
    parts = RESULTS / name
    if args.smoke:  # one small regime, a few steps, no frontier, its part beside the output
        args.only, args.steps, args.no_frontier = "C", 12, True
        parts = args.output.parent / "regimes-parts"
    if args.collect:
        for part in sorted(parts.glob("*.json")):
            if json.loads(part.read_text(encoding="utf-8"))["compare"] is not None:
                retarget(parts, part.stem)
        collect(args.output, parts, regimes)
        return 0
    chosen = [r for r in regimes if not args.only or r.key in args.only.split(",")]
    if args.dropin_only:
        notes = DROPIN_NOTES if args.suite == "regimes" else []
        return dropin_only(chosen, args.steps, RESULTS / f"{name}-dropin.md", parts, notes)
    parts.mkdir(parents=True, exist_ok=True)
    for regime in chosen:
        print(f"--- {regime.key}", flush=True)
        load_before, began = os.getloadavg()[0], time.perf_counter()
        out = run_regime(regime, args.steps, not args.no_frontier)
        note = (
            f"Load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after;"
            f" {(time.perf_counter() - began) / 60:.0f} min."
        )
        text = out["text"] + " " + note + "\n"
        print(text, flush=True)
        (parts / f"{slug(regime.key)}.md").write_text(text, encoding="utf-8")
        raw = {k: v for k, v in out.items() if k != "text"}
        (parts / f"{slug(regime.key)}.json").write_text(
            json.dumps(raw, indent=1, default=float), encoding="utf-8"
        )
    collect(args.output, parts, regimes)
    return 0


# earlier versions of the drop-in measured with this script on the same steps (numbers from those
# runs), kept beside the run's tables
DROPIN_NOTES = [*(RESULTS / "regimes-dropin-notes.md").read_text().splitlines(), ""]


def dropin_only(
    chosen: list[Regime], steps_override: int, output: Path, parts: Path, notes: list[str]
) -> int:
    """The drop-in replay alone for each regime: its targets and table, one file."""
    lines = [
        "# The drop-in replay on the regime suite",
        "",
        "`benchmarks/regimes.py --dropin-only`: per regime, EPLB's port and ours (even, lp) re-planned"
        " as the instance's policy re-plans, on the first steps the suite runs (the same steps as"
        " benchmarks/results/regimes.md).",
        "",
    ]
    for regime in chosen:
        print(f"--- {regime.key}", flush=True)
        load_before, began = os.getloadavg()[0], time.perf_counter()
        instance, trace = load_trace(load_instance(regime.path))
        steps = step_counts(instance_batches(instance, trace))[: steps_override or regime.steps]
        runs = dropin(instance, steps)
        part = [
            f"## {regime.key}: `{regime.path.relative_to(ROOT)}`, {steps.shape[0]} steps;"
            f" {_replans(instance)}",
            "",
            *dropin_targets(runs, steps),
            "",
            *dropin_table(runs, steps),
            "",
            f"Load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after;"
            f" {time.perf_counter() - began:.0f} s.",
            "",
        ]
        print("\n".join(part), flush=True)
        lines += part
        splice_dropin(parts / f"{slug(regime.key)}.md", runs, steps, instance)
    lines += notes
    lines.append(describe() + " Two cores shared with other jobs: seconds are inflated; ratios count.")
    output.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return 0


def _replans(instance: Instance) -> str:
    policy = instance.policy
    return (
        f"every {policy.window_batches} steps on the last {policy.window_batches * policy.history_windows};"
        f" {instance.hardware.chiplets} GPUs"
    )


def dropin_heading(instance: Instance) -> str:
    return f"### Drop-in replay ({_replans(instance)})"


def splice_dropin(path: Path, runs: dict[str, Run], steps: np.ndarray, instance: Instance) -> None:
    """Replace a saved part's drop-in target lines and table with a new replay's (the rest kept)."""
    if not path.is_file() or "### Drop-in replay" not in path.read_text(encoding="utf-8"):
        return
    text = path.read_text(encoding="utf-8")
    first, end = text.index("- drop-in"), text.index("\n\n### compare")
    text = text[:first] + "\n".join(dropin_targets(runs, steps)) + text[end:]
    start = text.index("### Drop-in replay")
    stop = min(i for i in (text.find("\n### ", start), text.find("\nSeconds:", start)) if i >= 0)
    table = "\n".join([dropin_heading(instance), "", *dropin_table(runs, steps), ""])
    path.write_text(text[:start] + table + text[stop:], encoding="utf-8")


def collect(output: Path, parts_dir: Path, regimes: tuple[Regime, ...]) -> None:
    """regimes.md from the regimes' parts present, in suite order."""
    head = [
        "# The regime suite",
        "",
        "Per regime: its own statistics (measured by `trace_stats` on the steps run, beside the figures"
        " it is calibrated to), the issue's targets marked met or missed, `compare`'s table (every peer"
        " under every routing, the oracle, hindsight and hindsight cross-fitted; no milp bound; each"
        " window's P95 in the targets), the drop-in replay against the EPLB port (and each planned in"
        " hindsight and cross-fitted: the room a prediction has), and the copies–balance frontier"
        " (CoMoE over `policy.migration_weight`,"
        " the values in each regime's table and the instance's default, -1, the weight chosen per"
        " window by backtest; the drop-in over `move_cost`"
        f" {', '.join(map(str, SUITE_MOVE_COSTS))}). `benchmarks/regimes.py`; each regime's part is in"
        " `benchmarks/results/regimes/`.",
        "",
        describe() + " Two cores shared with other jobs (load averages per regime below): seconds are"
        " inflated; ratios within one run count.",
        "",
    ]
    parts = [parts_dir / f"{slug(r.key)}.md" for r in regimes]
    body = [p.read_text(encoding="utf-8") for p in parts if p.is_file()]
    output.write_text("\n".join(head + summary(parts_dir, regimes) + body), encoding="utf-8")


if __name__ == "__main__":
    raise SystemExit(main())
