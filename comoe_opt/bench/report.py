"""The Markdown report of a suite (OUT/report.md): one section per group, pivots of point x method."""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path

import pandas as pd

from comoe_opt.bench.kinds import RUN_KINDS
from comoe_opt.bench.provenance import machine
from comoe_opt.bench.suite import Group, Suite
from comoe_opt.files import atomic_path

# per metric: title, aggregation over seeds/windows, cell format
METRICS = {
    "objective": ("objective (ms over the window, mean over seeds and windows)", "mean", "{:.6g}"),
    "p95_ms": ("P95 per-layer latency (ms, mean over seeds)", "mean", "{:.4f}"),
    "mean_ms": ("mean per-layer latency (ms, mean over seeds)", "mean", "{:.4f}"),
    "load_gb_per_batch": ("expert pages loaded (GB per micro-batch, mean over seeds)", "mean", "{:.3f}"),
    "balance": ("balance, mean / max chiplet busy time (mean over seeds)", "mean", "{:.3f}"),
    "token_imbalance_p95": (
        "P95 token imbalance, max / mean (token, expert) pairs per chiplet (mean over seeds)",
        "mean",
        "{:.3f}",
    ),
    "replica_factor": ("replica factor (mean over seeds)", "mean", "{:.3f}"),
    "gap_to_best_bound": (
        "gap to the best proven bound of the same instance, seed and window (%, max over seeds)",
        "max",
        "{:.3f}",
    ),
    "runtime_s": ("run time of the method (s, median over seeds and windows)", "median", "{:.3f}"),
}


def add_derived(frame: pd.DataFrame) -> pd.DataFrame:
    """`gap_to_best_bound` (%): every method against the tightest bound any method proved on the same
    instance, seed and window (heuristics have no bound of their own)."""
    frame = frame.copy()
    if not {"objective", "bound"} <= set(frame.columns) or frame.empty:
        return frame
    keys = ["group", "point", "seed", "window"]
    best = frame.groupby(keys, dropna=False)["bound"].transform("max")
    objective = pd.to_numeric(frame["objective"], errors="coerce")
    frame["gap_to_best_bound"] = 100 * (objective - best) / objective.abs().clip(lower=1e-9)
    return frame


def write_report(suite: Suite, frame: pd.DataFrame, out: Path, *, plots: bool = True) -> Path:
    frame = add_derived(frame)
    images = []
    if plots and not frame.empty:
        from comoe_opt.bench.plots import write_plots

        images = write_plots(suite, frame, out / "plots")
    path = out / "report.md"
    with atomic_path(path) as tmp:
        tmp.write_text(report_text(suite, frame, images, out), encoding="utf-8")
    return path


def report_text(suite: Suite, frame: pd.DataFrame, images: list[Path], out: Path) -> str:
    ok = int((frame["run_status"] == "ok").sum()) if len(frame) else 0
    errors = len(frame) - ok
    missing = len(suite.specs) - len(frame)
    commits = ", ".join(sorted(set(frame["commit"].dropna()))) if "commit" in frame else "-"
    lines = [f"# Benchmark suite `{suite.name}`", ""]
    if suite.description:
        lines += [suite.description.strip(), ""]
    lines += [
        f"Suite file `{suite.path.name}`: {len(suite.specs)} runs in {len(suite.groups)} group"
        f"{'s' if len(suite.groups) != 1 else ''}; "
        f"{ok} ok, {errors} failed, {missing} not run. Report written {dt.date.today().isoformat()}; "
        f"commit {commits or '-'}; {machine()}.",
        "",
        _versions(frame),
        "",
        "Beside this report: `results.parquet` (one row per run; columns in docs/bench.md), `plots/`, and"
        " `runs/` (one file per run, the state `--resume` continues from).",
        "",
    ]
    for group in suite.groups:
        specs = [s for s in suite.specs if s.group == group.name]
        by_window = len({s.window for s in specs}) > 1  # then a row per (point, window)
        points = list(dict.fromkeys(_row_label(s.point_label, s.window, by_window) for s in specs))
        rows = frame[frame["group"] == group.name].copy() if len(frame) else frame.copy()
        rows["row"] = [
            _row_label(p, w, by_window) for p, w in zip(rows["point"], rows["window"], strict=True)
        ]
        lines += _group_section(group, rows, points)
    if errors:
        lines += _errors(frame[frame["run_status"] != "ok"])
    if images:
        lines += ["## Plots", ""]
        lines += [f"![{p.stem}]({p.relative_to(out).as_posix()})" for p in images]
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def _versions(frame: pd.DataFrame) -> str:
    cols = [c for c in frame.columns if c.startswith("version_")]
    parts = []
    for col in cols:
        values = sorted(set(frame[col].dropna()))
        if values:
            parts.append(f"{col.removeprefix('version_').replace('_', '-')} {'/'.join(values)}")
    return "Versions: " + ("; ".join(parts) if parts else "-") + "."


def _group_section(group: Group, rows: pd.DataFrame, points: list[str]) -> list[str]:
    swept = ", ".join(f"`{a}`" for a in group.axes) or "nothing"
    lines = [
        f"## Group `{group.name}`",
        "",
        f"Run kind `{group.kind}`, base instance `{group.instance.name}`, sweeps {swept}; "
        f"methods {', '.join(group.methods)}; {len(rows)} finished runs.",
        "",
    ]
    if group.description:
        lines += [group.description.strip(), ""]
    ok = rows[rows["run_status"] == "ok"] if len(rows) else rows
    if ok.empty:
        return [*lines, "No finished runs.", ""]
    for metric in RUN_KINDS[group.kind].tables:
        if metric not in ok.columns or ok[metric].isna().all():
            continue
        title, how, fmt = METRICS.get(metric, (metric, "mean", "{:.6g}"))
        pivot = _pivot(ok, metric, how, fmt, group.methods, points)
        lines += [f"{title[0].upper()}{title[1:]}:", "", *pivot, ""]
    status = ok.groupby(["method", "solver_status"]).size() if "solver_status" in ok else None
    if status is not None and len(status):
        counts = "; ".join(f"{m} {s} x{n}" for (m, s), n in status.items())
        lines += [f"Solver status: {counts}.", ""]
    return lines


def _row_label(point: str, window: int, by_window: bool) -> str:
    if not by_window:
        return point
    return f"window {window}" if point == "-" else f"{point}, window {window}"


def _pivot(
    rows: pd.DataFrame, metric: str, how: str, fmt: str, methods: tuple[str, ...], points: list[str]
) -> list[str]:
    """Rows: the group's points in suite order; columns: its methods in suite order."""
    values = pd.to_numeric(rows[metric], errors="coerce")
    table = values.groupby([rows["row"], rows["method"]]).agg(how).unstack("method")
    order = [m for m in methods if m in table.columns]
    points = [p for p in points if p in table.index]
    out = ["| point | " + " | ".join(order) + " |", "|---|" + "---:|" * len(order)]
    for point in points:
        cells = [_cell(table.at[point, m], fmt) if point in table.index else "-" for m in order]
        out.append(f"| {point} | " + " | ".join(cells) + " |")
    return out


def _cell(value: float, fmt: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else fmt.format(value)


def _errors(rows: pd.DataFrame) -> list[str]:
    lines = ["## Failed runs", "", "| run | group | point | method | seed | error |"]
    lines.append("|---|---|---|---|---:|---|")
    for _, r in rows.iterrows():
        error = str(r["error"]).replace("|", "\\|")
        cells = [f"`{r['run_id']}`", r["group"], r["point"], r["method"], r["seed"], error]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return [*lines, ""]
