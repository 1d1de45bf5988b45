"""The `--redundant` sweep of `compare`: for each number of redundant slots per layer, every peer's
P95 imbalance under our flow routing and its gap to the bound, and the memory each device holds."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from comoe_opt.errors import ComoeError
from comoe_opt.evaluator.compare import (
    CompareSettings,
    bound_gaps,
    checked_steps,
    percent,
    run_tasks,
)
from comoe_opt.instance import Instance, with_overrides
from comoe_opt.trace.batching import windows


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
        checked = checked_steps(sized, steps, settings.steps)
        spans = windows(checked.shape[0], sized.policy.window_batches)
        done = run_tasks(sized, checked, spans, settings, hindsight=False)
        runs = {peer: done[("peer", peer)][0] for peer in settings.peers}
        gaps = bound_gaps(sized, checked, spans, runs, settings, done)["gaps"]
        row: dict[str, Any] = {
            "redundant": extra,
            "slots_per_device": per_device,
            "gb_per_device": per_device * model.layers * model.page_gb,
        }
        for peer, run in runs.items():
            ratio = run.served(checked, "flow").imbalance
            row[peer] = {"p95": float(np.percentile(ratio, 95)), "gap_to_bound": gaps[peer]}
        oracle = done[("oracle", "")].imbalance
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


def redundancy_markdown(result: dict[str, Any]) -> str:
    peers = result["peers"]
    lines = [
        f"{result['instance']}: P95 imbalance with flow routing (gap to the milp bound) per redundant slots",
        "",
        "| redundant slots | GB per device | " + " | ".join(peers) + " | oracle |",
        "|---:|---:|" + "---:|" * (len(peers) + 1),
    ]
    for p in result["points"]:
        cells = [f"{p[peer]['p95']:.3f} ({percent(p[peer]['gap_to_bound'])})" for peer in peers]
        lines.append(
            f"| {p['redundant']} | {p['gb_per_device']:.3f} | "
            + " | ".join(cells)
            + f" | {p['oracle']['p95']:.3f} |"
        )
    return "\n".join(lines)
