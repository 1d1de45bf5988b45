"""Planning one window: demand → problem → solve, the one path every caller takes.

`plan_window` is the single owner of turning what the slow loop has seen (a
window of micro-batches, or load counts) into a placement: the `solve` and
`gap` verbs, the rolling horizon, the evaluator's runtime and the benchmark
runs all call it, so they plan the same window the same way.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from comoe_opt.deadline import Deadline
from comoe_opt.errors import ComoeError
from comoe_opt.instance import Instance
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.problem import TERMS, ResidencyProblem, residency_problem
from comoe_opt.residency.report import ResidencyResult
from comoe_opt.residency.solve import solve
from comoe_opt.stats.demand import WindowDemand, demand_from_step_counts, window_demand
from comoe_opt.stats.transitions import TransitionGraph, window_graph
from comoe_opt.trace.batching import MicroBatches
from comoe_opt.trace.counts import read_step_counts


@dataclass(frozen=True, eq=False)
class Plan:
    """A solved window: the result, and the data it was planned on."""

    result: ResidencyResult
    problem: ResidencyProblem
    demand: WindowDemand
    graph: TransitionGraph | None  # None when the demand came from load counts

    @property
    def placement(self) -> Placement | None:
        return self.result.solution


def plan_window(
    instance: Instance,
    history: MicroBatches | WindowDemand,
    previous: Placement | None = None,
    leased: np.ndarray | None = None,
    *,
    method: str = "milp",
    terms: frozenset[str] = TERMS,
    batches: int | None = None,
    time_limit_s: float | None = None,
    mip_gap: float | None = None,
    migration_weight: float | None = None,
) -> Plan:
    """Plan residency from `history` (micro-batches, or a demand built from load counts).

    `previous` is the placement serving now (copies are counted against it),
    `leased` the replicas that must stay, `batches` the micro-batches the plan
    will serve (default: as many as it was planned on). Without `time_limit_s`
    every phase ends on work limits (the same plan on any machine; `solve`
    passes the policy's `time_limit_s`, the online loop's budget); a time limit
    starts here, so that building the problem counts against it (report phase
    `problem`). The gap defaults to the policy's.
    `migration_weight` overrides the policy's (the rolling horizon's choice
    when the policy leaves it to the backtest, -1).
    """
    instance = priced(instance, migration_weight, previous)
    policy = instance.policy
    deadline = Deadline(math.inf if time_limit_s is None else time_limit_s)
    graph = None
    with deadline.phase("problem"):
        if isinstance(history, MicroBatches):
            graph = window_graph(history, policy)
            demand = window_demand(history, policy, graph)
        else:
            demand = history
        problem = residency_problem(instance, demand, previous, leased=leased, terms=terms, batches=batches)
    result = solve(problem, method, mip_gap=policy.mip_gap if mip_gap is None else mip_gap, deadline=deadline)
    return Plan(result, problem, demand, graph)


def priced(instance: Instance, migration_weight: float | None, previous: Placement | None) -> Instance:
    """The instance planning with `migration_weight` (None: the policy's). A weight left to the
    backtest (negative) is chosen by the rolling horizon; a lone window has copies only against a
    `previous` placement, and then needs a weight."""
    policy = instance.policy
    weight = policy.migration_weight if migration_weight is None else migration_weight
    if weight < 0 and previous is not None:
        raise ComoeError(
            "policy.migration_weight = -1 (chosen by backtest) plans through the rolling horizon;"
            " give a weight >= 0 to plan one window against a previous placement"
        )
    if weight == policy.migration_weight:
        return instance
    return dataclasses.replace(instance, policy=dataclasses.replace(policy, migration_weight=weight))


def steps_demand(instance: Instance, steps: np.ndarray) -> WindowDemand:
    """What a window is planned on from per-step selection counts [n, L, E] (a trace's or a load
    dump's alike): the policy's balance scenarios, the whole counts as EPLB's load."""
    policy = instance.policy
    demand = demand_from_step_counts(
        steps,
        instance.trace.tokens_per_batch,
        instance.model.top_k,
        policy.balance_scenarios,
        policy.balance_scenario_model,
        policy.scenario_pseudo_steps,
    )
    whole = np.round(steps).astype(np.int64)
    return dataclasses.replace(demand, step_counts=whole, load_counts=whole.sum(axis=0).astype(np.float64))


def counts_history(
    instance: Instance, source: str | Path | np.ndarray, window: int | None = None
) -> tuple[WindowDemand, np.ndarray]:
    """What a window is planned on from expert-load counts (a file: a `[layers, experts]` table or
    SGLang's recorder dump, one row per model layer; or the steps [steps, layers, experts]): the
    counts' steps (window `window` of the instance's windows, all of them when None) are the
    balance scenarios and the plan serves a window of the instance's length. Also returns the
    summed counts, the load engines pad their maps with."""
    model, policy = instance.model, instance.policy
    if isinstance(source, np.ndarray):
        steps = source
    else:
        steps = read_step_counts(
            source,
            model.layers,
            model.experts_per_layer,
            model_layer_ids=model.moe_layer_ids,
            model_layers=model.hidden_layers,
        )
    if window is not None:
        size = policy.window_batches
        count = -(-steps.shape[0] // size)
        if not 0 <= window < count:
            raise ComoeError(
                f"--window {window}: the counts' {steps.shape[0]} steps make {count} windows of"
                f" policy.window_batches = {size} (0..{count - 1})"
            )
        steps = steps[window * size : (window + 1) * size]
    demand = demand_from_step_counts(
        steps,
        instance.trace.tokens_per_batch,
        model.top_k,
        policy.balance_scenarios,
        policy.balance_scenario_model,
        policy.scenario_pseudo_steps,
    )
    return dataclasses.replace(demand, batches=policy.window_batches), steps.sum(axis=0)
