"""The figures of `compare`: the imbalance CDF, the `--redundant` sweep and the frontier (PNG,
PDF or SVG by the path's suffix; matplotlib's Agg backend, loaded when a figure is asked for)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from comoe_opt.evaluator.compare import LIMITS
from comoe_opt.evaluator.sweep import memory


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
    ax.set_xticks(x, [f"{p['redundant']}\n{memory(p)}" for p in result["points"]])
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _pyplot() -> Any:
    import matplotlib  # drawn only when asked

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


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
