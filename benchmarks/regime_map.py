"""The regime map: where the paper's six qualitative claims hold in our model.

Runs the suite benchmarks/suites/regime-map.toml through the batch runner
(every Table 4 strategy and Table 5 ablation at every point of capacity x
local bandwidth x die-to-die bandwidth x attention share, attention
calibrated on static at each point), then writes:

* `regime-map.csv` — one row per point: the axes, every strategy's metrics,
  each claim's margin (> 0 where it holds) and whether it holds;
* `claim-<name>.png` — one figure per claim, showing where it holds;
* `regime.md` — how many points each claim holds at, and the best point
  (instances/paper-regime.toml is the baseline moved there, with attention
  calibrated by `benchmarks/calibrate_static.py --attention-share`); where
  CoMoE-Chip's mean is not within 1% of its parts' (static, hot, transition)
  and the mechanism why; claim 4 with the paper's replica accounting; where
  the "no credits/priorities" ablation costs P95.

    .venv/bin/python benchmarks/regime_map.py --jobs 2             # run (resumes) and analyse
    .venv/bin/python benchmarks/regime_map.py --analyse-only       # analyse stored results
    .venv/bin/python benchmarks/regime_map.py --suite benchmarks/suites/regime-map-slow-link.toml \
        --results bench-out/regime-map-slow                        # the slow-link slice only
    .venv/bin/python benchmarks/regime_map.py --analyse-only \
        --results bench-out/regime-map-slow bench-out/regime-map-240   # several slices as one map
    .venv/bin/python benchmarks/regime_map.py --analyse-only --finished-points \
        --results bench-out/regime-map                             # a run still going: its finished points
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from comoe_opt.evaluator.claims import AXES, CLAIMS, MAP_STRATEGIES, best_point, point_table
from comoe_opt.files import atomic_path

HERE = Path(__file__).resolve().parent
SUITE = HERE / "suites" / "regime-map.toml"
LABELS = {
    "hardware.capacity_gb": "capacity per chiplet (pages of 1 GB)",
    "hardware.local_bandwidth_gb_s": "local weight-read bandwidth (GB/s)",
    "hardware.d2d_bandwidth_gb_s": "D2D GB/s",
    "runtime.attention_share": "attention share",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", type=Path, default=SUITE)
    parser.add_argument("--results", type=Path, nargs="+", default=[Path("bench-out/regime-map")],
                        help="runner output folder(s); several make one map")  # fmt: skip
    parser.add_argument("--out", type=Path, default=HERE / "results" / "regime")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--analyse-only", action="store_true")
    parser.add_argument("--finished-points", action="store_true",
                        help="analyse the stored runs of the points whose runs have all finished "
                             "(of a suite still running, or one stopped before the end)")  # fmt: skip
    parser.add_argument("--smoke", action="store_true",
                        help="analyse the committed map (results/runner-regime-map) into --out")  # fmt: skip
    args = parser.parse_args(argv)
    if args.smoke:  # no run: the committed results, analysed into --out
        args.analyse_only, args.results = True, [HERE / "results" / "runner-regime-map"]
    if not args.analyse_only:
        if len(args.results) != 1:
            parser.error("running a suite writes one --results folder")
        results = args.results[0]
        command = [sys.executable, "-m", "comoe_opt.cli", "bench", str(args.suite),
                   "--out", str(results), "--jobs", str(args.jobs), "--no-plots"]  # fmt: skip
        if (results / "runs").exists():
            command.append("--resume")
        subprocess.run(command, check=True)
    if args.finished_points:
        rows = pd.concat([finished_points(r) for r in args.results], ignore_index=True)
    else:
        rows = pd.concat([pd.read_parquet(r / "results.parquet") for r in args.results], ignore_index=True)
    table = point_table(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    with atomic_path(args.out / "regime-map.csv") as tmp:
        table.to_csv(tmp, index=False, float_format="%.6g")
    for claim in CLAIMS:
        plot_claim(table, claim, args.out / f"claim-{claim.name}.png")
    best = best_point(table)
    text = summary(table, best, rows)
    with atomic_path(args.out / "regime.md") as tmp:
        tmp.write_text(text, encoding="utf-8")
    print(text)
    return 0


def finished_points(results: Path) -> pd.DataFrame:
    """The stored rows (`runs/*.json`) of the points where every strategy of the map has run."""
    from comoe_opt.bench.store import ResultStore, results_frame

    store = ResultStore(results)
    rows = results_frame(store.rows(p.stem for p in sorted(store.runs.glob("*.json"))))
    rows = rows[rows["run_status"] == "ok"]
    done = rows.groupby(list(AXES))["method"].transform("nunique") == len(MAP_STRATEGIES)
    return rows[done].reset_index(drop=True)


def summary(table: pd.DataFrame, best: pd.Series, rows: pd.DataFrame) -> str:
    lines = [
        f"# Regime map: {len(table)} points x {rows['method'].nunique()} strategies "
        f"({len(rows)} runs, {int(rows['micro_batches'].iloc[0])} micro-batches each)",
        "",
        *([f"Suites: {', '.join(sorted(rows['suite'].unique()))}.", ""] if "suite" in rows.columns else []),
        "| claim | holds at | best margin | where the margin is best |",
        "|---|---:|---:|---|",
    ]
    for claim in CLAIMS:
        margin = table[f"{claim.name}.margin"]
        top = table.loc[margin.idxmax()]
        lines.append(
            f"| {claim.text} | {int(table[f'{claim.name}.holds'].sum())} of {len(table)} "
            f"| {margin.max():+.3f} | {_where(top)} |"
        )
    lines += ["", *_parts_lines(table), "", *_variant_lines(table)]
    counts = table["claims_held"].value_counts().sort_index(ascending=False)
    lines += ["", "Points by the number of claims that hold: "
              + ", ".join(f"{int(n)} claims: {int(c)}" for n, c in counts.items()), ""]  # fmt: skip
    held = [c.text for c in CLAIMS if best[f"{c.name}.holds"]]
    lines += [
        f"Best point ({int(best['claims_held'])} claims): {_where(best)}; static loads "
        f"{best['static.load_gb_per_batch']:.2f} GB per micro-batch, "
        f"attention {best.get('attention_ms', 0):.4f} ms.",
        "",
        *[f"* holds: {t}" for t in held],
        *[
            f"* fails: {c.text} (margin {best[c.name + '.margin']:+.3f})"
            for c in CLAIMS
            if not best[f"{c.name}.holds"]
        ],
        "",
    ]
    return "\n".join(lines)


def _parts_lines(table: pd.DataFrame) -> list[str]:
    """Where CoMoE-Chip's mean is not within 1% of a part's, and the mechanism why."""
    lost = table[~table["parts.holds"]]
    lines = [
        f"CoMoE-Chip's mean latency is within 1% of static's, hot replication's and transition "
        f"prefetch's (or below) at {len(table) - len(lost)} of {len(table)} points."
    ]
    if len(lost):
        lines += ["", "| point | why a part is faster |", "|---|---|"]
        lines += [f"| {_where(row)} | {row['parts.why']} |" for _, row in lost.iterrows()]
    return lines


def _variant_lines(table: pd.DataFrame) -> list[str]:
    """Claim 4 with the paper's replica accounting; where no credits/priorities costs P95."""
    lines = []
    if "balance-paper.holds" in table.columns:
        lines.append(
            f"Claim 4 with the paper's replica accounting ((placed + buffered copies in use) / distinct, "
            f"per micro-batch): holds at {int(table['balance-paper.holds'].sum())} of {len(table)} "
            f"(ours: {int(table['balance.holds'].sum())})."
        )
    ratio = table["no-credits.p95_ms"] / table["comoe.p95_ms"]
    worse = table[ratio > 1.001]  # a tie within 0.1% is a tie (P95 sits on whole page loads)
    lines.append(
        f"No credits/priorities has a higher P95 than CoMoE-Chip at {len(worse)} of {len(table)} points"
        + (f" (largest: {ratio.max():.2f}x at {_where(table.loc[ratio.idxmax()])})" if len(worse) else "")
        + f"; a higher mean at {int((table['no-credits.mean_ms'] > 1.001 * table['comoe.mean_ms']).sum())}."
    )
    return lines


def _where(row: pd.Series) -> str:
    return ", ".join(f"{k.split('.')[1]} = {row[k]:g}" for k in AXES)


def plot_claim(table: pd.DataFrame, claim, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cap, local, d2d, share = AXES
    rows, cols = sorted(table[share].unique()), sorted(table[d2d].unique())
    xs, ys = sorted(table[cap].unique()), sorted(table[local].unique())
    fig, axes = plt.subplots(len(rows), len(cols), figsize=(3.2 * len(cols), 2.6 * len(rows)),
                             squeeze=False, sharex=True, sharey=True)  # fmt: skip
    for i, a in enumerate(rows):
        for j, d in enumerate(cols):
            ax = axes[i][j]
            part = table[(table[share] == a) & (table[d2d] == d)]
            grid = part.pivot(index=local, columns=cap, values=f"{claim.name}.margin")
            grid = grid.reindex(index=ys, columns=xs)
            values = grid.to_numpy(dtype=float)
            holds = np.ma.masked_invalid(np.where(np.isnan(values), np.nan, values > 0))  # grey: not run
            cmap = plt.get_cmap("RdYlGn").copy()
            cmap.set_bad("lightgrey")
            ax.imshow(holds, origin="lower", cmap=cmap, vmin=-0.3, vmax=1.3, aspect="auto")
            for (y, x), value in np.ndenumerate(values):
                if not np.isnan(value):
                    ax.text(x, y, "–" if abs(value) == float("inf") else f"{value:+.2f}", ha="center",
                            va="center", fontsize=7)  # fmt: skip
            ax.set_xticks(range(len(xs)), [f"{x:g}" for x in xs], fontsize=7)
            ax.set_yticks(range(len(ys)), [f"{y:g}" for y in ys], fontsize=7)
            ax.set_title(f"D2D {d:g} GB/s, attention {a:g}", fontsize=8)
            if i == len(rows) - 1:
                ax.set_xlabel(LABELS[cap], fontsize=7)
            if j == 0:
                ax.set_ylabel(LABELS[local], fontsize=7)
    fig.suptitle(f"{claim.text}\n(green: holds; cell: {claim.measure})", fontsize=9)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
