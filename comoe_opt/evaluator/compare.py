"""The engines' balancers side by side with CoMoE, the limits and the certified bound (`comoe-opt compare`).

A table assembled over the one replay (`comoe_opt/replay/`): every peer re-plans each window
from the windows before it, as the rolling horizon does (`policy.window_batches`,
`policy.history_windows`; CoMoE keeps its leases, the engines none), and each served step is scored
with the plan in force, installed at once (re-plan copies are counted, not timed: `evaluate` times
them), under the three dispatches of `replay/serve.py`: the engines' even split, SGLang's `lp` and
our flow. Window 0 is the warm-up: planned on itself, scored by no row.

Three limits: the **oracle** (EPLB planned on each step's own counts, in place at once, optimally
routed), **hindsight** (per window, `exact` planned on that window's own steps) and, with
`crossfit`, **hindsight cross-fitted** (`exact` on the window's even steps serving its odd ones
and back), all on the work limits of an evaluation unless `hindsight_limit_s` is given. The
**bound** is `milp`'s proven lower bound on the planning objective of `bound_windows` windows
(balance on the history's scenarios, every copy free), each peer's plan of those windows scored on it.
The frontier (`evaluator/frontier.py`), the `--redundant` sweep (`evaluator/sweep.py`), the
figures (`evaluator/plots.py`) and the answer (`evaluator/advice.py`) sit beside this module.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from comoe_opt.costs import REPLAN_EVERY, LayerTime
from comoe_opt.errors import ComoeError
from comoe_opt.evaluator.strategies import COMPARE_PEERS
from comoe_opt.instance import Instance, with_overrides
from comoe_opt.parallel import parallel_map
from comoe_opt.planning.rolling import reproducible_limit
from comoe_opt.planning.window import steps_demand
from comoe_opt.replay import (
    DISPATCHES,
    EplbLayout,
    EplbOnSteps,
    Foresight,
    Rolling,
    Run,
    Served,
    Static,
    replay,
)
from comoe_opt.residency.even_split import SPLITS
from comoe_opt.residency.heuristics import eplb_slots
from comoe_opt.residency.objective import score
from comoe_opt.residency.problem import ResidencyProblem, residency_problem
from comoe_opt.residency.solve import solve
from comoe_opt.trace.batching import history_span, windows

ROUTINGS = DISPATCHES  # compare's name for the dispatches its rows are scored under
CROSSFIT = "hindsight-crossfit"  # hindsight knowing each window's load, not the steps it is scored on
STATIC = "static"  # EPLB planned once on the warm-up window and kept: serving without re-balancing
LIMITS = ("oracle", "hindsight", CROSSFIT)  # rows that are limits, not planners
BASELINE = "eplb"  # the row each net time is measured against (the balancer vLLM and SGLang ship)
OURS = "comoe"
EVEN_PLAN = "@even"  # CoMoE's task planned with policy.split = "even"
ORACLE_STEPS = 4096  # steps the oracle plans, spread evenly over a longer trace (one EPLB plan per step)


@dataclass(frozen=True)
class CompareSettings:
    peers: tuple[str, ...] = COMPARE_PEERS
    steps: int = 0  # the first N steps (0 = all)
    # `exact` per served window, planned on its own steps: seconds, or None for the work limits
    # of an evaluation (residency/schedule.py), so that the numbers do not depend on the machine
    hindsight_limit_s: float | None = None
    # hindsight cross-fitted too: two more `exact` solves per window, on half its steps
    crossfit: bool = False
    bound_windows: int = 8  # windows the milp bound is computed on, spread evenly
    bound_limit_s: float | None = None  # `milp`'s bound: seconds, or None for work limits
    # worker processes the replays, the limits and the bound's solves are shared over (each is a
    # function of the input alone: the same table with any number)
    jobs: int = 1
    # the user's re-plan interval, steps: what a re-plan's gain is summed over
    replan_every: int = REPLAN_EVERY
    # the dispatches CoMoE plans for (policy.split): with both, its even-split rows come from a
    # plan made for the even split and its lp and flow rows from one made for the best split
    comoe_splits: tuple[str, ...] = SPLITS


def compare(instance: Instance, steps: np.ndarray, settings: CompareSettings) -> dict[str, Any]:
    """Rows for every peer × dispatch and the limits, the bound's gaps, and per-step imbalance."""
    steps = checked_steps(instance, steps, settings.steps)
    spans = windows(steps.shape[0], instance.policy.window_batches)
    done = run_tasks(instance, steps, spans, settings)
    runs = {peer: peer_run(done, peer, "lp", settings) for peer in settings.peers}  # the bound's
    timing = instance.layer_time
    rows, imbalance = [], {}
    for peer in [*settings.peers, STATIC]:
        for routing in ROUTINGS:
            run = peer_run(done, peer, routing, settings)
            served = run.served(steps, routing, timing)
            rows.append(row_of(peer, routing, served, run, timing))
            imbalance[f"{peer}/{routing}"] = served.imbalance
    oracle = done[("oracle", "")]
    rows.append(row_of("oracle", "flow", oracle, None, timing))
    imbalance["oracle/flow"] = oracle.imbalance
    for name in ("hindsight", CROSSFIT) if settings.crossfit else ("hindsight",):
        run = done[("limit", name)]
        served = run.served(steps, "flow", timing)
        rows.append(row_of(name, "flow", served, run, timing, copies=False))
        imbalance[f"{name}/flow"] = served.imbalance
    add_net_time(rows, settings.replan_every)
    gaps = bound_gaps(instance, steps, spans, runs, settings, done)
    for row in rows:
        row["gap_to_bound"] = gaps["gaps"].get(row["peer"])
    comoe = done.get(("peer", planned_for("lp", settings))) if OURS in settings.peers else None
    even = done.get(("peer", planned_for("even", settings))) if OURS in settings.peers else None
    return {
        "instance": instance.name,
        "steps": int(steps.shape[0]),
        "windows": len(spans),
        "scored_from": int(spans[1][0]),  # window 0 is the warm-up
        "layers": int(steps.shape[1]),
        "experts": int(steps.shape[2]),
        "devices": instance.hardware.chiplets,
        "slots_per_layer": _slots(instance, steps),
        "hindsight_limit_s": settings.hindsight_limit_s,
        "replan_every": settings.replan_every,
        "baseline": BASELINE if BASELINE in settings.peers else None,
        "oracle_steps": int(min(steps.shape[0] - spans[1][0], ORACLE_STEPS)),
        "bound": {k: v for k, v in gaps.items() if k != "gaps"},
        "rows": rows,
        # CoMoE's migration weight per window and, with policy.migration_weight = -1, the backtests
        "migration_weight": comoe[1] if comoe is not None else None,
        # ... and its plan for the even split's, where it planned for both
        "migration_weight_even": even[1] if even is not None and even is not comoe else None,
        # the plan CoMoE's rows of each dispatch come from (policy.split)
        "comoe_planned_for": {r: split_of(planned_for(r, settings)) for r in ROUTINGS} if comoe else None,
        "imbalance": imbalance,
    }


def checked_steps(instance: Instance, steps: np.ndarray, limit: int) -> np.ndarray:
    """The steps compare runs on: the instance's shape, the first `limit` (0: all), at least two
    windows (window 0 is the warm-up, scored by no row)."""
    steps = np.asarray(steps)
    model = instance.model
    if steps.ndim != 3 or steps.shape[1:] != (model.layers, model.experts_per_layer):
        raise ComoeError(
            f"counts are {steps.shape}, the instance needs [steps, {model.layers}, {model.experts_per_layer}]"
        )
    if limit:
        steps = steps[:limit]
    window = instance.policy.window_batches
    if steps.shape[0] <= window:
        raise ComoeError(
            f"compare needs more than one window of policy.window_batches = {window} steps, got"
            f" {steps.shape[0]}: window 0 is planned on itself and scored by no row"
        )
    return steps


Task = tuple[str, str]  # ("peer", name), ("limit", "hindsight" or CROSSFIT), (STATIC, ""), ("oracle", ""),
# ("bound", w)


def run_tasks(
    instance: Instance,
    steps: np.ndarray,
    spans: list[tuple[int, int]],
    settings: CompareSettings,
    hindsight: bool = True,
) -> dict[Task, Any]:
    """Every replay, limit and bound solve of one compare, over `settings.jobs` worker processes:
    each peer's (Run, CoMoE's weight report or None), the oracle's Served, each bound window's
    milp bound (ms) and, with `hindsight`, each hindsight limit's Run."""
    instance = serving_interval(instance, settings.replan_every)
    tasks: list[Task] = [("peer", peer) for peer in settings.peers if peer != OURS]
    if OURS in settings.peers:
        tasks += [("peer", comoe_task(split)) for split in settings.comoe_splits]
    if hindsight:
        tasks += [("limit", "hindsight")] + ([("limit", CROSSFIT)] if settings.crossfit else [])
    tasks += [(STATIC, ""), ("oracle", "")] + [("bound", str(w)) for w in bound_windows(spans, settings)]
    tasks.sort(key=_expected_order)  # the longest first, so that the workers finish together
    items = [(instance, steps, spans, settings, task) for task in tasks]
    # a fresh worker per task: a task's arrays and models are given back when it ends, so the
    # memory held at once is that of `jobs` tasks, not of every task a worker has run
    done = parallel_map(_run_task, items, settings.jobs, tasks_per_worker=1)
    return dict(zip(tasks, done, strict=True))


def serving_interval(instance: Instance, replan_every: int) -> Instance:
    """The instance CoMoE plans with: its copies spread over the `replan_every` steps each re-plan
    is judged over (`policy.replan_every`), unless the instance sets its own interval. The rows
    then weigh a copy against balance as `net_ms_per_replan` does."""
    if instance.policy.replan_every or not replan_every:
        return instance
    return with_overrides(instance, {"policy.replan_every": replan_every}, "compare --replan-every")


def _expected_order(task: Task) -> int:
    """Tasks in order of their usual length (measured on the scale suite's EP32 and EP64): CoMoE's
    search, the hindsight limits' `exact` solves, FlashLB's tree search, the bound's milp solves,
    then the engines' balancers and the oracle (about a second a window each)."""
    kind, name = task
    if kind == "peer":
        return {OURS: 0, comoe_task("even"): 0, "ascend-flashlb": 2}.get(name, 4)
    return {"limit": 1, "bound": 3}.get(kind, 4)


def _run_task(item: tuple[Instance, np.ndarray, list[tuple[int, int]], CompareSettings, Task]) -> Any:
    instance, steps, spans, settings, (kind, name) = item
    if kind == "peer":
        planned = instance
        if split_of(name) == "even":
            planned = with_overrides(instance, {"policy.split": "even"}, "compare")
        planner = Rolling(planned, name.removesuffix(EVEN_PLAN))
        run = replay(planner, steps, spans, instance.policy.history_windows)
        return run, planner.weight_report() if planner.name == OURS else None
    if kind == "limit":
        limit = Rolling(instance, "exact", time_limit_s=settings.hindsight_limit_s)
        foresight: Foresight = "hindsight" if name == "hindsight" else "crossfit"
        return replay(limit, steps, spans, instance.policy.history_windows, foresight)
    if kind == "oracle":
        return oracle_served(instance, steps, spans)
    if kind == STATIC:
        return replay(Static(Rolling(instance, BASELINE)), steps, spans, instance.policy.history_windows)
    return window_bound(instance, steps, spans, int(name), settings)


def peer_run(done: dict[Task, Any], peer: str, routing: str, settings: CompareSettings) -> Run:
    """`peer`'s replay scored under `routing` (CoMoE's: its plan for that dispatch; `STATIC`: EPLB's
    first plan kept)."""
    if peer == STATIC:
        return done[(STATIC, "")]
    return done[("peer", planned_for(routing, settings) if peer == OURS else peer)][0]


def planned_for(routing: str, settings: CompareSettings) -> str:
    """The task whose CoMoE plan is scored under `routing`: the one made for its split where
    CoMoE planned for it, else the other."""
    wanted = "even" if routing == "even" else "best"
    return comoe_task(wanted if wanted in settings.comoe_splits else settings.comoe_splits[0])


def comoe_task(split: str) -> str:
    """The name of CoMoE's task planned for `split`."""
    return f"{OURS}{EVEN_PLAN}" if split == "even" else OURS


def split_of(task_name: str) -> str:
    return "even" if task_name.endswith(EVEN_PLAN) else "best"


def row_of(
    peer: str, routing: str, served: Served, run: Run | None, timing: LayerTime, copies: bool = True
) -> dict[str, Any]:
    """A table row: the modelled MoE layer time (per step and layer, ms), a re-plan's stall, the
    imbalance's percentiles, the engines' balancedness, copies and plan time."""
    ratio = served.imbalance
    layer_ms = served.layer_ms if served.layer_ms is not None else np.zeros_like(ratio)
    row: dict[str, Any] = {
        "peer": peer,
        "routing": routing,
        "layer_ms_p50": float(np.percentile(layer_ms, 50)),
        "layer_ms_p95": float(np.percentile(layer_ms, 95)),
        "layer_ms_mean": float(layer_ms.mean()),
        "step_ms_mean": float(layer_ms.sum(axis=1).mean()),  # every MoE layer of a step
        "migration_ms": run.migration_ms(timing.replan_copy_ms) if run is not None and copies else 0.0,
        "p50": float(np.percentile(ratio, 50)),
        "p95": float(np.percentile(ratio, 95)),
        "p99": float(np.percentile(ratio, 99)),
        "mean": float(ratio.mean()),
        "balancedness_sglang": served.balancedness_sglang(),
        "balancedness_vllm": served.balancedness_vllm(),
    }
    if run is not None:
        row["copies_per_replan"] = run.copies_per_replan() if copies else 0.0
        row["plan_s"] = float(np.mean(run.plan_s))
    return row


def add_net_time(rows: list[dict[str, Any]], replan_every: int) -> None:
    """Each planner row's `net_ms_per_replan`: the MoE layers' time it saves per step against
    `BASELINE`'s row of the same routing, times `replan_every` steps, minus its own re-plan stall
    (`BASELINE`'s row: minus its stall alone). Ranking rows by it ranks them by total time over a
    re-plan interval. None without a baseline row, and for the limits (they do not re-plan)."""
    base = {r["routing"]: r["step_ms_mean"] for r in rows if r["peer"] == BASELINE}
    for row in rows:
        planner = row["peer"] not in LIMITS and row["routing"] in base
        saved = base[row["routing"]] - row["step_ms_mean"] if planner else 0.0
        row["net_ms_per_replan"] = saved * replan_every - row["migration_ms"] if planner else None


def _slots(instance: Instance, steps: np.ndarray) -> int | None:
    problem = residency_problem(instance, steps_demand(instance, steps[: instance.policy.window_batches]))
    return eplb_slots(problem)


def oracle_steps(steps: np.ndarray) -> np.ndarray:
    """Indices of the steps the oracle is scored on: every scored step, or `ORACLE_STEPS` of them
    spread evenly (its P95 then within a few hundredths of a percentile of all of them, at a fixed
    cost however long the trace: a 10^6-step dump spent 530 of 660 s planning one EPLB per step)."""
    n = steps.shape[0]
    if n <= ORACLE_STEPS:
        return np.arange(n)
    return np.floor((np.arange(ORACLE_STEPS) + 0.5) * n / ORACLE_STEPS).astype(np.int64)


def oracle_served(instance: Instance, steps: np.ndarray, spans: list[tuple[int, int]]) -> Served:
    """EPLB planned on each scored step's own counts, in place at once, optimally routed (whole
    tokens): the replay of one-step windows, each planned on itself."""
    scored = steps[spans[1][0] :]
    picked = scored[oracle_steps(scored)]
    layout = EplbLayout.of(instance, steps, "the oracle")
    one_step = [(t, t + 1) for t in range(picked.shape[0])]
    run = replay(EplbOnSteps(layout), picked, one_step, foresight="hindsight", warmup=False)
    return run.served(picked, "flow", instance.layer_time)


def bound_windows(spans: list[tuple[int, int]], settings: CompareSettings) -> list[int]:
    """The served windows the bound is taken on, `settings.bound_windows` spread evenly."""
    return [w + 1 for w in _spread(len(spans) - 1, settings.bound_windows)]  # window 0: warm-up


def window_problem(
    instance: Instance, steps: np.ndarray, spans: list[tuple[int, int]], w: int
) -> ResidencyProblem:
    """Window `w`'s planning problem: balance on its history's scenarios."""
    history = history_span(spans, w, instance.policy.history_windows)
    demand = steps_demand(instance, steps[history[0] : history[1]])
    return residency_problem(instance, demand, batches=spans[w][1] - spans[w][0])


def window_bound(
    instance: Instance, steps: np.ndarray, spans: list[tuple[int, int]], w: int, settings: CompareSettings
) -> float:
    """`milp`'s proven lower bound (ms, the constant left out) of window `w`'s planning objective.
    Only the bound is read, so the plan is not laid out within `policy.layer_slots`: the models
    leave that constraint to the layout (residency/layer_slots.py), their bound is the same."""
    problem = dataclasses.replace(window_problem(instance, steps, spans, w), layer_slots=0)
    limit = reproducible_limit("milp") if settings.bound_limit_s is None else settings.bound_limit_s
    return solve(problem, "milp", time_limit_s=limit).bound - problem.constant_ms


def bound_gaps(
    instance: Instance,
    steps: np.ndarray,
    spans: list[tuple[int, int]],
    runs: dict[str, Run],
    settings: CompareSettings,
    done: dict[Task, Any] | None = None,
) -> dict[str, Any]:
    """Each peer's mean gap (objective / bound − 1) on the planning objective of sampled served
    windows, to `milp`'s proven lower bound of it (from `done`, `run_tasks`' results, where there)."""
    chosen = bound_windows(spans, settings)
    gaps: dict[str, list[float]] = {peer: [] for peer in runs}
    bounds = []
    for w in chosen:
        problem = window_problem(instance, steps, spans, w)
        known = (done or {}).get(("bound", str(w)))
        bound = window_bound(instance, steps, spans, w, settings) if known is None else known
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


def percent(gap: float | None) -> str:
    return "–" if gap is None else f"{100 * gap:.1f}%"


def _spread(count: int, wanted: int) -> list[int]:
    if wanted <= 0:
        return []
    if count <= wanted:
        return list(range(count))
    return sorted({int(x) for x in np.linspace(0, count - 1, wanted).round()})


# ---- output


def markdown(result: dict[str, Any]) -> str:
    r = result
    cross = any(row["peer"] == CROSSFIT for row in r["rows"])
    crossfit = (
        "; cross-fitted (hindsight-crossfit): on its even steps for its odd ones and back." if cross else "."
    )
    head = (
        f"{r['instance']}: {r['steps']} steps in {r['windows']} windows (window 0 the warm-up: scored from"
        f" step {r['scored_from']}), {r['layers']} layers x {r['experts']} experts on {r['devices']}"
        f" devices, {r['slots_per_layer']} slots per layer."
        " Imbalance = largest / mean device load per (step, layer); balancedness = mean / largest"
        " (SGLang: per layer and step, averaged; vLLM: summed over layers, per step). Gap to bound:"
        f" on the planning objective of windows {r['bound']['windows']}, to milp's proven lower bound."
        f" Hindsight: exact {_within(r['hindsight_limit_s'])} per window, on its own steps{crossfit}"
    )
    scored = r["steps"] - r["scored_from"]
    if r["oracle_steps"] < scored:
        head += f" Oracle: on {r['oracle_steps']:,} of the {scored:,} scored steps, spread evenly."
    head += (
        f" Time: the MoE layer's modelled time per step and layer (ms; formulations/serving-time.md),"
        f" a re-plan's stall (ms, the device receiving the most copies), and the net time per re-plan"
        f" against EPLB's row of the same routing over {r.get('replan_every', REPLAN_EVERY):,} steps"
        " (higher is better). Static: EPLB's first plan kept, never re-planned."
    )
    planned = r.get("comoe_planned_for")
    if planned:
        head += " CoMoE's rows: " + ", ".join(
            f"{routing} planned for the {split} split" for routing, split in planned.items()
        )
        head += " (policy.split), its copies priced over the same interval (policy.replan_every)."
    lines = [
        head,
        "",
        "| peer | routing | layer ms P50 | layer ms P95 | stall ms | net ms / re-plan | P50 | P95 | P99"
        " | balancedness SGLang | balancedness vLLM | copies / re-plan | plan s | gap to bound |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["rows"]:
        copies = f"{row['copies_per_replan']:.1f}" if "copies_per_replan" in row else "–"
        plan = f"{row['plan_s']:.2f}" if "plan_s" in row else "–"
        gap = percent(row.get("gap_to_bound"))
        net = row.get("net_ms_per_replan")
        lines.append(
            f"| {row['peer']} | {row['routing']} | {row['layer_ms_p50']:.4g} | {row['layer_ms_p95']:.4g}"
            f" | {row['migration_ms']:,.1f} | {'–' if net is None else f'{net:+,.1f}'}"
            f" | {row['p50']:.3f} | {row['p95']:.3f} | {row['p99']:.3f}"
            f" | {row['balancedness_sglang']:.3f} | {row['balancedness_vllm']:.3f}"
            f" | {copies} | {plan} | {gap} |"
        )
    both = bool(result.get("migration_weight_even"))
    if result.get("migration_weight"):
        which = "For the best split (lp, flow rows): " if both else ""
        lines += ["", which + weight_line(result["migration_weight"])]
    if both:
        lines += ["", "For the even split (even rows): " + weight_line(result["migration_weight_even"])]
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
    for b in report.get("balance_backtests", []):
        scores = ", ".join(f"{mode} {ms:.4g}" for mode, ms in b["ms_per_step"].items())
        line += (
            f" Balance backtest at window {b['window']} (modelled ms per step on window {b['window'] - 1}:"
            f" {scores}) chose {b['mode']}."
        )
    if len(set(report.get("balance_per_window", []))) > 1 or report.get("balance_backtests"):
        line += f" policy.balance per window: {' '.join(report['balance_per_window'])}."
    return line


def _within(limit_s: float | None) -> str:
    return "on work limits" if limit_s is None else f"within {limit_s:g} s"
