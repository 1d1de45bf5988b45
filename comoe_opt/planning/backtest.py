"""The migration weight chosen per call by a rolling-origin backtest on the history the call is
given (`policy.migration_weight = -1`; formulations/residency.md, "Migration weight by backtest").

The price of a copied page against balance (`policy.migration_weight`) trades copies for balance,
and where that trade pays depends on how fast the load moves: never on a stationary trace, often on
one that shifts. So the rolling horizon chooses it from the trace it plans, only from windows it has
already served. At window w (the first at `FIRST_WINDOW`, then every `EVERY` windows):

* origin o = w − 1 (already seen, never window w): for each candidate weight in `WEIGHTS`, window o
  is re-planned as it was (the history before it, the placement that served o − 1, the leases then),
  the plan actually made for o standing in for its own weight;
* each candidate placement is scored on window o's own steps: per step, the sum over layers of the
  step's makespan under the split planned for (`policy.split`: the best routing, or the even
  split; as the slow loop's balance scenarios score it), plus the
  window's miss and NoP terms per step and the copies' link time (`replan_copy_ms` per page, no
  weight, times `policy.backtest_copy_share`, 1 by default) spread over the steps a plan serves
  (`policy.replan_every`; by default the window's own) — by
  default the planning objective at weight 1, on data the plan did not see;
* the scores of the last `POOLED_ORIGINS` origins are pooled (the choice does not flap), and the
  weight is the largest candidate (fewest copies) whose mean excess over the best candidate, step
  by step, is within one standard error of that excess (Breiman's one-standard-error rule): no
  tolerance constant. A candidate whose held-out placements are the current weight's own on every
  pooled origin (the same pages moved, the same score on every step) carries no evidence against
  it: the current weight is kept rather than swapped for it. An origin whose history holds nothing
  the previous plan had not seen (a load shift the window starts with, or none) moves no page at
  any weight above 0; the weights above 0 then tie, and the tie is not a reason to change.

Every solve runs on the work limits of an evaluation, so the choice is the same on any machine.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from comoe_opt.instance import Instance
from comoe_opt.residency.objective import scenario_makespans, score
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.problem import ResidencyProblem, residency_problem, served_share
from comoe_opt.stats.demand import demand_from_step_counts

AUTO = -1.0  # policy.migration_weight meaning "chosen per call by this backtest"
# candidate weights: free copies, then roughly 3x apart up to the copies' real time (1.0), a grid
# that brackets the trade-off, not values tuned on a trace
WEIGHTS = (0.0, 0.03, 0.1, 0.3, 1.0)
# before any origin has been scored (windows 1 and 2; window 0 is the initial load, copies free): the
# grid's geometric middle
PRIOR = 0.1
# the first window with an informative origin: window 2, re-planned from the windows before it
# against window 1's plan (window 1's only history is window 0, the very data window 0's plan came
# from, so re-planning it never moves a page whatever the weight)
FIRST_WINDOW = 3
# extra solves per planned window the backtest may add: planning time grows at most ~1.4x (the
# planning budget of the GPT-OSS evaluation, a median of 3 s per window, allows ~1.5x)
EXTRA_SOLVES = 0.4
EVERY = math.ceil((len(WEIGHTS) - 1) / EXTRA_SOLVES)  # windows between backtests (10)
POOLED_ORIGINS = 3  # origins whose held-out scores a choice pools


@dataclass(frozen=True, eq=False)
class Origin:
    """One held-out window: each candidate's per-step score (ms) and copies."""

    window: int
    step_ms: dict[float, np.ndarray]
    copies: dict[float, int]


@dataclass(frozen=True)
class WeightChoice:
    """The weight a window was planned with and, where a backtest chose it, the evidence."""

    window: int  # the window planned with it
    weight: float
    chosen_at: int | None  # the window whose backtest chose it (None: the prior, or user-fixed)
    origins: tuple[int, ...] = ()  # held-out windows pooled
    mean_ms: dict[float, float] = dataclasses.field(default_factory=dict)  # per step, per candidate
    excess_ms: dict[float, float] = dataclasses.field(default_factory=dict)  # over the best, per step
    se_ms: dict[float, float] = dataclasses.field(default_factory=dict)  # standard error of the excess
    copies: dict[float, float] = dataclasses.field(default_factory=dict)  # mean per origin

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"window": self.window, "weight": self.weight, "chosen_at": self.chosen_at}
        if self.origins:
            out["origins"] = list(self.origins)
            for key in ("mean_ms", "excess_ms", "se_ms", "copies"):
                out[key] = {f"{w:g}": float(v) for w, v in getattr(self, key).items()}
        return out


# re-plans window `origin` at a weight: (origin, weight) -> placement
Replan = Callable[[int, float], Placement]


class WeightBacktest:
    """The rolling horizon's choice of `policy.migration_weight`, window by window (`weight_for`)."""

    def __init__(self, instance: Instance, terms: frozenset[str], counts: Callable[[int, int], np.ndarray]):
        self.instance = instance
        self.terms = terms
        self.counts = counts  # [n, L, E] selections of steps start..stop
        self.origins: list[Origin] = []
        self.current = WeightChoice(0, PRIOR, None)

    def weight_for(
        self,
        w: int,
        spans: list[tuple[int, int]],
        served: list[Placement],
        planned_with: list[float],
        replan: Replan,
    ) -> WeightChoice:
        """The weight window `w` is planned with; a backtest on window w − 1 when one is due.
        `served[v]` is the placement that served window v, planned at weight `planned_with[v]`."""
        if backtest_due(w):
            origin = w - 1
            start, stop = spans[origin]
            plans = {
                weight: served[origin] if weight == planned_with[origin] else replan(origin, weight)
                for weight in WEIGHTS
            }
            steps = self.counts(start, stop)
            self.origins.append(held_out(self.instance, self.terms, steps, served[origin - 1], plans, origin))
            self.current = choose(self.origins[-POOLED_ORIGINS:], w, self.current.weight)
        return dataclasses.replace(self.current, window=w)


def backtest_due(w: int) -> bool:
    return w >= FIRST_WINDOW and (w - FIRST_WINDOW) % EVERY == 0


def held_out(
    instance: Instance,
    terms: frozenset[str],
    steps: np.ndarray,
    previous: Placement,
    plans: dict[float, Placement],
    window: int,
) -> Origin:
    """Each candidate placement scored on the held-out `steps` [n, L, E], every step a scenario."""
    problem = held_out_problem(instance, terms, steps, previous)
    # a copy's link time, unweighted (the share the policy charges: all of it unless told otherwise)
    copy_ms = instance.costs.replan_copy_ms * instance.policy.backtest_copy_share
    step_ms, copies = {}, {}
    for weight, placement in plans.items():
        terms_ms = score(problem, placement)
        per_step = (terms_ms.miss_ms + terms_ms.nop_ms) / problem.batches + copy_ms * terms_ms.pages_moved * (
            served_share(instance.policy, problem.batches) / problem.batches
        )
        step_ms[weight] = step_makespans(problem, placement) + per_step
        copies[weight] = terms_ms.pages_moved
    return Origin(window, step_ms, copies)


def held_out_problem(
    instance: Instance, terms: frozenset[str], steps: np.ndarray, previous: Placement
) -> ResidencyProblem:
    """The held-out window's problem: its every step a balance scenario, copies unpriced here."""
    n = steps.shape[0]
    demand = demand_from_step_counts(steps, instance.trace.tokens_per_batch, instance.model.top_k, n, "steps")
    if demand.scenario_tokens is None:  # one step: itself is the scenario
        demand = dataclasses.replace(demand, scenario_tokens=demand.tokens[None], batches=1)
    return residency_problem(instance, demand, previous, terms=terms | {"balance"}, batches=n)


def step_makespans(problem: ResidencyProblem, placement: Placement) -> np.ndarray:
    """[n] each held-out step's makespan summed over layers, under the split planned for (ms)."""
    assert problem.scenario_work_ms is not None, "held_out_problem keeps every step as a scenario"
    return sum(
        (scenario_makespans(problem, placement.resident[layer], layer) for layer in range(problem.layers)),
        np.zeros(problem.scenarios),
    )


def choose(origins: list[Origin], w: int, current: float = PRIOR) -> WeightChoice:
    """The largest weight whose pooled per-step excess over the best candidate is within one
    standard error of that excess (paired over the same held-out steps); `current`, the weight in
    force, where the held-out points cannot tell the two apart (`same_evidence`)."""
    pooled = {weight: np.concatenate([o.step_ms[weight] for o in origins]) for weight in WEIGHTS}
    mean = {weight: float(v.mean()) for weight, v in pooled.items()}
    best = min(WEIGHTS, key=lambda weight: (mean[weight], -weight))
    excess, se = {}, {}
    for weight, values in pooled.items():
        diff = values - pooled[best]
        excess[weight] = float(diff.mean())
        se[weight] = float(diff.std(ddof=1) / math.sqrt(diff.size)) if diff.size > 1 else 0.0
    chosen = max(weight for weight in WEIGHTS if excess[weight] <= se[weight])
    if current in WEIGHTS and same_evidence(origins, chosen, current):
        chosen = current
    copies = {weight: float(np.mean([o.copies[weight] for o in origins])) for weight in WEIGHTS}
    return WeightChoice(w, chosen, w, tuple(o.window for o in origins), mean, excess, se, copies)


def same_evidence(origins: list[Origin], weight: float, other: float) -> bool:
    """Whether two candidates moved the same pages and scored the same on every held-out step."""
    return all(
        o.copies[weight] == o.copies[other] and np.array_equal(o.step_ms[weight], o.step_ms[other])
        for o in origins
    )
