"""The regime map: where the paper's qualitative claims hold in this model.

The paper pins some constants (Table 3) and not others. A regime map sweeps
the ones it does not pin (capacity per chiplet, local weight-read bandwidth,
die-to-die bandwidth, attention's share of static's latency), runs every
strategy of Tables 4 and 5 at each point through the batch runner
(benchmarks/suites/regime-map.toml), and tests each claim there.

`point_table` turns the runner's rows (one per point and strategy) into one
row per point: the axes, each strategy's metrics, and for every claim its
*margin* (> 0 where it holds, in the claim's own unit) and whether it holds.
`best_point` picks the point where the most claims hold.

Beside the claims, every point says whether CoMoE-Chip's mean latency is
within 1% of the best of the strategies that are its own parts (static,
hot replication, transition prefetch) and, where it is not, which mechanism
makes the difference (`parts_why`); and claim 4 is tested a second time with
the paper's replica accounting (placed + buffered copies in use).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from comoe_opt.errors import ComoeError
from comoe_opt.evaluator.strategies import TABLE4, TABLE5

AXES = (
    "hardware.capacity_gb",
    "hardware.local_bandwidth_gb_s",
    "hardware.d2d_bandwidth_gb_s",
    "runtime.attention_share",
)
ABLATIONS = tuple(s for s in TABLE5 if s != "comoe")
MAP_STRATEGIES = (*TABLE4, *ABLATIONS)
METRICS = ("mean_ms", "p95_ms", "load_gb_per_batch", "balance", "replica_factor")
# read when the results have them (older results do not): the paper's replica accounting and
# what `parts_why` explains a loss by
EXTRA_METRICS = (
    "replica_factor_paper",
    "p99_ms",
    "demand_load_gb_per_batch",
    "pages_migrated",
    "prefetch_issued",
    "prefetch_denied",
)
PARTS = ("static", "hot", "transition")  # strategies that are one of CoMoE-Chip's mechanisms alone
PARTS_TOLERANCE = 0.01
PAPER_STATIC_LOAD_GB = 12.9540  # paper Table 4, static's remote expert loading per micro-batch

Point = Mapping[str, Mapping[str, float]]  # strategy -> metric -> value, at one point of the map


@dataclass(frozen=True)
class Claim:
    name: str
    text: str  # the claim as the paper makes it
    measure: str  # what the margin is
    margin: Callable[[Point, Point], float]  # (Table 4 point, Table 5 point) -> > 0 where it holds


def _lowest(point: Point, metric: str) -> float:
    """How far CoMoE's `metric` is below the best other Table 4 strategy's, relative; inf when
    neither has any (both load nothing: nothing to be lowest on)."""
    others = min(point[s][metric] for s in TABLE4 if s != "comoe")
    ours = point["comoe"][metric]
    if others <= 0:
        return math.inf if ours <= 0 else -math.inf
    return (others - ours) / others


def _comoe_lowest(point: Point, _: Point) -> float:
    return min(_lowest(point, m) for m in ("mean_ms", "p95_ms", "load_gb_per_batch"))


def _hot_p95(point: Point, _: Point) -> float:
    return 1.0 - point["hot"]["p95_ms"] / point["static"]["p95_ms"]


def _prefetch_cut(point: Point, _: Point) -> float:
    static = point["static"]["load_gb_per_batch"]
    if static <= 0:  # static loads nothing: there is nothing to cut
        return -math.inf
    return (1.0 - point["transition"]["load_gb_per_batch"] / static) - 0.8


def _balance_and_replicas(point: Point, _: Point) -> float:
    comoe = point["comoe"]
    return min(comoe["balance"] - 0.8, comoe["replica_factor"] - 1.0)


def _ablations_worse(_: Point, table5: Point) -> float:
    full = table5["comoe"]["p95_ms"]
    return min(table5[s]["p95_ms"] / full - 1.0 for s in ABLATIONS)


def _half_of_static(point: Point, _: Point) -> float:
    return 0.5 - point["comoe"]["mean_ms"] / point["static"]["mean_ms"]


CLAIMS = (
    Claim(
        "lowest",
        "CoMoE-Chip has the lowest mean latency, P95 latency and remote expert loading",
        "smallest relative lead over the best other Table 4 strategy (mean, P95, loading)",
        _comoe_lowest,
    ),
    Claim(
        "hot-p95",
        "hot replication beats static on P95 latency",
        "1 - hot P95 / static P95",
        _hot_p95,
    ),
    Claim(
        "prefetch-cut",
        "transition prefetch cuts remote expert loading by at least 80% against static",
        "loading cut - 0.8 (no margin where static loads nothing)",
        _prefetch_cut,
    ),
    Claim(
        "balance",
        "CoMoE-Chip reaches balance >= 0.8 with a replica factor > 1",
        "min(balance - 0.8, replica factor - 1)",
        _balance_and_replicas,
    ),
    Claim(
        "ablations",
        "each Table 5 ablation has a higher P95 than full CoMoE-Chip",
        "smallest ablation P95 / CoMoE P95 - 1",
        _ablations_worse,
    ),
    Claim(
        "half-of-static",
        "CoMoE-Chip's mean latency is at least 50% below static's",
        "0.5 - CoMoE mean / static mean",
        _half_of_static,
    ),
)


def balance_paper_margin(point: Point) -> float:
    """Claim 4 with the paper's replica accounting (placed + buffered copies in use)."""
    comoe = point["comoe"]
    return min(comoe["balance"] - 0.8, comoe.get("replica_factor_paper", math.nan) - 1.0)


def parts_margin(point: Point) -> float:
    """How far CoMoE's mean latency is below 101% of its best part's, relative to that part's
    (>= 0: CoMoE never loses to one of its own parts by more than 1%)."""
    return min(
        ((1.0 + PARTS_TOLERANCE) * point[s]["mean_ms"] - point["comoe"]["mean_ms"]) / point[s]["mean_ms"]
        for s in PARTS
    )


def parts_why(point: Point) -> str:
    """The mechanism by which a part beats CoMoE on mean latency ('' where none does)."""
    ours = point["comoe"]
    beaten = [s for s in PARTS if ours["mean_ms"] > (1.0 + PARTS_TOLERANCE) * point[s]["mean_ms"]]
    if not beaten:
        return ""
    best = min(beaten, key=lambda s: point[s]["mean_ms"])
    part = point[best]
    why = f"{best} {part['mean_ms']:.3f} ms against {ours['mean_ms']:.3f}: "
    demand, theirs = ours.get("demand_load_gb_per_batch", 0.0), part.get("demand_load_gb_per_batch", 0.0)
    if demand > theirs:
        copies = ours.get("pages_migrated", 0.0)
        cause = (
            f"re-plan copies ({copies:.0f} pages) keep the new plan's experts remote until they land"
            if copies
            else f"CoMoE's plan leaves remote, or its buffers miss, experts that {best} serves locally"
        )
        return why + f"more on-demand loads ({demand:.2f} against {theirs:.2f} GB/batch): {cause}"
    if ours["balance"] < part["balance"]:
        why += f"less balanced chiplets ({ours['balance']:.3f} against {part['balance']:.3f})"
        if best == "hot" and part["replica_factor"] > 1:  # even split spreads a hot expert's tokens
            why += (
                ": hot replication splits a hot expert's tokens over its replicas, CoMoE's flow runs "
                "each expert's tokens on one chiplet (policy.balance = work), and compute-bound "
                "chiplets pay for that"
            )
        return why
    return why + "same loads and balance: the mapping's queueing (flow units, multicast)"


def claim_margins(table4: Point, table5: Point) -> dict[str, float]:
    """Every claim's margin (> 0: holds): `table4` holds the Table 4 strategies' metrics,
    `table5` full CoMoE's and the ablations' (the same point, possibly another trace length)."""
    return {claim.name: claim.margin(table4, table5) for claim in CLAIMS}


def point_table(rows: pd.DataFrame, axes: tuple[str, ...] = AXES) -> pd.DataFrame:
    """One row per point of the map: axes, `<strategy>.<metric>`, `<claim>.margin` and
    `<claim>.holds`, and `claims_held`. `rows` are the runner's results (columns `method`,
    the axes and the metrics); a point missing a strategy or a metric is an error."""
    missing = [c for c in (*axes, "method", *METRICS) if c not in rows.columns]
    if missing:
        raise ComoeError(f"regime results lack the columns {', '.join(missing)}")
    if "run_status" in rows.columns and (rows["run_status"] != "ok").any():
        failed = int((rows["run_status"] != "ok").sum())
        raise ComoeError(f"{failed} regime runs failed: re-run the suite with --resume")
    out = []
    for values, group in rows.groupby(list(axes), sort=True):
        by_strategy = {m: g.iloc[0] for m, g in group.groupby("method")}
        absent = [s for s in MAP_STRATEGIES if s not in by_strategy]
        if absent:
            raise ComoeError(f"regime point {dict(zip(axes, values, strict=True))} lacks {', '.join(absent)}")
        extra = [k for k in EXTRA_METRICS if k in group.columns]
        point = {s: {k: float(by_strategy[s][k]) for k in (*METRICS, *extra)} for s in MAP_STRATEGIES}
        row: dict[str, Any] = dict(zip(axes, values, strict=True))
        if "attention_ms" in group.columns:
            row["attention_ms"] = float(by_strategy["static"]["attention_ms"])
        row.update({f"{s}.{k}": v for s, metrics in point.items() for k, v in metrics.items()})
        margins = claim_margins(point, point)
        for name, margin in margins.items():
            row[f"{name}.margin"] = margin
            row[f"{name}.holds"] = bool(margin > 0)
        row["claims_held"] = sum(m > 0 for m in margins.values())
        if "replica_factor_paper" in extra:
            row["balance-paper.margin"] = balance_paper_margin(point)
            row["balance-paper.holds"] = bool(row["balance-paper.margin"] > 0)
        row["parts.margin"] = parts_margin(point)
        row["parts.holds"] = bool(row["parts.margin"] >= 0)
        row["parts.why"] = parts_why(point)
        out.append(row)
    return pd.DataFrame(out)


def best_point(table: pd.DataFrame) -> pd.Series:
    """The point where the most claims hold. Ties go to the point where they hold most robustly
    (the largest smallest margin among its claims that hold), then to the static remote loading
    nearest the paper's (the calibration the paper does pin), then to the first in axis order."""
    if table.empty:
        raise ComoeError("the regime map has no points")
    margins = table[[f"{c.name}.margin" for c in CLAIMS]].to_numpy()
    robust = np.where(margins > 0, margins, np.inf).min(axis=1)
    load = table["static.load_gb_per_batch"].clip(lower=1e-9)
    distance = (load / PAPER_STATIC_LOAD_GB).map(lambda r: abs(math.log(r)))
    ranked = table.assign(_robust=np.where(np.isfinite(robust), robust, 0.0), _distance=distance)
    ranked = ranked.sort_values(
        ["claims_held", "_robust", "_distance"], ascending=[False, False, True], kind="stable"
    )
    return ranked.drop(columns=["_robust", "_distance"]).iloc[0]
