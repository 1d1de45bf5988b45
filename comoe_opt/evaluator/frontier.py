"""The copies–balance frontier (`compare --frontier`): CoMoE over `policy.migration_weight` and the
drop-in over `move_cost`, each point's P95 against its copies per re-plan, and which peers a
CoMoE point beats at equal copies. Every point is a replay (`comoe_opt/replay/`) scored as
`compare` scores its rows."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from comoe_opt.evaluator.compare import LIMITS, ROUTINGS, CompareSettings, checked_steps
from comoe_opt.instance import Instance, with_overrides
from comoe_opt.replay import DropIn, EplbLayout, Rolling, Run, replay
from comoe_opt.trace.batching import windows

# policy.migration_weight values swept: the planner's price of a copied page against balance, from
# free copies (0) to five times the planner's own default (1.0); the instance's own value is added.
MIGRATION_WEIGHTS = (0.0, 0.01, 0.03, 0.1, 0.3, 1.0, 5.0)
# the drop-in's move_cost values swept (per-step max/mean per moved expert): free, and 1/4x-8x its
# default of 0.002 (balancers/dropin/rebalance.py MOVE_COST)
MOVE_COSTS = (0.0, 0.0005, 0.002, 0.008, 0.016)
# moves the drop-in scores per layer and call: a work limit in place of its time budget, so that the
# frontier is the same on any machine and load (a pass over 136 slots scores ~18,500 moves)
DROPIN_MOVES = 20_000


@dataclass(frozen=True)
class FrontierPoint:
    """A planner at one setting: mean copies per re-plan and P95 imbalance under its best routing."""

    planner: str  # "comoe", "drop-in even", "drop-in lp", or a peer's name
    knob: str  # the swept setting ("migration_weight", "move_cost"), "" for a peer
    value: float | None
    copies: float
    p95: float
    routing: str

    def dominates(self, other: FrontierPoint) -> bool:
        """No more copies and no higher P95 (the issue's "beaten at equal copies")."""
        return self.copies <= other.copies and self.p95 <= other.p95


def pareto(points: Sequence[FrontierPoint]) -> list[FrontierPoint]:
    """The points no other point beats on both copies and P95 (strictly on one), by copies."""
    front: list[FrontierPoint] = []
    for point in sorted(points, key=lambda p: (p.copies, p.p95)):
        if not front or point.p95 < front[-1].p95:
            front.append(point)
    return front


def beaten_by(peer: FrontierPoint, curve: Sequence[FrontierPoint]) -> FrontierPoint | None:
    """The curve's point with the fewest copies that has no more copies and no higher P95 than
    `peer`, or None: the peer is not beaten at equal copies."""
    winners = [p for p in curve if p.dominates(peer)]
    return min(winners, key=lambda p: (p.copies, p.p95)) if winners else None


def frontier_at(curve: Sequence[FrontierPoint], copies: float) -> float | None:
    """The curve's best P95 with no more than `copies` copies per re-plan (None: no such point)."""
    within = [p.p95 for p in curve if p.copies <= copies]
    return min(within) if within else None


def best_point(
    planner: str,
    knob: str,
    value: float | None,
    steps: np.ndarray,
    run: Run,
    routings: Sequence[str] = ROUTINGS,
) -> FrontierPoint:
    """The run's point under its best routing of `routings` (lowest P95)."""
    p95 = {routing: float(np.percentile(run.served(steps, routing).imbalance, 95)) for routing in routings}
    routing = min(p95, key=lambda r: (p95[r], ROUTINGS.index(r)))
    return FrontierPoint(planner, knob, value, run.copies_per_replan(), p95[routing], routing)


def peer_points(result: dict[str, Any]) -> list[FrontierPoint]:
    """Each planning peer's point from `compare`'s rows: its best routing (the limits left out)."""
    best: dict[str, dict[str, Any]] = {}
    for row in result["rows"]:
        if "copies_per_replan" not in row or row["peer"] in LIMITS:
            continue
        kept = best.get(row["peer"])
        if kept is None or row["p95"] < kept["p95"]:
            best[row["peer"]] = row
    return [
        FrontierPoint(p, "", None, r["copies_per_replan"], r["p95"], r["routing"]) for p, r in best.items()
    ]


def frontier(
    instance: Instance,
    steps: np.ndarray,
    settings: CompareSettings,
    peers: Sequence[FrontierPoint] = (),
    weights: Sequence[float] = MIGRATION_WEIGHTS,
    move_costs: Sequence[float] = MOVE_COSTS,
    dispatches: Sequence[Literal["even", "lp"]] = ("even", "lp"),
) -> dict[str, Any]:
    """CoMoE over `policy.migration_weight` and the drop-in over `move_cost` (each dispatch), each
    point's P95 against its copies per re-plan, and which peers a CoMoE point beats at equal copies.
    `peers`: the peers' points (`peer_points` of a `compare` result); planned here if empty."""
    steps = checked_steps(instance, steps, settings.steps)
    spans = windows(steps.shape[0], instance.policy.window_batches)
    history = instance.policy.history_windows
    if not peers:
        others = [p for p in settings.peers if p != "comoe"]
        peers = [
            best_point(p, "", None, steps, replay(Rolling(instance, p), steps, spans, history))
            for p in others
        ]
    default = instance.policy.migration_weight
    comoe = []
    for weight in sorted({*weights, default}):
        priced = with_overrides(instance, {"policy.migration_weight": weight}, "--frontier")
        run = replay(Rolling(priced, "comoe"), steps, spans, history)
        comoe.append(best_point("comoe", "migration_weight", weight, steps, run))
    layout = EplbLayout.of(instance, steps, "the drop-in")
    dropin = [
        dropin_point(layout, steps, spans, history, cost, dispatch)
        for dispatch in dispatches
        for cost in move_costs
    ]
    curve = pareto(comoe)
    default_point = next(p for p in comoe if p.value == default)
    at_default = frontier_at(curve, default_point.copies)
    return {
        "instance": instance.name,
        "steps": int(steps.shape[0]),
        "comoe": [dataclasses.asdict(p) for p in comoe],
        "dropin": [dataclasses.asdict(p) for p in dropin],
        "peers": [dataclasses.asdict(p) for p in peers],
        "curve": [dataclasses.asdict(p) for p in curve],
        "beaten": {p.planner: _asdict_or_none(beaten_by(p, curve)) for p in [*peers, *dropin]},
        "default": dataclasses.asdict(default_point),
        "default_to_frontier": default_point.p95 / at_default - 1.0 if at_default else None,
    }


def _asdict_or_none(point: FrontierPoint | None) -> dict[str, Any] | None:
    return None if point is None else dataclasses.asdict(point)


def dropin_point(
    layout: EplbLayout,
    steps: np.ndarray,
    spans: list[tuple[int, int]],
    history_windows: int,
    move_cost: float,
    dispatch: Literal["even", "lp"],
) -> FrontierPoint:
    """The drop-in `rebalance_experts` replayed as compare's peers are (the map in service as
    `previous`), on `DROPIN_MOVES` moves per layer, scored under the dispatch it plans for."""
    planner = DropIn(layout, dispatch, (("move_cost", move_cost), ("moves", DROPIN_MOVES)))
    run = replay(planner, steps, spans, history_windows)
    return best_point(planner.name, "move_cost", move_cost, steps, run, routings=(dispatch,))


def frontier_markdown(result: dict[str, Any]) -> str:
    """The sweep's points, the Pareto curve, and each peer beaten or not at equal copies."""
    lines = [
        f"{result['instance']}: P95 imbalance (best routing) against copies per re-plan,"
        f" {result['steps']} steps.",
        "",
        "| planner | setting | copies / re-plan | P95 | routing | on the CoMoE frontier |",
        "|---|---|---:|---:|---|---|",
    ]
    on_curve = {(p["copies"], p["p95"]) for p in result["curve"]}
    for p in [*result["comoe"], *result["dropin"], *result["peers"]]:
        setting = _setting(p)
        mark = "yes" if p["planner"] == "comoe" and (p["copies"], p["p95"]) in on_curve else ""
        lines.append(
            f"| {p['planner']} | {setting} | {p['copies']:.1f} | {p['p95']:.3f} | {p['routing']} | {mark} |"
        )
    lines += ["", "Beaten at equal copies (a CoMoE point with no more copies and no higher P95):", ""]
    for name, winner in result["beaten"].items():
        if winner is None:
            lines.append(f"- {name}: **not beaten**")
        else:
            lines.append(
                f"- {name}: beaten by migration_weight {winner['value']:g}"
                f" ({winner['copies']:.1f} copies, P95 {winner['p95']:.3f})"
            )
    gap = result["default_to_frontier"]
    d = result["default"]
    lines.append(
        f"- CoMoE's default ({_setting(d)}: {d['copies']:.1f} copies, P95 {d['p95']:.3f})"
        + (f" is {100 * gap:.2f}% above the frontier at its copies (target 1%)" if gap is not None else "")
    )
    return "\n".join(lines)


def _setting(point: dict[str, Any]) -> str:
    if not point["knob"]:
        return "default"
    auto = point["knob"] == "migration_weight" and point["value"] < 0
    return f"{point['knob']} {point['value']:g}" + (" (chosen by backtest)" if auto else "")
