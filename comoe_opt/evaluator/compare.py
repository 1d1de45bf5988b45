"""The engines' balancers side by side with CoMoE, the limits and the certified bound (`comoe-opt compare`).

Every peer re-plans each window from the counts of the windows before it, as the rolling horizon
does (`policy.window_batches`, `policy.history_windows`; CoMoE keeps its leases, the engines none),
and each served step is scored with the plan in force, installed at once (re-plan copies are
counted, not timed: `evaluate` times them). Per step and layer a device's load is the tokens it
serves under three routings:

* `even` — an expert's tokens split evenly over its replicas (SGLang `static`/`dynamic`, vLLM,
  vLLM-Ascend), as the evaluator's even split;
* `lp` — SGLang's `lp` dispatch (DeepSeek's LPLB): the LP that minimises the largest device load
  with fractional tokens, whose optimum is the cut condition over device sets
  (`best_split.cut_condition`);
* `flow` — our min-cost flow, whole tokens: its makespan is the LP's optimum rounded up
  (tests/test_compare.py checks this against the flow and HiGHS on random cases).

Two limits: the **oracle** (EPLB planned on each step's own counts, in place at once, optimally
routed) and **hindsight** (per served window, the `exact` model planned on that window's own
steps, on the work limits of an evaluation unless `hindsight_limit_s` is given). The **bound**
is `milp`'s proven lower bound on the planning objective of `bound_windows` windows (balance on
the history's scenarios, every copy free), each peer's plan of those windows scored on it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from comoe_opt.balancers.eplb import deepseek_eplb
from comoe_opt.best_split.cut_condition import layer_makespans
from comoe_opt.errors import ComoeError
from comoe_opt.evaluator.strategies import COMPARE_PEERS
from comoe_opt.instance import Instance, with_overrides
from comoe_opt.planning.backtest import WeightChoice
from comoe_opt.planning.rolling import reproducible_limit, rolling_horizon
from comoe_opt.planning.window import plan_window, steps_demand
from comoe_opt.residency.heuristics import eplb_slots
from comoe_opt.residency.objective import score
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.problem import TERMS, residency_problem
from comoe_opt.residency.solve import solve
from comoe_opt.trace.batching import (
    history_span,
    step_counts,  # noqa: F401  (compare's callers take it from here)
    windows,
)

ROUTINGS = ("even", "lp", "flow")
METHOD = {"comoe": "milp"}  # a peer's slow-loop method, where it differs from its name
ENGINE_TERMS = TERMS - {"prefetch"}  # only CoMoE plans with what prefetch hides, as in evaluate
CROSSFIT = "hindsight-crossfit"  # hindsight knowing each window's load, not the steps it is scored on
LIMITS = ("oracle", "hindsight", CROSSFIT)  # rows that are limits, not planners


@dataclass(frozen=True)
class CompareSettings:
    peers: tuple[str, ...] = COMPARE_PEERS
    steps: int = 0  # the first N steps (0 = all)
    # `exact` per served window, planned on its own steps: seconds, or None for the work limits
    # of an evaluation (residency/exact/schedule.py), so that the numbers do not depend on the machine
    hindsight_limit_s: float | None = None
    # hindsight cross-fitted too (`crossfit_run`): two more `exact` solves per window, on half its steps
    crossfit: bool = False
    bound_windows: int = 8  # windows the milp bound is computed on, spread evenly
    bound_limit_s: float | None = None  # `milp`'s bound: seconds, or None for work limits


@dataclass
class PeerRun:
    """One peer's plans over the trace: a placement per window, its copies and planning time."""

    placements: list[Placement] = field(default_factory=list)
    copies: list[int] = field(default_factory=list)
    plan_s: list[float] = field(default_factory=list)
    weights: list[WeightChoice] = field(default_factory=list)  # the migration weight per window

    def weight_report(self) -> dict[str, Any]:
        """The weight each window was planned with and the backtests that chose them (JSON)."""
        return {
            "per_window": [c.weight for c in self.weights],
            "backtests": [c.to_dict() for c in self.weights if c.chosen_at == c.window],
        }


def compare(instance: Instance, steps: np.ndarray, settings: CompareSettings) -> dict[str, Any]:
    """Rows for every peer × routing and the two limits, the bound's gaps, and per-step imbalance."""
    steps = _checked(instance, steps, settings.steps)
    spans = windows(steps.shape[0], instance.policy.window_batches)
    runs = {peer: plan_peer(instance, steps, spans, peer) for peer in settings.peers}
    rows, imbalance = [], {}
    for peer, run in runs.items():
        for routing in ROUTINGS:
            loads = served_loads(steps, spans, run.placements, routing)
            rows.append(_row(peer, routing, loads, run))
            imbalance[f"{peer}/{routing}"] = per_step_imbalance(loads)
    oracle = oracle_loads(instance, steps)
    rows.append(_row("oracle", "flow", oracle, None))
    imbalance["oracle/flow"] = per_step_imbalance(oracle)
    hindsight = hindsight_run(instance, steps, spans, settings.hindsight_limit_s)
    hind_loads = served_loads(steps, spans, hindsight.placements, "flow")
    rows.append(_row("hindsight", "flow", hind_loads, hindsight))
    imbalance["hindsight/flow"] = per_step_imbalance(hind_loads)
    if settings.crossfit and spans[0][1] - spans[0][0] > 1:  # a one-step window has no other step
        cross_run, cross_loads = crossfit_run(instance, steps, spans, settings.hindsight_limit_s)
        rows.append(_row(CROSSFIT, "flow", cross_loads, cross_run))
        imbalance[f"{CROSSFIT}/flow"] = per_step_imbalance(cross_loads)
    gaps = bound_gaps(instance, steps, spans, runs, settings)
    for row in rows:
        row["gap_to_bound"] = gaps["gaps"].get(row["peer"])
    return {
        "instance": instance.name,
        "steps": int(steps.shape[0]),
        "windows": len(spans),
        "layers": int(steps.shape[1]),
        "experts": int(steps.shape[2]),
        "devices": instance.hardware.chiplets,
        "slots_per_layer": _slots(instance, steps),
        "hindsight_limit_s": settings.hindsight_limit_s,
        "oracle_steps": int(min(steps.shape[0], ORACLE_STEPS)),  # the oracle's steps, spread evenly
        "bound": {k: v for k, v in gaps.items() if k != "gaps"},
        "rows": rows,
        # CoMoE's migration weight per window and, with policy.migration_weight = -1, the backtests
        "migration_weight": runs["comoe"].weight_report() if "comoe" in runs else None,
        "imbalance": imbalance,
    }


def _checked(instance: Instance, steps: np.ndarray, limit: int) -> np.ndarray:
    steps = np.asarray(steps)
    model = instance.model
    if steps.ndim != 3 or steps.shape[1:] != (model.layers, model.experts_per_layer):
        raise ComoeError(
            f"counts are {steps.shape}, the instance needs [steps, {model.layers}, {model.experts_per_layer}]"
        )
    if limit:
        steps = steps[:limit]
    if steps.shape[0] < 2:
        raise ComoeError(f"compare needs at least 2 steps, got {steps.shape[0]}")
    return steps


# what a window is planned on from its steps' counts (kept under compare's name for its callers)
window_demand_of = steps_demand


def plan_peer(instance: Instance, steps: np.ndarray, spans: list[tuple[int, int]], peer: str) -> PeerRun:
    """The peer's plan of every window from the windows before it (the first on itself): the
    rolling horizon's loop on the steps' counts, on the work limits of an evaluation."""
    method = METHOD.get(peer, peer)
    terms = TERMS if peer == "comoe" else ENGINE_TERMS
    plans = rolling_horizon(instance, steps, method, terms=terms, time_limit_s=reproducible_limit(method))
    run = PeerRun()
    began = time.perf_counter()
    for plan in plans:  # each window's time includes its backtest, where one ran
        run.plan_s.append(time.perf_counter() - began)
        run.copies.append(plan.pages_moved)
        run.placements.append(plan.placement)
        run.weights.append(plan.weight)
        began = time.perf_counter()
    if len(run.placements) != len(spans):
        raise ComoeError(f"{peer}: planned {len(run.placements)} windows, the steps make {len(spans)}")
    return run


def served_loads(
    steps: np.ndarray, spans: list[tuple[int, int]], placements: Sequence[Placement], routing: str
) -> np.ndarray:
    """[steps, layers, devices] tokens each device serves, each window under its placement."""
    out = []
    for (start, stop), placement in zip(spans, placements, strict=True):
        out.append(device_loads(steps[start:stop], placement.resident, routing))
    return np.concatenate(out)


def device_loads(counts: np.ndarray, resident: np.ndarray, routing: str) -> np.ndarray:
    """[n, L, C] device loads of counts [n, L, E] under `routing` on replica map [L, E, C]. For
    `lp` and `flow` only the largest load is meaningful (the rest is filled evenly)."""
    layers = counts.shape[1]
    devices = resident.shape[2]
    if routing == "even":
        return np.stack([_even(counts[:, layer], resident[layer]) for layer in range(layers)], axis=1)
    # the LP's optimum (fractional tokens) is the cut condition on unit-speed devices: enumerated
    # sets up to MAX_ENUMERATED_CHIPLETS devices, parametric min cut beyond (layer_makespans)
    unit = np.ones(devices)
    peak = np.stack(
        [layer_makespans(counts[:, layer, :, None] * unit, resident[layer]) for layer in range(layers)],
        axis=1,
    )  # [n, L]
    if routing == "flow":
        peak = np.ceil(peak - 1e-9)  # whole tokens: the flow's optimum (max-flow integrality)
    elif routing != "lp":
        raise ComoeError(f"unknown routing {routing!r} (known: {', '.join(ROUTINGS)})")
    total = counts.sum(axis=2)
    rest = (total - peak) / max(devices - 1, 1)
    loads = np.repeat(rest[:, :, None], devices, axis=2)
    loads[:, :, 0] = peak
    return loads


def _even(counts: np.ndarray, resident: np.ndarray) -> np.ndarray:
    """[n, C]: the i-th of an expert's n tokens to its replica i·r // n (replicas by device)."""
    n = counts.shape[0]
    devices = resident.shape[1]
    replicas = resident.sum(axis=1)  # [E]
    by_device = np.argsort(~resident, axis=1, kind="stable")  # [E, C] each expert's replicas first
    out = np.zeros((n, devices))
    experts = np.arange(resident.shape[0])
    for j in range(devices):
        live = j < replicas
        r = np.maximum(replicas, 1)
        share = (((j + 1) * counts + r - 1) // r) - ((j * counts + r - 1) // r)  # [n, E]
        onto = np.zeros(resident.shape)  # [E, C]: expert e's j-th replica's device
        onto[experts[live], by_device[live, j]] = 1.0
        out += share @ onto
    return out


def per_step_imbalance(loads: np.ndarray) -> np.ndarray:
    """[n, L] largest over mean device load."""
    mean = loads.mean(axis=2)
    return np.where(mean > 0, loads.max(axis=2) / np.where(mean > 0, mean, 1.0), 1.0)


def _row(peer: str, routing: str, loads: np.ndarray, run: PeerRun | None) -> dict[str, Any]:
    ratio = per_step_imbalance(loads)
    peak, mean = loads.max(axis=2), loads.mean(axis=2)
    sglang = float(((mean + 1e-5) / (peak + 1e-5)).mean())  # per layer and step, averaged
    vllm = float((mean.sum(axis=1) / np.maximum(peak.sum(axis=1), 1e-12)).mean())  # Σ mean / Σ max per step
    row: dict[str, Any] = {
        "peer": peer,
        "routing": routing,
        "p50": float(np.percentile(ratio, 50)),
        "p95": float(np.percentile(ratio, 95)),
        "p99": float(np.percentile(ratio, 99)),
        "mean": float(ratio.mean()),
        "balancedness_sglang": sglang,
        "balancedness_vllm": vllm,
    }
    if run is not None:
        row["copies_per_replan"] = float(np.mean(run.copies[1:])) if len(run.copies) > 1 else 0.0
        row["plan_s"] = float(np.mean(run.plan_s))
    return row


def _slots(instance: Instance, steps: np.ndarray) -> int | None:
    problem = residency_problem(instance, window_demand_of(instance, steps[: instance.policy.window_batches]))
    return eplb_slots(problem)


ORACLE_STEPS = 4096  # steps the oracle plans, spread evenly over a longer trace (one EPLB plan per step)


def oracle_steps(steps: np.ndarray) -> np.ndarray:
    """The steps the oracle is scored on: all of them, or `ORACLE_STEPS` spread evenly (its P95 then
    within a few hundredths of a percentile of the whole trace's, at a fixed cost however long the
    trace: a 10^6-step dump spent 530 of 660 s planning one EPLB per step)."""
    if steps.shape[0] <= ORACLE_STEPS:
        return steps
    pick = np.floor((np.arange(ORACLE_STEPS) + 0.5) * steps.shape[0] / ORACLE_STEPS).astype(np.int64)
    return steps[pick]


def oracle_loads(instance: Instance, steps: np.ndarray) -> np.ndarray:
    """EPLB planned on each step's own counts, in place at once, optimally routed (whole tokens),
    on `oracle_steps(steps)`."""
    steps = oracle_steps(steps)
    layout = _SlotLayout.of(instance, steps, "the oracle")
    out = np.empty((steps.shape[0], steps.shape[1], layout.devices))
    for t in range(steps.shape[0]):
        phy2log, _, _ = deepseek_eplb(steps[t], *layout.eplb_args)
        out[t] = device_loads(steps[t : t + 1], layout.resident(phy2log, steps.shape[2]), "flow")[0]
    return out


@dataclass(frozen=True)
class _SlotLayout:
    """EPLB's call for an instance: slots per layer (the same on every device), expert groups and
    nodes (EPLB's global policy where groups do not divide), and each slot's device."""

    slots: int
    groups: int
    nodes: int
    devices: int

    @classmethod
    def of(cls, instance: Instance, steps: np.ndarray, who: str) -> _SlotLayout:
        slots = _slots(instance, steps)
        if slots is None:
            raise ComoeError(f"{who} needs the same slots per device and layer (EPLB's requirement)")
        groups, nodes = instance.model.expert_groups, instance.hardware.nodes
        if steps.shape[2] % groups or groups % nodes:
            groups = nodes = 1  # EPLB's global policy, as the `eplb` heuristic
        return cls(slots, groups, nodes, instance.hardware.chiplets)

    @property
    def eplb_args(self) -> tuple[int, int, int, int]:
        return self.slots, self.groups, self.nodes, self.devices

    def resident(self, phy2log: np.ndarray, experts: int) -> np.ndarray:
        """[L, E, C] replica map of `phy2log` [L, slots]."""
        device = np.arange(self.slots) // (self.slots // self.devices)
        resident = np.zeros((phy2log.shape[0], experts, self.devices), dtype=bool)
        resident[np.arange(phy2log.shape[0])[:, None], phy2log, device[None, :]] = True
        return resident


def hindsight_run(
    instance: Instance, steps: np.ndarray, spans: list[tuple[int, int]], limit_s: float | None
) -> PeerRun:
    """Per served window, `exact` planned on that window's own steps (no copy cost)."""
    run = PeerRun()
    for start, stop in spans:
        began = time.perf_counter()
        placement = _exact_on(instance, steps[start:stop], limit_s, f"steps {start}..{stop - 1}")
        run.plan_s.append(time.perf_counter() - began)
        run.copies.append(0)
        run.placements.append(placement)
    return run


def crossfit_run(
    instance: Instance, steps: np.ndarray, spans: list[tuple[int, int]], limit_s: float | None
) -> tuple[PeerRun, np.ndarray]:
    """Hindsight cross-fitted: per window, `exact` on its even steps serves its odd steps and the
    other way round, so no step is served by a plan that saw it. What knowing each window's load
    (its topics, its hot experts) buys without its step-to-step noise: the part of hindsight's
    lead an online planner could hope to close. A one-step window (a trace's tail) is served by
    the previous window's plan of its odd steps. Loads under the flow routing."""
    run, loads = PeerRun(), np.empty((steps.shape[0], steps.shape[1], instance.hardware.chiplets))
    plans: list[Placement] = []
    for start, stop in spans:
        began = time.perf_counter()
        halves = [np.arange(start + parity, stop, 2) for parity in (0, 1)]
        if halves[1].size:
            plans = [_exact_on(instance, steps[h], limit_s, f"steps {h[0]}..{h[-1]} by twos") for h in halves]
        for half, plan in zip(halves, plans[::-1], strict=True):
            if half.size:
                loads[half] = device_loads(steps[half], plan.resident, "flow")
        run.plan_s.append(time.perf_counter() - began)
        run.copies.append(0)
    return run, loads


def _exact_on(instance: Instance, counts: np.ndarray, limit_s: float | None, what: str) -> Placement:
    """`exact` planned on `counts` themselves (no copy cost): the hindsight limits' plan."""
    limit = reproducible_limit("exact") if limit_s is None else limit_s
    plan = plan_window(instance, window_demand_of(instance, counts), method="exact", time_limit_s=limit)
    if plan.result.solution is None:
        raise ComoeError(f"hindsight: exact found no placement for {what}")
    return plan.result.solution


def bound_gaps(
    instance: Instance,
    steps: np.ndarray,
    spans: list[tuple[int, int]],
    runs: dict[str, PeerRun],
    settings: CompareSettings,
) -> dict[str, Any]:
    """Each peer's mean gap (objective / bound − 1) on the planning objective of sampled windows,
    to `milp`'s proven lower bound of it."""
    chosen = _spread(len(spans), settings.bound_windows)
    gaps: dict[str, list[float]] = {peer: [] for peer in runs}
    bounds = []
    for w in chosen:
        history = history_span(spans, w, instance.policy.history_windows)
        problem = residency_problem(
            instance,
            window_demand_of(instance, steps[history[0] : history[1]]),
            batches=spans[w][1] - spans[w][0],
        )
        limit = reproducible_limit("milp") if settings.bound_limit_s is None else settings.bound_limit_s
        result = solve(problem, "milp", time_limit_s=limit)
        bound = result.bound - problem.constant_ms
        bounds.append(bound)
        for peer, run in runs.items():
            value = score(problem, run.placements[w]).total - problem.constant_ms
            gaps[peer].append(value / bound - 1.0 if bound > 0 else float("nan"))
    return {
        "method": "milp",
        "windows": [int(w) for w in chosen],
        "objective": "scenario balance of the planning window, copies free (residency objective, ms)",
        "bound_ms": [float(b) for b in bounds],
        # None where no window was bounded (--bound-windows 0) or no bound was positive
        "gaps": {peer: _mean_or_none(v) for peer, v in gaps.items()},
    }


def _mean_or_none(values: list[float]) -> float | None:
    finite = [v for v in values if np.isfinite(v)]
    return float(np.mean(finite)) if finite else None


def _percent(gap: float | None) -> str:
    return "–" if gap is None else f"{100 * gap:.1f}%"


def _spread(count: int, wanted: int) -> list[int]:
    if wanted <= 0:
        return []
    if count <= wanted:
        return list(range(count))
    return sorted({int(x) for x in np.linspace(0, count - 1, wanted).round()})


def redundancy_sweep(
    instance: Instance, steps: np.ndarray, redundant: Sequence[int], settings: CompareSettings
) -> dict[str, Any]:
    """For each number of redundant slots per layer: every peer's P95 imbalance with the flow
    routing and its gap to the bound, and the memory each device holds."""
    model, hw = instance.model, instance.hardware
    points = []
    for extra in redundant:
        slots = model.experts_per_layer + extra
        if extra < 0 or slots % hw.chiplets:
            raise ComoeError(
                f"--redundant {extra}: {slots} slots per layer must split evenly over {hw.chiplets} devices"
            )
        per_device = slots // hw.chiplets
        sized = _with_slots(instance, per_device)
        checked = _checked(sized, steps, settings.steps)
        spans = windows(checked.shape[0], sized.policy.window_batches)
        runs = {peer: plan_peer(sized, checked, spans, peer) for peer in settings.peers}
        gaps = bound_gaps(sized, checked, spans, runs, settings)["gaps"]
        row: dict[str, Any] = {
            "redundant": extra,
            "slots_per_device": per_device,
            "gb_per_device": per_device * model.layers * model.page_gb,
        }
        for peer, run in runs.items():
            ratio = per_step_imbalance(served_loads(checked, spans, run.placements, "flow"))
            row[peer] = {"p95": float(np.percentile(ratio, 95)), "gap_to_bound": gaps[peer]}
        oracle = per_step_imbalance(oracle_loads(sized, checked))
        row["oracle"] = {"p95": float(np.percentile(oracle, 95))}
        points.append(row)
    return {"instance": instance.name, "peers": list(settings.peers), "points": points}


def _with_slots(instance: Instance, per_device: int) -> Instance:
    """The instance with `per_device` slots per layer on every device, the budget all of them."""
    model, chiplets = instance.model, instance.hardware.chiplets
    capacity = per_device * model.layers * model.page_gb * (1 + 1e-9)  # whole pages despite rounding
    overrides = {
        "hardware.capacity_gb": capacity,
        "policy.replica_budget_pages": per_device * chiplets * model.layers,
    }
    return with_overrides(instance, overrides, "--redundant")


# ---- output


def markdown(result: dict[str, Any]) -> str:
    r = result
    cross = any(row["peer"] == CROSSFIT for row in r["rows"])
    crossfit = (
        "; cross-fitted (hindsight-crossfit): on its even steps for its odd ones and back." if cross else "."
    )
    head = (
        f"{r['instance']}: {r['steps']} steps in {r['windows']} windows, {r['layers']} layers x"
        f" {r['experts']} experts on {r['devices']} devices, {r['slots_per_layer']} slots per layer."
        " Imbalance = largest / mean device load per (step, layer); balancedness = mean / largest"
        " (SGLang: per layer and step, averaged; vLLM: summed over layers, per step). Gap to bound:"
        f" on the planning objective of windows {r['bound']['windows']}, to milp's proven lower bound."
        f" Hindsight: exact {_within(r['hindsight_limit_s'])} per window, on its own steps{crossfit}"
    )
    if r.get("oracle_steps", r["steps"]) < r["steps"]:
        head += f" Oracle: on {r['oracle_steps']:,} of the {r['steps']:,} steps, spread evenly."
    lines = [
        head,
        "",
        "| peer | routing | P50 | P95 | P99 | balancedness SGLang | balancedness vLLM | copies / re-plan"
        " | plan s | gap to bound |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        copies = f"{r['copies_per_replan']:.1f}" if "copies_per_replan" in r else "–"
        plan = f"{r['plan_s']:.2f}" if "plan_s" in r else "–"
        gap = _percent(r.get("gap_to_bound"))
        lines.append(
            f"| {r['peer']} | {r['routing']} | {r['p50']:.3f} | {r['p95']:.3f} | {r['p99']:.3f}"
            f" | {r['balancedness_sglang']:.3f} | {r['balancedness_vllm']:.3f} | {copies} | {plan} | {gap} |"
        )
    if result.get("migration_weight"):
        lines += ["", weight_line(result["migration_weight"])]
    return "\n".join(lines)


def weight_line(report: dict[str, Any]) -> str:
    """CoMoE's migration weight per window, and what each backtest scored (mean held-out ms per
    step, per candidate weight; the chosen one in bold)."""
    per_window = " ".join(f"{w:g}" for w in report["per_window"])
    line = f"CoMoE's policy.migration_weight per window: {per_window}."
    for b in report["backtests"]:
        scores = ", ".join(
            (f"**{w}: {ms:.4g}**" if float(w) == b["weight"] else f"{w}: {ms:.4g}")
            for w, ms in b["mean_ms"].items()
        )
        line += (
            f" Backtest at window {b['window']} on windows {b['origins']} (held-out ms per step by weight:"
            f" {scores}) chose {b['weight']:g}."
        )
    return line


def _within(limit_s: float | None) -> str:
    return "on work limits" if limit_s is None else f"within {limit_s:g} s"


def redundancy_markdown(result: dict[str, Any]) -> str:
    peers = result["peers"]
    lines = [
        f"{result['instance']}: P95 imbalance with flow routing (gap to the milp bound) per redundant slots",
        "",
        "| redundant slots | GB per device | " + " | ".join(peers) + " | oracle |",
        "|---:|---:|" + "---:|" * (len(peers) + 1),
    ]
    for p in result["points"]:
        cells = [f"{p[peer]['p95']:.3f} ({_percent(p[peer]['gap_to_bound'])})" for peer in peers]
        lines.append(
            f"| {p['redundant']} | {p['gb_per_device']:.3f} | "
            + " | ".join(cells)
            + f" | {p['oracle']['p95']:.3f} |"
        )
    return "\n".join(lines)


def plot_cdf(result: dict[str, Any], path: Path) -> None:
    """CDF of per-(step, layer) imbalance: one colour per peer, our flow routing solid (the same
    for all), the engines' even split dashed, the limits in black; cut at the largest P99."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    colours = plt.get_cmap("tab10")
    peers = list(dict.fromkeys(key.split("/")[0] for key in result["imbalance"]))
    top = max(float(np.percentile(np.asarray(v), 99)) for v in result["imbalance"].values())
    for key, ratio in result["imbalance"].items():
        peer, routing = key.split("/")
        if routing == "lp":
            continue
        values = np.sort(np.asarray(ratio).ravel())
        cdf = np.arange(1, values.size + 1) / values.size
        style: dict[str, Any] = {"color": colours(peers.index(peer) % 10)}
        if peer in LIMITS:
            style = {"color": "black", "linestyle": {"oracle": ":", "hindsight": "-."}.get(peer, "--")}
        elif routing == "even":
            style["linestyle"], style["alpha"] = "--", 0.6
        ax.plot(values, cdf, label=f"{peer} ({routing})", linewidth=1.2, **style)
    ax.axvline(1.0, color="grey", linewidth=0.8)
    ax.set_xlabel("imbalance per (step, layer): largest / mean device load")
    ax.set_ylabel("share of (step, layer) samples")
    ax.set_xlim(1.0, max(top, 1.05))
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_redundancy(result: dict[str, Any], path: Path) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    x = [p["redundant"] for p in result["points"]]
    for peer in [*result["peers"], "oracle"]:
        ax.plot(x, [p[peer]["p95"] for p in result["points"]], marker="o", label=peer)
    ax.set_xlabel("redundant slots per layer")
    ax.set_ylabel("P95 imbalance, flow routing")
    ax.set_xticks(x, [f"{p['redundant']}\n{p['gb_per_device']:.2f} GB" for p in result["points"]])
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _pyplot() -> Any:
    import matplotlib  # drawn only when asked

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# ---- the copies–balance frontier (`compare --frontier`)

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
    planner: str, knob: str, value: float | None, steps: np.ndarray, spans, run: PeerRun
) -> FrontierPoint:  # type: ignore[no-untyped-def]
    """The run's point under its best routing (lowest P95)."""
    p95 = {
        routing: float(
            np.percentile(per_step_imbalance(served_loads(steps, spans, run.placements, routing)), 95)
        )
        for routing in ROUTINGS
    }
    routing = min(p95, key=lambda r: (p95[r], ROUTINGS.index(r)))
    copies = float(np.mean(run.copies[1:])) if len(run.copies) > 1 else 0.0
    return FrontierPoint(planner, knob, value, copies, p95[routing], routing)


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
    steps = _checked(instance, steps, settings.steps)
    spans = windows(steps.shape[0], instance.policy.window_batches)
    if not peers:
        others = [p for p in settings.peers if p != "comoe"]
        peers = [best_point(p, "", None, steps, spans, plan_peer(instance, steps, spans, p)) for p in others]
    default = instance.policy.migration_weight
    comoe = []
    for weight in sorted({*weights, default}):
        priced = with_overrides(instance, {"policy.migration_weight": weight}, "--frontier")
        comoe.append(
            best_point(
                "comoe", "migration_weight", weight, steps, spans, plan_peer(priced, steps, spans, "comoe")
            )
        )
    dropin = [
        dropin_point(instance, steps, spans, cost, dispatch) for dispatch in dispatches for cost in move_costs
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
    instance: Instance,
    steps: np.ndarray,
    spans: list[tuple[int, int]],
    move_cost: float,
    dispatch: Literal["even", "lp"],
) -> FrontierPoint:
    """The drop-in `rebalance_experts` re-planning each window on its history as compare's peers do
    (the map in service as `previous`), scored under the routing its dispatch serves with."""
    from comoe_opt.balancers.dropin.rebalance import rebalance_experts as dropin  # the drop-in API

    layout = _SlotLayout.of(instance, steps, "the drop-in")
    served, copies, previous, in_service = [], [], None, None
    for w, (start, stop) in enumerate(spans):
        begin, end = history_span(spans, w, instance.policy.history_windows)
        history = steps[begin:end].astype(np.float64)
        phy2log = dropin(
            history.sum(axis=0),
            *layout.eplb_args,
            history=history,
            previous=previous,
            dispatch=dispatch,
            move_cost=move_cost,
            moves=DROPIN_MOVES,
        )[0]
        resident = layout.resident(phy2log, steps.shape[2])
        copies.append(int((resident & ~in_service).sum()) if in_service is not None else 0)
        served.append(device_loads(steps[start:stop], resident, dispatch))
        previous, in_service = phy2log, resident
    p95 = float(np.percentile(per_step_imbalance(np.concatenate(served)), 95))
    mean_copies = float(np.mean(copies[1:])) if len(copies) > 1 else 0.0
    return FrontierPoint(f"drop-in {dispatch}", "move_cost", move_cost, mean_copies, p95, dispatch)


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


def plot_frontier(result: dict[str, Any], path: Path) -> None:
    """P95 against copies per re-plan: CoMoE's sweep as a line, the drop-in's per dispatch, each
    peer a marker beside them."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    comoe = sorted(result["comoe"], key=lambda p: p["copies"])
    ax.plot(
        [p["copies"] for p in comoe],
        [p["p95"] for p in comoe],
        "o-",
        color="black",
        label="CoMoE (migration_weight)",
    )
    for dispatch, style in (("drop-in even", "s--"), ("drop-in lp", "^--")):
        pts = sorted((p for p in result["dropin"] if p["planner"] == dispatch), key=lambda p: p["copies"])
        if pts:
            ax.plot(
                [p["copies"] for p in pts], [p["p95"] for p in pts], style, label=f"{dispatch} (move_cost)"
            )
    for p in result["peers"]:
        ax.plot([p["copies"]], [p["p95"]], "x", markersize=8, label=f"{p['planner']} ({p['routing']})")
    ax.set_xscale("symlog", linthresh=1.0)
    ax.set_xlabel("copies per re-plan")
    ax.set_ylabel("P95 imbalance (largest / mean device load)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
