"""The answer after `compare`'s table: the lines a serving engineer acts on.

From the table's own numbers (evaluator/compare.py), nothing re-run:

* per dispatch (the engines' even split, SGLang's `lp`), when the model's size is known: the
  balancer with the least MoE time over the user's re-plan interval (the largest
  `net_ms_per_replan`: layer time saved per step against EPLB times the interval, less the
  re-plan's stall), CoMoE's net time beside it, and whether re-balancing pays at all against
  the static plan (EPLB's first plan kept), by how much;
* per dispatch: the engine balancer with the lowest P95 imbalance, and CoMoE's point under that
  dispatch when it copies no more experts per re-plan;
* with a `--redundant` sweep: the knee, the fewest redundant slots beyond which P95 improves by
  less than `KNEE` (relative), with the memory per GPU it takes;
* the gap of the user's balancer (the first of `--peers` that is not CoMoE) to milp's proven
  lower bound on the planning objective;
* the regime line: whether splitting an expert's tokens over replicas shortens layers at the
  dump's batch size at all (stats/regime.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from comoe_opt.evaluator.compare import STATIC
from comoe_opt.evaluator.sweep import memory
from comoe_opt.stats.regime import Regime

KNEE = 0.01  # relative P95 improvement below which more redundant slots are not worth their memory
OURS = "comoe"
DISPATCHES = {"even": "the even split (vLLM, SGLang static/dynamic)", "lp": "SGLang's lp dispatch"}


def their_balancer(peers: Sequence[str]) -> str | None:
    """The user's balancer: the first peer that is not CoMoE."""
    return next((peer for peer in peers if peer != OURS), None)


def table_answer(
    result: dict[str, Any], theirs: str | None, regime: Regime | None, timed: bool = True
) -> list[str]:
    """The answer's lines for `compare`'s table of peers × routings; led by time when `timed` (the
    model's size is known) and the table has net times."""
    lines = []
    if timed and any(row.get("net_ms_per_replan") is not None for row in result["rows"]):
        lines += [time_line(result["rows"], routing, result["replan_every"]) for routing in DISPATCHES]
    lines += [_best_line(result["rows"], routing) for routing in DISPATCHES]
    lines = [line for line in lines if line]
    gaps = {row["peer"]: row.get("gap_to_bound") for row in result["rows"]}
    lines.append(
        _gap_line(theirs, gaps.get(theirs) if theirs else None, gaps.get(OURS), result["bound"]["windows"])
    )
    lines.append(_regime_line(regime))
    return lines


def sweep_answer(sweep: dict[str, Any], theirs: str | None, unit: str, regime: Regime | None) -> list[str]:
    """The answer's lines for a `--redundant` sweep: by time under each engine dispatch when the
    expert size is known (`unit` "GB"), then by P95 with flow routing per redundant slots."""
    points = sorted(sweep["points"], key=lambda p: p["redundant"])
    lines = []
    if unit == "GB":
        lines += [sweep_time_line(points, routing, sweep["replan_every"]) for routing in DISPATCHES]
    for peer in [p for p in (theirs, OURS) if p is not None and p in sweep["peers"]]:
        lines.append(knee_line(points, peer, unit))
    if theirs is not None and theirs in sweep["peers"]:
        knee = points[knee_index(points, theirs)]
        ours = knee[OURS]["gap_to_bound"] if OURS in sweep["peers"] else None
        lines.append(
            _gap_line(theirs, knee[theirs]["gap_to_bound"], ours, None)
            + f" (at {knee['redundant']} redundant slots)"
        )
    lines.append(_regime_line(regime))
    return lines


def interval_ms(cell: dict[str, Any], every: int) -> float:
    """A timed cell's MoE time over one re-plan interval: `every` steps and the re-plan's stall."""
    return float(cell["step_ms_mean"] * every + cell["migration_ms"])


def sweep_time_line(points: list[dict[str, Any]], routing: str, every: int) -> str:
    """Under `routing`: at each point the balancer of least MoE time over a re-plan interval (its
    steps and its stall); the knee, the first point no later one shortens by `KNEE`; the balancer
    there, and whether re-balancing pays there against the static plan."""
    peers = [k for k in points[0] if isinstance(points[0][k], dict) and routing in points[0][k]]
    planners = [p for p in peers if p != STATIC]
    if not planners:
        return ""
    best = [_least_time(point, planners, routing, every) for point in points]
    totals = [interval_ms(p[b][routing], every) for p, b in zip(points, best, strict=True)]
    i = next(
        (i for i, t in enumerate(totals) if all(later > t * (1 - KNEE) for later in totals[i + 1 :])),
        len(totals) - 1,
    )
    knee, peer = points[i], best[i]
    line = (
        f"{DISPATCHES[routing]}, by time: {peer} at {knee['redundant']} redundant slots"
        f" ({memory(knee)} per GPU), {totals[i] / every:.4g} ms of MoE time per step over a re-plan"
        f" every {every:,} steps"
    )
    line += (
        f" (still {100 * KNEE:g}% shorter or more at the last point: sweep further)"
        if i == len(points) - 1 and len(points) > 1
        else f"; more slots shorten it by less than {100 * KNEE:g}%"
    )
    if STATIC in knee:
        gain = interval_ms(knee[STATIC][routing], every) - totals[i]
        line += _pays(gain, every)
    return line


def _least_time(point: dict[str, Any], peers: list[str], routing: str, every: int) -> str:
    return min(peers, key=lambda peer: (interval_ms(point[peer][routing], every), peer))


def _pays(gain: float, every: int) -> str:
    """Whether re-balancing pays, by `gain` ms per `every` steps over EPLB's first plan kept."""
    if gain > 0:
        return f"; re-balancing pays {gain:,.1f} ms per {every:,} steps over EPLB's first plan kept"
    return f"; re-balancing does not pay: EPLB's first plan kept is {-gain:,.1f} ms ahead per {every:,} steps"


def knee_index(points: list[dict[str, Any]], peer: str) -> int:
    """The first point beyond which no point improves the peer's P95 by `KNEE` or more."""
    p95 = [p[peer]["p95"] for p in points]
    for i, value in enumerate(p95):
        if all(later > value * (1 - KNEE) for later in p95[i + 1 :]):
            return i
    return len(p95) - 1


def knee_line(points: list[dict[str, Any]], peer: str, unit: str) -> str:
    i = knee_index(points, peer)
    knee = points[i]
    size = _memory(knee, unit)
    if i == len(points) - 1 and len(points) > 1:  # the last point still gained KNEE or more
        return (
            f"redundant slots, {peer}: P95 {knee[peer]['p95']:.3f} at {knee['redundant']} ({size}) still"
            f" improves by {100 * KNEE:g}% or more on the last step: sweep further"
        )
    return (
        f"redundant slots, {peer}: {knee['redundant']} ({size}), P95 {knee[peer]['p95']:.3f}; more improve"
        f" P95 by less than {100 * KNEE:g}%"
    )


def _memory(point: dict[str, Any], unit: str) -> str:
    if unit == "GB":
        return f"{point['gb_per_device']:.3f} GB per GPU"
    return f"{point['slots_per_device']} slots per GPU; give --model or --expert-mb for GB"


def time_line(rows: list[dict[str, Any]], routing: str, every: int) -> str:
    """Under `routing`: the balancer of least time over a re-plan interval of `every` steps, CoMoE's
    net time, and whether re-balancing pays against the static plan."""
    timed = [r for r in rows if r["routing"] == routing and r.get("net_ms_per_replan") is not None]
    planners = [r for r in timed if r["peer"] != STATIC]
    if not planners:
        return ""
    best = max(planners, key=lambda r: (r["net_ms_per_replan"], r["peer"] == OURS, r["peer"]))
    line = (
        f"{DISPATCHES[routing]}, by time: least MoE time over a re-plan every {every:,} steps:"
        f" {best['peer']}, {best['net_ms_per_replan']:+,.1f} ms per re-plan against EPLB (layer P95"
        f" {best['layer_ms_p95']:.4g} ms, stall {best['migration_ms']:,.1f} ms)"
    )
    ours = next((r for r in planners if r["peer"] == OURS), None)
    if ours is not None and ours is not best:
        line += f"; CoMoE {ours['net_ms_per_replan']:+,.1f} ms (layer P95 {ours['layer_ms_p95']:.4g} ms)"
    static = next((r for r in timed if r["peer"] == STATIC), None)
    if static is None:
        return line
    return line + _pays(best["net_ms_per_replan"] - static["net_ms_per_replan"], every)


def _best_line(rows: list[dict[str, Any]], routing: str) -> str:
    engines = [
        r
        for r in rows
        if r["routing"] == routing and r["peer"] not in (OURS, STATIC) and "copies_per_replan" in r
    ]
    if not engines:
        return ""
    best = min(engines, key=lambda r: (r["p95"], r["peer"]))
    line = (
        f"{DISPATCHES[routing]}, by token imbalance: best balancer {best['peer']}, P95 {best['p95']:.3f} at"
        f" {best['copies_per_replan']:.1f} copies per re-plan"
    )
    ours = next((r for r in rows if r["routing"] == routing and r["peer"] == OURS), None)
    if ours is None:
        return line
    if ours["copies_per_replan"] <= best["copies_per_replan"]:
        return line + (
            f"; CoMoE at no more copies: P95 {ours['p95']:.3f} at {ours['copies_per_replan']:.1f}"
            f" ({_change(ours['p95'], best['p95'])})"
        )
    return line + (
        f"; CoMoE copies more ({ours['copies_per_replan']:.1f} per re-plan, P95 {ours['p95']:.3f}):"
        " no point of it at no more copies in this run"
    )


def _change(value: float, base: float) -> str:
    return f"{100 * (value / base - 1):+.1f}%" if base > 0 else "n/a"


def _gap_line(theirs: str | None, gap: float | None, ours: float | None, windows: Any) -> str:
    if theirs is None:
        return "gap to the proven bound: no engine balancer in --peers"
    if gap is None:
        return f"gap to the proven bound: not computed for {theirs} (no window bounded: --bound-windows 0)"
    where = f" on windows {windows}" if windows is not None else ""
    line = f"gap to the proven bound: {theirs} {100 * gap:.1f}% above milp's lower bound{where}"
    if ours is not None:
        line += f"; CoMoE {100 * ours:.1f}%"
    return line


def _regime_line(regime: Regime | None) -> str:
    if regime is None:
        return "regime: give --model or --expert-mb to know whether re-balancing pays at this batch size"
    verdict = (
        "re-balancing pays: enough loads are compute-bound for splitting them to shorten layers"
        if regime.splitting_pays
        else "re-balancing token counts does not shorten layers at this batch size"
    )
    return f"{verdict} ({regime.summary().split('. ')[0]})"
