"""Plots of a suite's results (OUT/plots/*.png), drawn with Matplotlib's object API and the Agg
canvas, so that no global backend is switched in the caller's process."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from comoe_opt.bench.kinds import RUN_KINDS
from comoe_opt.bench.suite import Suite

GAP_FLOOR = 1e-4  # %: gaps at or below this are drawn here on the log axis (0 has no log)
LABELS = {
    "objective": "objective (ms over the window)",
    "p95_ms": "P95 latency (ms)",
    "gap_to_best_bound": "gap to best proven bound (%)",
}


def write_plots(suite: Suite, frame: pd.DataFrame, folder: Path) -> list[Path]:
    """Gap distributions, time against size, and the headline metric against each sweep variable."""
    folder.mkdir(parents=True, exist_ok=True)
    ok = frame[frame["run_status"] == "ok"]
    if ok.empty:
        return []
    written = []
    if "gap_to_best_bound" in ok and ok["gap_to_best_bound"].notna().any():
        written.append(_gaps(ok, folder / "gap-distribution.png"))
    if {"runtime_s", "layers", "experts", "chiplets"} <= set(ok.columns):
        for kind in sorted(ok["kind"].unique()):  # solve times and simulation times apart
            rows = ok[ok["kind"] == kind]
            written.append(_time_vs_size(rows, folder / f"time-vs-size-{kind}.png", kind))
    for group in suite.groups:
        rows = ok[ok["group"] == group.name]
        numeric = [a for a in group.axes if a in rows and pd.api.types.is_numeric_dtype(rows[a].dropna())]
        metric = RUN_KINDS[group.kind].headline
        metrics = [m for m in (metric, "gap_to_best_bound") if m in rows and rows[m].notna().any()]
        if len(group.axes) == 1 and numeric and metrics:
            axis = numeric[0]
            written.append(_sweep(rows, axis, metrics, folder / f"{group.name}-{_slug(axis)}.png"))
    return written


def _gaps(rows: pd.DataFrame, path: Path) -> Path:
    fig, ax = _figure()
    rows = rows[rows["gap_to_best_bound"].notna()]  # kinds without a bound have no gap
    methods = sorted(rows["method"].unique())
    data = [np.maximum(rows.loc[rows["method"] == m, "gap_to_best_bound"], GAP_FLOOR) for m in methods]
    ax.boxplot(data, tick_labels=methods, whis=(0, 100))
    for i, values in enumerate(data, start=1):
        ax.scatter(i + np.linspace(-0.15, 0.15, len(values)), values, s=8, alpha=0.5)
    ax.set_yscale("log")
    ax.set_ylabel(f"gap to best proven bound (%, floor {GAP_FLOOR:g})")
    ax.set_title("Gap distribution per method")
    return _save(fig, path)


def _time_vs_size(rows: pd.DataFrame, path: Path, kind: str) -> Path:
    fig, ax = _figure()
    size = rows["layers"] * rows["experts"] * rows["chiplets"]
    for method in sorted(rows["method"].unique()):
        mask = rows["method"] == method
        ax.scatter(size[mask], rows.loc[mask, "runtime_s"].clip(lower=1e-4), s=12, alpha=0.7, label=method)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("size: layers x experts x chiplets")
    ax.set_ylabel("run time of the method (s)")
    ax.set_title(f"{kind}: time against size")
    ax.legend(fontsize="small")
    return _save(fig, path)


def _sweep(rows: pd.DataFrame, axis: str, metrics: list[str], path: Path) -> Path:
    """One panel per metric (the kind's headline, and the gap to the best bound when there is one)."""
    fig = _canvas(figsize=(5.2 * len(metrics), 4.2))
    for i, metric in enumerate(metrics, start=1):
        ax = fig.add_subplot(1, len(metrics), i)
        values = pd.to_numeric(rows[metric], errors="coerce")
        for method in sorted(rows["method"].unique()):
            mask = rows["method"] == method
            mean = values[mask].groupby(rows.loc[mask, axis]).mean().sort_index()
            ax.plot(mean.index, mean.values, marker="o", label=method)
        ax.set_xlabel(axis)
        ax.set_ylabel(f"{LABELS.get(metric, metric)}, mean over seeds")
        ax.legend(fontsize="small")
    fig.suptitle(f"group {rows['group'].iloc[0]}: against {axis}")
    return _save(fig, path)


def _figure() -> tuple[Figure, Axes]:
    fig = _canvas()
    return fig, fig.add_subplot()


def _canvas(figsize: tuple[float, float] = (6.4, 4.2)) -> Figure:
    fig = Figure(figsize=figsize, dpi=110)
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})  # no version stamp: same data, same file
    return path


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in text).strip("-")
