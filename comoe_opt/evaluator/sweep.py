"""The `--redundant` sweep of `compare`: for each number of redundant slots per layer, every peer's
P95 imbalance under our flow routing and its gap to the bound, its modelled MoE time under the
engines' dispatches (the even split, SGLang's `lp`: mean per step, a re-plan's stall, and the net
time per re-plan against EPLB at the same point, as `compare`'s rows), and the memory each device
holds (GB when the expert size is known, else slots)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from comoe_opt.errors import ComoeError
from comoe_opt.evaluator.compare import (
    STATIC,
    CompareSettings,
    Task,
    add_net_time,
    bound_gaps,
    checked_steps,
    peer_run,
    percent,
    row_of,
    run_tasks,
)
from comoe_opt.instance import Instance, with_overrides
from comoe_opt.trace.batching import windows

TIMED = ("even", "lp")  # the engines' dispatches, under which the sweep times each peer


def redundancy_sweep(
    instance: Instance,
    steps: np.ndarray,
    redundant: Sequence[int],
    settings: CompareSettings,
    sized: bool = True,
) -> dict[str, Any]:
    """For each number of redundant slots per layer: every peer's P95 imbalance with the flow
    routing and its gap to the bound, its time under the engines' dispatches, and the memory each
    device holds (GB when `sized`: the expert size is known)."""
    model, hw = instance.model, instance.hardware
    points = []
    for extra in redundant:
        slots = model.experts_per_layer + extra
        if extra < 0 or slots % hw.chiplets:
            raise ComoeError(
                f"--redundant {extra}: {slots} slots per layer must split evenly over {hw.chiplets} devices"
            )
        per_device = slots // hw.chiplets
        at_point = _with_slots(instance, per_device)
        checked = checked_steps(at_point, steps, settings.steps)
        spans = windows(checked.shape[0], at_point.policy.window_batches)
        done = run_tasks(at_point, checked, spans, settings, hindsight=False)
        runs = {peer: peer_run(done, peer, "flow", settings) for peer in settings.peers}
        gaps = bound_gaps(at_point, checked, spans, runs, settings, done)["gaps"]
        row: dict[str, Any] = {
            "redundant": extra,
            "slots_per_device": per_device,
            "gb_per_device": per_device * model.layers * model.page_gb if sized else None,
        }
        timed = _timed_rows(at_point, checked, done, settings)
        for peer, run in runs.items():
            ratio = run.served(checked, "flow").imbalance
            row[peer] = {"p95": float(np.percentile(ratio, 95)), "gap_to_bound": gaps[peer], **timed[peer]}
        row[STATIC] = timed[STATIC]
        oracle = done[("oracle", "")].imbalance
        row["oracle"] = {"p95": float(np.percentile(oracle, 95))}
        points.append(row)
    return {
        "instance": instance.name,
        "peers": list(settings.peers),
        "replan_every": settings.replan_every,
        "points": points,
    }


def _timed_rows(
    instance: Instance, steps: np.ndarray, done: dict[Task, Any], settings: CompareSettings
) -> dict[str, Any]:
    """Per peer (and the static plan) and dispatch in `TIMED`: its mean MoE time per step, layer
    P95, stall and net time per re-plan against EPLB (compare's `row_of` and `add_net_time`)."""
    timing, rows = instance.layer_time, []
    for peer in [*settings.peers, STATIC]:
        for routing in TIMED:
            run = peer_run(done, peer, routing, settings)
            rows.append(row_of(peer, routing, run.served(steps, routing, timing), run, timing))
    add_net_time(rows, settings.replan_every)
    keys = ("step_ms_mean", "layer_ms_p95", "migration_ms", "net_ms_per_replan")
    out: dict[str, Any] = {peer: {} for peer in [*settings.peers, STATIC]}
    for r in rows:
        out[r["peer"]][r["routing"]] = {k: r[k] for k in keys}
    return out


def _with_slots(instance: Instance, per_device: int) -> Instance:
    """The instance with `per_device` slots per layer on every device, the budget all of them."""
    model, chiplets = instance.model, instance.hardware.chiplets
    capacity = per_device * model.layers * model.page_gb * (1 + 1e-9)  # whole pages despite rounding
    overrides = {
        "hardware.capacity_gb": capacity,
        "policy.replica_budget_pages": per_device * chiplets * model.layers,
    }
    return with_overrides(instance, overrides, "--redundant")


def redundancy_markdown(result: dict[str, Any]) -> str:
    peers = result["peers"]
    lines = [
        f"{result['instance']}: P95 imbalance with flow routing (gap to the milp bound) per redundant slots",
        "",
        "| redundant slots | memory per device | " + " | ".join(peers) + " | oracle |",
        "|---:|---:|" + "---:|" * (len(peers) + 1),
    ]
    for p in result["points"]:
        cells = [f"{p[peer]['p95']:.3f} ({percent(p[peer]['gap_to_bound'])})" for peer in peers]
        lines.append(
            f"| {p['redundant']} | {memory(p)} | " + " | ".join(cells) + f" | {p['oracle']['p95']:.3f} |"
        )
    timed = [*peers, STATIC]
    lines += [
        "",
        "Modelled MoE time per step, ms (net ms per re-plan against EPLB at the same point, over"
        f" {result['replan_every']:,} steps), under the engines' dispatches",
        "",
        "| redundant slots | dispatch | " + " | ".join(timed) + " |",
        "|---:|---|" + "---:|" * len(timed),
    ]
    for p in result["points"]:
        for routing in TIMED:
            cells = [_time_cell(p[peer][routing]) for peer in timed]
            lines.append(f"| {p['redundant']} | {routing} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def memory(point: dict[str, Any]) -> str:
    """A point's memory per device: GB when the expert size is known, else slots per layer."""
    if point["gb_per_device"] is None:
        return f"{point['slots_per_device']} slots"
    return f"{point['gb_per_device']:.3f} GB"


def _time_cell(cell: dict[str, Any]) -> str:
    net = cell["net_ms_per_replan"]
    return f"{cell['step_ms_mean']:.4g} ({'–' if net is None else f'{net:+,.1f}'})"
