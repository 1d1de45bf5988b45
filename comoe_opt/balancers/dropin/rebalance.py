"""A drop-in for DeepSeek EPLB's `rebalance_experts`, planning for the engine's dispatch.

`rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_gpus, ...)` has EPLB's
signature and return values (`phy2log`, `log2phy`, `logcnt`, see eplb.py), so an engine can call
it where it calls EPLB. It needs no instance file: devices, slots and loads are all it takes.

* `method="eplb"`: DeepSeek's algorithm as published (eplb.py).
* `method="comoe"` (default): per layer the best of EPLB's plan, a covariance-aware packing of
  EPLB's replicas and (given `previous`) the map in service, once moves are paid for (for
  `even`, a re-pack replaces the map in service only if it also scores better on each half of
  the steps, as every move of the search must: balancers/dropin/even_search.py); then the
  local search (balancers/dropin/search.py) on what the engine will see: each step's max/mean GPU load
  under `dispatch` — `"even"` (the engine splits an expert's tokens evenly over its replicas) or
  `"lp"` (it routes each batch by the best split, as SGLang's `--ep-dispatch-algorithm lp`),
  scored exactly as the slow loop's balance scenarios (the cut condition), recent steps weighing
  more. Steps are `history` ([steps, layers, experts], e.g. SGLang's recorder dump), or `weight`
  itself as one step. Past `SearchConfig.step_search_gpus` GPUs (12) the search runs by steps
  instead (balancers/dropin/step_search.py: swaps off each layer's hottest GPU, scored exactly
  on every step, from EPLB's plan or the map in service, at about EPLB's own cost).

The search keeps EPLB's shape: every expert at least once, `num_replicas / num_gpus` slots per
GPU, and in hierarchical mode every replica on the node its group is on. A move is kept only
when it lowers the layer's objective (score + `move_cost` per expert moved off `previous`), so
the plan never scores worse than its start. It stops when no layer improves or when its work
budget is spent: moves scored, covariances and cut sums counted at a typical machine's cost
(`work_budget`, sized from the input's shape as EPLB's own packing is), never read off the
clock. Given `previous`, experts that stay on their GPU keep their slot, and the `even` search
makes one pass (`PASSES_GIVEN_PREVIOUS`): each layer's best move and a few more, the next call
going on from the plan it leaves. `lp`'s moves are drawn from a seeded generator. The same input
gives the same plan on any machine and under any load, as every rank of an engine that runs the
balancer on its own copy of the all-reduced loads needs; only the opt-in `time_budget_s` makes
the plan depend on timing.
"""

from __future__ import annotations

import math
import operator
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from comoe_opt.balancers.dropin import backtest
from comoe_opt.balancers.dropin.backtest import Backtest
from comoe_opt.balancers.dropin.config import DEFAULT, SearchConfig, Work
from comoe_opt.balancers.dropin.even_search import EvenSearch
from comoe_opt.balancers.dropin.guard import guarded, newest_steps
from comoe_opt.balancers.dropin.lp_search import LpSearch
from comoe_opt.balancers.dropin.objective import (
    Moments,
    Shape,
    even_loads,
    expected_peaks,
    half_moments,
    half_weights,
    moved,
    normalised,
    peaks_of_loads,
    scores,
    step_mean,
    step_moments,
    step_weights,
    temperatures,
)
from comoe_opt.balancers.dropin.starts import risk_pack
from comoe_opt.balancers.dropin.step_search import StepSearch, step_peaks
from comoe_opt.balancers.dropin.timing import StepTimes, interval_price, uniform_rates
from comoe_opt.balancers.eplb import check_shape
from comoe_opt.balancers.eplb import deepseek_eplb as eplb_rebalance
from comoe_opt.balancers.maps import maps_of
from comoe_opt.best_split import sets as device_sets
from comoe_opt.best_split.cut_condition import MAX_ENUMERATED_CHIPLETS, unit_speed_bottlenecks
from comoe_opt.best_split.even import slot_replicas
from comoe_opt.best_split.pooled import base_pool, pooled_search
from comoe_opt.costs import LayerTime
from comoe_opt.errors import ComoeError, first_line
from comoe_opt.instance import MAX_PLACEMENT_CELLS

METHODS = ("comoe", "eplb")
DISPATCHES = ("even", "lp")
GUARD_STEPS = ("auto", "newest", "all")  # SearchConfig.guard_steps
MAX_HISTORY_STEPS = 128  # steps scored per layer (spread evenly): the search's cost grows with them
MAX_MOVES = 1_000_000  # per layer: about an hour per layer on one core, far past any use
# the drop-in's size limits (docs/api.md "Limits"): far past public MoE models (the most routed
# experts per layer today: 384, Kimi-K2; slots: 320 on 64 GPUs, DeepSeek-V3's largest EPLB
# setting) and what keeps every array of the search within a few hundred MB
MAX_LAYERS = 1024
MAX_EXPERTS = 4096  # per layer: one layer's pairwise covariances are 134 MB at this size
MAX_REPLICAS = 8192  # slots per layer
MAX_GPUS = 1024
MAX_LOAD = 1e15  # the load-count files' limit (formats.counts.MAX_COUNT; residency cannot import formats)
# default work budget: this many times what EPLB's own packing takes (upstream's torch EPLB
# measured 8-16x our port on the same inputs, so `even` stays within about twice upstream's time);
# the best split costs about thirty times more to score
BUDGET_TIMES_EPLB = {"even": 15.0, "lp": 300.0}
# the step search's budget (step_search.py, the default past SearchConfig.step_search_gpus): a tenth
# of EPLB's packing, so that the call as a whole (EPLB's plan, the steps' loads, the guard) stays
# within about twice EPLB's time at the scale suite's shapes (benchmarks/results/scale-plan-time.md);
# its first pass, one swap per layer, runs whatever the budget
STEP_BUDGET_TIMES_EPLB = 0.1
# what the budget is counted in (config.Work: model nanoseconds of a typical machine, the
# host and inputs of SearchConfig.ns_per_move): our EPLB port's packing per layer and slot
# (1.8-3.8 us measured), and the starts' cost (moments, covariance-aware packing, alignment) per
# layer, slot, GPU and step (7-17 ns measured), which the `even` budget pays first
EPLB_NS_PER_SLOT = 3300.0
START_NS_PER_CELL = 8.0
# the backtest's runs (balancers/dropin/backtest.py) share this many times the search's own work budget
BACKTEST_SHARE = 1.0
MOVE_COST = backtest.MOVE_PRICE  # the default price of a moved expert, in per-step max/mean (0.002)
# the covariance-aware start packs each replica where mean + RISK standard deviations of the GPU's
# load is least (chosen on GPT-OSS windows 1-32 among 0, 0.674, 1, 1.5 and 2)
RISK = 1.5
# given the map in service, the `even` search makes one pass a call (each layer's best confirmed
# move and up to `SearchConfig.extra_moves` more) and the next call goes on from there: the moves
# a call makes do not hang on the clock. Run to the end instead, it moved 0.109 of EPLB's experts
# on GPT-OSS (2 passes: 0.107) against 0.091, for 3.9-4.1% of (step, layer) above 0.97 x EPLB's
# P95 against 4.2%
PASSES_GIVEN_PREVIOUS: int | None = 1
EXPLAIN_STEPS = 32  # steps the explain report's redundancy check scores per layer


class ArgumentError(ComoeError, ValueError):
    """A bad argument of `rebalance_experts`: a `ValueError`, as EPLB's callers expect, and a
    `ComoeError`, as every user error of comoe-opt; its message names the argument."""


@dataclass(frozen=True)
class Report:
    """What a rebalance planned on, what it reached and what it costs (`explain=True`)."""

    method: str
    dispatch: str
    planned_on: str  # "history (S steps)", "weight", or why history was not used
    score: float  # mean over layers and steps of the planned max/mean GPU load under `dispatch`
    eplb_score: float  # EPLB's plan, scored the same way
    # what the search minimised, mean over layers (`even`: the expected peak), on the steps as
    # given (unsmoothed), weighted with the half-life it planned with
    objective: float
    eplb_objective: float  # EPLB's plan, kept in place, on the same objective
    moved: int  # experts copied to a GPU that did not hold them, relative to `previous` (0 without)
    eplb_moved: int  # EPLB's plan, kept in place the same way
    redundancy_gain: float | None  # share of EPLB's score bought by the redundant slots (None: none)
    redundancy_noise: float | None  # two standard errors of that gain over the steps
    stopped_by_time: bool  # the opt-in `time_budget_s` cut the search short
    seconds: float
    stopped_by_work: bool = False  # the work budget did (the plan is still the input's alone)
    backtest: Backtest | None = None  # the constants chosen and the scores behind them
    # layers where EPLB's plan balanced the newest steps better than the search's and serves (guard.py)
    eplb_layers: tuple[int, ...] = ()
    # which search planned: "by steps" (past SearchConfig.step_search_gpus), "by moments" (even),
    # "by pooled cuts" or "by enumerated cuts" (lp), with ", then by steps on time" when `timing`
    # was given; "" for method="eplb"
    search: str = ""

    @property
    def redundancy_measurable(self) -> bool | None:
        if self.redundancy_gain is None or self.redundancy_noise is None:
            return None
        return bool(self.redundancy_gain > self.redundancy_noise)

    def summary(self) -> str:
        lines = [
            f"{self.method}{f' (search {self.search})' if self.search else ''} for {self.dispatch} dispatch"
            f" on {self.planned_on} in {self.seconds:.3f} s"
            + (" (stopped by time_budget_s)" if self.stopped_by_time else "")
            + (" (stopped at its work budget)" if self.stopped_by_work else ""),
            f"mean per-step max/mean GPU load: {self.score:.4f} (EPLB {self.eplb_score:.4f})",
            f"experts moved: {self.moved} (EPLB kept in place: {self.eplb_moved})",
        ]
        if self.redundancy_gain is None:
            lines.append("redundant slots: none, or no plan without them fits these GPUs")
        else:
            verdict = (
                "measurable" if self.redundancy_measurable else "NOT measurable: they buy nothing you can see"
            )
            lines.append(
                f"redundant slots lower EPLB's max/mean by {100 * self.redundancy_gain:.2f}%"
                f" ± {100 * (self.redundancy_noise or 0.0):.2f}% on these steps: {verdict}"
            )
        if self.eplb_layers:
            lines.append(
                f"EPLB's plan balanced the newest steps better on {len(self.eplb_layers)} layer(s) and"
                f" serves there: {', '.join(map(str, self.eplb_layers))}"
            )
        if self.backtest is not None:
            lines.append(self.backtest.summary())
        return "\n".join(lines)


def rebalance_experts(
    weight: Any,
    num_replicas: int,
    num_groups: int,
    num_nodes: int,
    num_gpus: int,
    *,
    method: Literal["comoe", "eplb"] = "comoe",
    dispatch: Literal["even", "lp"] = "even",
    history: Any = None,
    previous: Any = None,
    move_cost: float | None = None,
    half_life: float | str | None = "auto",
    smooth: bool | None = None,
    calibrate: bool = False,
    time_budget_s: float | None = None,
    moves: int | None = None,
    effort: float = 1.0,
    seed: int = 0,
    explain: bool = False,
    clock: Callable[[], float] = time.perf_counter,
    config: SearchConfig = DEFAULT,
    timing: LayerTime | None = None,
    replan_every: int | None = None,
) -> tuple[Any, ...]:
    """(phy2log, log2phy, logcnt) as DeepSeek EPLB returns them (int64), for loads `weight`
    [layers, experts]: numpy arrays, or torch tensors on `weight`'s device when given tensors;
    with `explain=True` a `Report` follows them.

    `history` [steps, layers, experts] (optional) are per-step loads to plan on (all-zero steps,
    an engine recorder's unused rows, are dropped; if every step is zero, `weight` is planned on,
    as EPLB would). `previous` [layers, num_replicas] is the engine's current `phy2log`: experts
    that stay on their GPU keep their slot, and each expert moved costs `move_cost` (in per-step
    max/mean). `move_cost`, `half_life` (steps; None: all alike) and `smooth` (sparse counts shrunk
    toward the experts' rates) take their defaults unless given; with `calibrate=True` those not
    given are chosen by a backtest on `history` (balancers/dropin/backtest.py), and `explain`'s report holds
    its scores. The backtest is off by default: on the replays measured it took 3-6x the planning
    time and met no regime target it missed without it (benchmarks/results/dropin.md).
    The search stops when nothing improves or when its work budget is spent
    (`work_budget` of the input's shape, times `effort`; `float("inf")`: until nothing improves):
    the result is a function of the arguments alone. `moves` caps the moves scored per layer
    instead (given, it replaces the work budget). A bad argument raises `ArgumentError` (a
    `ValueError`) naming it.

    `timing` (a `costs.LayerTime` of `num_gpus` alike GPUs; `LayerTime.of_gpus` builds one from
    a slot's weight read, a selection's FLOPs and its dispatch and combine, in ms) makes the
    search minimise each step's modelled MoE layer time under the even split instead of its
    max/mean token load (timing.py), by steps at any size; the guard then judges both plans by
    that time. `weight` and `history` must then be token selections, not rates. With
    `replan_every` (the steps the plan will serve) and `move_cost` not given, a move is priced at
    `timing.replan_copy_ms` spread over those steps, in the objective's units (timing.py:
    `interval_price`), and the guard weighs it too.

    `time_budget_s` (off by default) adds a hard wall-clock cap, read on `clock` from the start
    of the call. With it the result depends on timing: the machine, its load, the moment. Engines
    that run the balancer on every rank must then compute it on rank 0 only and broadcast rank
    0's map, or ranks will route tokens to experts that are not where the others put them.
    """
    began = clock()
    if method not in METHODS:
        raise ArgumentError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if dispatch not in DISPATCHES:
        raise ArgumentError(f"dispatch must be one of {', '.join(DISPATCHES)}, got {dispatch!r}")
    num_replicas = _count("num_replicas", num_replicas)
    num_groups = _count("num_groups", num_groups)
    num_nodes = _count("num_nodes", num_nodes)
    num_gpus = _count("num_gpus", num_gpus)
    cap = None if moves is None else _count("moves", moves, low=0, high=MAX_MOVES)
    seed = _count("seed", seed, low=0)
    if move_cost is not None:
        move_cost = _real("move_cost", move_cost)
    if smooth is not None and not isinstance(smooth, (bool, np.bool_)):
        raise ArgumentError(f"smooth must be True, False or None, got {_shown(smooth)}")
    if not isinstance(calibrate, (bool, np.bool_)):
        raise ArgumentError(f"calibrate must be True or False, got {_shown(calibrate)}")
    life = _half_life(half_life)
    effort = _effort(effort)
    _check_limits(getattr(weight, "shape", ()), num_replicas, num_gpus)  # before an array is built
    load = _loads(weight, "weight")
    if load.ndim != 2 or 0 in load.shape:
        raise ArgumentError(f"weight must be [layers, experts], got shape {load.shape}")
    _check_limits(load.shape, num_replicas, num_gpus)  # a plain list's shape is known only now
    _check_sizes(load.shape, num_replicas, num_groups, num_nodes, num_gpus)
    layers, experts = load.shape
    budget = None if time_budget_s is None else _real("time_budget_s", time_budget_s)
    steps, planned_on = _history(history, load.shape)
    prev = _previous(previous, layers, num_replicas, experts)
    hierarchical = num_groups % num_nodes == 0 and num_nodes > 1
    rates = _timing(timing, num_gpus)
    if replan_every is not None:
        replan_every = _count("replan_every", replan_every)
        if timing is None or rates is None:
            raise ArgumentError("replan_every prices a move by timing's copy time: give timing too")
        if move_cost is None:
            raw_steps = load[:, None, :] if steps is None else steps.transpose(1, 0, 2)
            move_cost = interval_price(timing.replan_copy_ms, rates, raw_steps, num_gpus, replan_every)
    shape = Shape(num_gpus, num_nodes if hierarchical else 1, dispatch, rates is not None)
    eplb_out = eplb_rebalance(load, num_replicas, num_groups, num_nodes, num_gpus)
    eplb_map = eplb_out[0]
    scenarios = load[:, None, :] if steps is None else steps.transpose(1, 0, 2)
    by_steps = _by_steps(shape, config)
    budget_ns = work_budget(dispatch, layers, num_replicas, num_gpus, scenarios.shape[1], by_steps)
    work = Work(float("inf") if cap is not None else budget_ns * effort)
    w = normalised(scenarios, num_gpus)
    prev_n = None if prev is None else slot_replicas(prev, experts, num_gpus)
    if prev is not None:  # slots are renumbered at the end: the score sees only each GPU's experts
        eplb_map = align_gpus(eplb_map, prev, experts, num_gpus, shape.nodes)
    plan, stopped, tested, life_used = eplb_map, False, None, config.half_life
    eplb_layers = np.zeros(0, dtype=np.int64)
    if method == "comoe":
        expired, left = _clock_cap(clock, began, budget)
        call = _Call(
            shape, num_replicas, num_groups, num_nodes, prev, prev_n, seed, cap, expired, left,
            budget_ns, config, rates, scenarios,
        )  # fmt: skip
        raw = None if steps is None else steps.transpose(1, 0, 2)
        searched, tested, life_used = _plan_comoe(
            call, eplb_map, w, raw, (move_cost, life, smooth), calibrate, work
        )
        plan, stopped = searched.plan, searched.stopped
        if config.eplb_guard:  # the caller's price, when given, weighs EPLB's moves (guard.py)
            # the search by steps is guarded on the peaks it searched (for lp, the even split's:
            # an upper bound of the best split's, at a small part of its cost)
            judged = replace(shape, dispatch="even") if by_steps or shape.timed else shape
            on_all = shape.timed or _guard_on_all(config, by_steps)
            scored = searched.peaks if on_all else None  # the search's own per-step peaks
            if on_all and scored is None and rates is not None:  # judged by time all the same
                scored = (call.step_values(plan, w, scenarios), call.step_values(eplb_map, w, scenarios))
            plan, eplb_layers = guarded(
                plan, eplb_map, w, judged, prev_n, move_cost, config.guard_z, w if on_all else None, scored
            )
    if prev is not None:
        plan = keep_in_place(plan, prev, num_gpus)
    out: tuple[Any, ...] = maps_of(plan, experts)
    if plan is eplb_out[0]:  # EPLB's own arrays, its log2phy order included
        out = eplb_out
    if explain:
        seconds = clock() - began
        report = _report(
            method, dispatch, planned_on, plan, eplb_map, w, shape, prev_n, stopped, seconds, life_used
        )
        by_work = stopped and work.spent
        report = _replace(report, stopped_by_time=stopped and not by_work, stopped_by_work=by_work)
        report = _with_redundancy(report, load, scenarios, num_replicas, num_groups, num_nodes, shape)
        report = _replace(report, backtest=tested, eplb_layers=tuple(int(x) for x in eplb_layers))
        if method == "comoe":
            report = _replace(report, search=_search_name(shape, config))
        out = (*out, report)
    return _as_input(out, weight)


@dataclass(frozen=True)
class _Call:
    """What every part of one call's search shares: its validated shape and arguments, the map
    in service, and the opt-in clock."""

    shape: Shape
    replicas: int
    groups: int
    nodes: int
    prev: np.ndarray | None  # the map in service, [layers, replicas]
    prev_n: np.ndarray | None  # its replica counts [layers, experts, gpus]
    seed: int
    cap: int | None  # moves scored per layer, when given (it replaces the work budget)
    expired: Callable[[], bool]  # whether the opt-in clock's cap has passed
    left: Callable[[], float] | None  # seconds left of it (None: no clock)
    budget_ns: float  # the default work budget of the input's shape (`work_budget`)
    config: SearchConfig  # the search's knobs (a backtested half-life replaces the default's)
    rates: tuple[float, float, float] | None = None  # `timing`'s (read, flop, link) ms, when given
    steps: np.ndarray | None = None  # the steps planned on as selections [layers, S, E] (timing's scale)

    def times(self, raw: np.ndarray | None) -> StepTimes | None:
        """The time objective's rates on raw steps `raw` [layers, S, E] (None: the call's own)."""
        if self.rates is None:
            return None
        raw = self.steps if raw is None else raw
        assert raw is not None, "a timed call keeps its steps"
        return StepTimes.of(self.rates, raw, self.shape.gpus)

    def polish_work(self, steps: int) -> Work:
        """The timed descent's budget: the search by steps' default (`work_budget`)."""
        assert self.steps is not None
        layers, gpus = self.steps.shape[0], self.shape.gpus
        budget = work_budget(self.shape.dispatch, layers, self.replicas, gpus, steps, by_steps=True)
        return Work(float("inf") if self.cap is not None else budget)

    def step_values(self, plan: np.ndarray, w: np.ndarray, raw: np.ndarray | None) -> np.ndarray:
        """[layers, S] each step's value of `plan` on normalised steps `w` (step_peaks')."""
        w_t = np.ascontiguousarray(w.transpose(0, 2, 1))
        return step_peaks(plan, w_t, self.shape.gpus, self.times(raw))

    def work(self, share: float) -> Work:
        """A search's work budget: `share` of the default, or none when `cap` is given."""
        return Work(float("inf") if self.cap is not None else self.budget_ns * share)

    def eplb_of(self, raw: np.ndarray) -> np.ndarray:
        """EPLB's plan of raw steps [layers, S, E] (their sum), aligned to the map in service."""
        plan = eplb_rebalance(raw.sum(axis=1), self.replicas, self.groups, self.nodes, self.shape.gpus)[0]
        if self.prev is None:
            return plan
        return align_gpus(plan, self.prev, raw.shape[-1], self.shape.gpus, self.shape.nodes)


@dataclass(frozen=True)
class _Searched:
    """A search's plan [layers, slots], whether its budget cut it short, and (the search by steps,
    on unsmoothed steps) each step's max/mean GPU load [layers, S] of the plan and of EPLB's on the
    steps it searched, which the guard judging every step reads instead of scoring both again."""

    plan: np.ndarray
    stopped: bool
    peaks: tuple[np.ndarray, np.ndarray] | None = None


def _plan_comoe(
    call: _Call,
    eplb_map: np.ndarray,
    w: np.ndarray,
    raw: np.ndarray | None,
    fixed: tuple[float | None, float | str | None, bool | None],
    calibrate: bool,
    work: Work,
) -> tuple[_Searched, Backtest | None, float | None]:
    """(the search, the backtest when run, the half-life planned with): the search from the best
    start with the constants given (`fixed`: move cost, half-life, smoothing), the others
    backtested on `raw` when `calibrate`, else their defaults; layers the backtest kept as EPLB's
    or in service stay (the search's per-step peaks are then dropped)."""
    options = backtest.candidates(w.shape[1], 0.0 if raw is None else backtest.selection_rate(raw), *fixed)

    def planner(w_: np.ndarray, raw_: np.ndarray | None, c: backtest.Constants, share: float) -> np.ndarray:
        eplb_ = eplb_map if raw_ is None else call.eplb_of(raw_)
        return _comoe(call, eplb_, w_, raw_, c, call.work(share)).plan  # effort: the final run only

    tested = None
    if raw is not None and calibrate:
        price = backtest.MOVE_PRICE if fixed[0] is None else fixed[0]
        tested = backtest.run(
            raw, w, call.shape, call.prev_n, options, price, planner, call.eplb_of, BACKTEST_SHARE, call.prev
        )
    chosen = options[0] if tested is None else tested.chosen
    searched = _comoe(call, eplb_map, w, raw, chosen, work)
    plan = searched.plan
    if call.config.held_back and _by_steps(call.shape, call.config):
        plan = _held_back(call, plan, eplb_map, w, raw, chosen, fixed[0])
    if tested is not None and (tested.eplb_layers or tested.kept_layers):
        plan = plan.copy()
        plan[list(tested.eplb_layers)] = eplb_map[list(tested.eplb_layers)]
        if call.prev is not None:
            plan[list(tested.kept_layers)] = call.prev[list(tested.kept_layers)]
    peaks = searched.peaks if plan is searched.plan else None
    return _Searched(plan, searched.stopped, peaks), tested, chosen.half_life


def work_budget(
    dispatch: str, layers: int, replicas: int, gpus: int, steps: int, by_steps: bool = False
) -> float:
    """The search's default work budget (config.Work), from the input's shape alone:
    `BUDGET_TIMES_EPLB` times EPLB's packing at `EPLB_NS_PER_SLOT`, less (for `even`) the starts'
    cost at `START_NS_PER_CELL`; `STEP_BUDGET_TIMES_EPLB` times it for the search by steps. The
    search's first batch of moves runs whatever the budget."""
    if by_steps:
        return STEP_BUDGET_TIMES_EPLB * EPLB_NS_PER_SLOT * layers * replicas
    budget = BUDGET_TIMES_EPLB[dispatch] * EPLB_NS_PER_SLOT * layers * replicas
    if dispatch == "even":
        budget -= START_NS_PER_CELL * layers * replicas * gpus * steps
    return max(budget, 0.0)


def _comoe(
    call: _Call,
    eplb_map: np.ndarray,
    w: np.ndarray,
    raw: np.ndarray | None,
    c: backtest.Constants,
    work: Work,
) -> _Searched:
    """The search on normalised steps `w` [layers, S, E] (`raw`: their counts, for the smoothing
    and the time objective) with constants `c`, from the best of its starts; for a timed call, its
    plan then descended on the time objective by steps (timing.py)."""
    smoothed = backtest.smoothed(w, raw) if c.smooth and raw is not None else w
    searched = _token_search(call, eplb_map, smoothed, c, work)
    if not call.shape.timed:
        return searched if smoothed is w else replace(searched, peaks=None)  # peaks of the steps given
    polish = call.polish_work(w.shape[1])
    timed = _step_search(call, eplb_map, smoothed, c, polish, call.times(raw), searched.plan)
    peaks = timed.peaks if smoothed is w else None
    return _Searched(timed.plan, searched.stopped or timed.stopped, peaks)


def _token_search(
    call: _Call, eplb_map: np.ndarray, w: np.ndarray, c: backtest.Constants, work: Work
) -> _Searched:
    """The search of the max/mean token load on normalised steps `w` [layers, S, E] (smoothed, where
    they are): by steps past `step_search_gpus` GPUs, else by moments (`even`) or cuts (`lp`)."""
    experts, shape, prev = w.shape[-1], call.shape, call.prev
    config = replace(call.config, half_life=c.half_life)
    if _by_steps(shape, config):
        return _step_search(call, eplb_map, w, c, work)
    all_moments = step_moments(w, config.half_life)
    moments = all_moments if shape.dispatch == "even" else None
    packed = risk_pack(eplb_map, all_moments, shape.gpus, shape.nodes, RISK)
    if prev is not None:
        packed = align_gpus(packed, prev, experts, shape.gpus, shape.nodes)
    starts = [eplb_map, packed] if prev is None else [prev, eplb_map, packed]
    # given the map in service, a move off it must lower the objective on each half of the steps
    halves = None
    if shape.dispatch == "even" and prev is not None:
        halves = half_moments(w, config.cross_block, config.half_life)
    start = _best_start(starts, w, shape, call.prev_n, c.move_cost, moments, config, halves)
    return _Searched(*_search(call, config, start, w, c.move_cost, moments, packed, halves, work))


def _held_back(
    call: _Call,
    plan: np.ndarray,
    eplb_map: np.ndarray,
    w: np.ndarray,
    raw: np.ndarray | None,
    c: backtest.Constants,
    price: float | None,
) -> np.ndarray:
    """`plan` with EPLB's plan on each layer where the search, run on the steps `w` [L, S, E]
    without the newest quarter (guard.newest_steps), balances that quarter worse than EPLB's plan
    of all of them (the guard's test, out of sample); no check below `HELD_BACK` steps."""
    if w.shape[1] < backtest.HELD_BACK:
        return plan
    held = newest_steps(w)
    older = w.shape[1] - held.shape[1]
    older_raw = None if raw is None else raw[:, :older]
    trial = _comoe(call, eplb_map, w[:, :older], older_raw, c, call.work(1.0)).plan
    judged = replace(call.shape, dispatch="even")  # what the search by steps searched
    _, loses = guarded(trial, eplb_map, w, judged, call.prev_n, price, call.config.guard_z, held)
    if loses.size == 0:
        return plan
    plan = plan.copy()
    plan[loses] = eplb_map[loses]
    return plan


def _search_name(shape: Shape, config: SearchConfig) -> str:
    """The search a call runs, as `Report.search` names it (a timed call's: then by steps on time)."""
    then = ", then by steps on time" if shape.timed else ""
    if _by_steps(shape, config):
        return "by steps" + then
    if shape.dispatch == "even":
        return "by moments" + then
    return ("by pooled cuts" if shape.gpus > MAX_ENUMERATED_CHIPLETS else "by enumerated cuts") + then


def _guard_on_all(config: SearchConfig, by_steps: bool) -> bool:
    """Whether the guard judges every step of the history alike (else its newest quarter)."""
    if config.guard_steps not in GUARD_STEPS:
        raise ArgumentError(
            f"config.guard_steps must be one of {', '.join(GUARD_STEPS)}, got {config.guard_steps!r}"
        )
    return config.guard_steps == "all" or (config.guard_steps == "auto" and by_steps)


def _by_steps(shape: Shape, config: SearchConfig) -> bool:
    """Whether the search runs by steps (step_search.py): past `step_search_gpus` GPUs. For `lp`
    it searches the even split's peaks (an upper bound of the best split's: the even split is
    one routing `lp` may choose), the guard scoring the best split."""
    past = config.step_search_gpus
    return past is not None and shape.gpus > past


def _step_search(
    call: _Call,
    eplb_map: np.ndarray,
    w: np.ndarray,
    c: backtest.Constants,
    work: Work,
    times: StepTimes | None = None,
    searched: np.ndarray | None = None,
) -> _Searched:
    """The step search (step_search.py) on the max/mean load, or with `times` on each step's
    time, from `searched` (another search's plan) when given, else from the better, per layer, of
    the map in service and EPLB's plan, their moves paid for."""
    gpus = call.shape.gpus
    w_t = np.ascontiguousarray(w.transpose(0, 2, 1))  # [L, E, S]: what the search reads
    eplb_peaks = step_peaks(eplb_map, w_t, gpus, times)  # [L, S]
    starts = [searched] if searched is not None else [s for s in (call.prev, eplb_map) if s is not None]
    start = starts[0]
    if len(starts) > 1:
        p = step_weights(w.shape[1], c.half_life)
        values = np.stack(
            [
                (eplb_peaks if plan is eplb_map else step_peaks(plan, w_t, gpus, times)) @ p
                + c.move_cost * moved(slot_replicas(plan, w.shape[-1], gpus), call.prev_n)
                for plan in starts
            ]
        )  # [starts, L]
        best = values.argmin(axis=0)  # the first of equals: the map in service, then EPLB's
        start = np.stack(starts)[best, np.arange(best.size)]
    partners = call.config.step_partners
    run = StepSearch(start, w, call.shape, call.prev_n, c.move_cost, c.half_life, work, partners, w_t, times)
    swaps = run.pass_cells() // max(w.shape[1], 1) // run.layers  # scored per layer and pass
    passes = None if call.cap is None else -(-call.cap // max(swaps, 1))
    stopped = run.descend(call.expired, passes)
    return _Searched(run.slots, stopped, (run.peaks(), eplb_peaks))


def _timing(timing: Any, gpus: int) -> tuple[float, float, float] | None:
    """`timing`'s (read_ms, flop_ms, link_ms) per GPU, checked: a LayerTime of `gpus` alike GPUs
    with finite, non-negative rates, not all zero."""
    if timing is None:
        return None
    if not isinstance(timing, LayerTime):
        raise ArgumentError(f"timing must be a comoe_opt.costs.LayerTime, got {type(timing).__name__}")
    rates = uniform_rates(timing, gpus)
    if rates is None:
        raise ArgumentError(f"timing must time {gpus} alike GPUs (num_gpus), one rate each")
    if not all(math.isfinite(r) and r >= 0 for r in rates) or not any(rates):
        raise ArgumentError(f"timing's rates must be finite, >= 0 and not all 0, got {rates}")
    return rates


def _half_life(value: Any) -> float | str | None:
    """ "auto" (chosen by the backtest), None (all steps alike) or a positive number of steps."""
    if value is None or (isinstance(value, str) and value == "auto"):
        return value
    number = _real("half_life", value)
    if number == 0:
        raise ArgumentError("half_life must be positive, None (all steps alike) or 'auto'")
    return None if number == float("inf") else number


def _clock_cap(
    clock: Callable[[], float], began: float, budget: float | None
) -> tuple[Callable[[], bool], Callable[[], float] | None]:
    """(whether the opt-in wall-clock cap has passed, seconds left of it); without a cap the
    clock is never read and the plan depends on the input alone."""
    if budget is None:
        return (lambda: False), None
    deadline = began + budget
    return (lambda: clock() >= deadline), (lambda: deadline - clock())


def gpu_loads(phy2log: np.ndarray, load: np.ndarray, gpus: int) -> np.ndarray:
    """[..., gpus] load of every GPU when each expert's load is split evenly over its replicas
    (`phy2log` [slots], `load` [..., experts])."""
    counts = np.bincount(phy2log, minlength=load.shape[-1]).astype(np.float64)
    share = np.divide(load, counts, out=np.zeros_like(load, dtype=np.float64), where=counts > 0)
    per_slot = share[..., phy2log]
    return per_slot.reshape(*per_slot.shape[:-1], gpus, -1).sum(axis=-1)


def planned_score(phy2log: np.ndarray, scenarios: np.ndarray, gpus: int) -> float:
    """Mean over scenarios [S, experts] of the largest GPU load (even split)."""
    return float(gpu_loads(phy2log, scenarios, gpus).max(axis=-1).mean())


def keep_in_place(plan: np.ndarray, previous: np.ndarray, gpus: int) -> np.ndarray:
    """`plan` with each GPU's slots renumbered so that an expert the GPU held in `previous` keeps
    its slot there (the GPU's experts are unchanged; the others fill the freed slots in order)."""
    out = plan.copy()
    per_gpu = plan.shape[1] // gpus
    for layer in range(plan.shape[0]):
        for g in range(gpus):
            span = slice(g * per_gpu, (g + 1) * per_gpu)
            new, old = plan[layer, span].tolist(), previous[layer, span].tolist()
            if new == old:
                continue
            left = {e: new.count(e) for e in new}
            placed: list[int | None] = [None] * per_gpu
            for k, e in enumerate(old):
                if left.get(e, 0) > 0:
                    placed[k], left[e] = e, left[e] - 1
            rest = []
            for e in new:  # the arrivals, in the plan's order
                if left[e] > 0:
                    rest.append(e)
                    left[e] -= 1
            arrivals = iter(rest)
            out[layer, span] = [e if e is not None else next(arrivals) for e in placed]
    return out


def align_gpus(plan: np.ndarray, previous: np.ndarray, experts: int, gpus: int, nodes: int) -> np.ndarray:
    """`plan` with its GPUs (and nodes) relabelled to share the most replicas with `previous`:
    EPLB's plan is the same plan under any such relabelling, and an engine moves fewer experts."""
    from scipy.optimize import linear_sum_assignment  # SciPy loads where used

    new = slot_replicas(plan, experts, gpus)
    old = slot_replicas(previous, experts, gpus)
    per_gpu, per_node = plan.shape[1] // gpus, gpus // nodes
    out = np.empty_like(plan)
    for layer in range(plan.shape[0]):
        a = new[layer].reshape(experts, nodes, per_node)
        b = old[layer].reshape(experts, nodes, per_node)
        node_overlap = np.minimum(a.sum(2)[:, :, None], b.sum(2)[:, None, :]).sum(0)
        target = np.empty(gpus, dtype=np.int64)
        for n_new, n_old in zip(*linear_sum_assignment(-node_overlap), strict=True):
            overlap = np.minimum(a[:, n_new, :, None], b[:, n_old, None, :]).sum(0)
            for g_new, g_old in zip(*linear_sum_assignment(-overlap), strict=True):
                target[n_new * per_node + g_new] = n_old * per_node + g_old
        out[layer].reshape(gpus, per_gpu)[target] = plan[layer].reshape(gpus, per_gpu)
    return out


def _search(
    call: _Call,
    config: SearchConfig,
    start: np.ndarray,
    w: np.ndarray,
    move_cost: float,
    moments: Moments | None = None,
    target: np.ndarray | None = None,
    halves: tuple[Moments, Moments] | None = None,
    work: Work | None = None,
) -> tuple[np.ndarray, bool]:
    """(plan, whether the work budget or the opt-in clock cut the search short)."""
    shape, prev_n, cap, expired = call.shape, call.prev_n, call.cap, call.expired
    rng = np.random.default_rng(call.seed)
    work = Work() if work is None else work
    iterations = None if cap is None else -(-cap // config.candidates)
    if shape.dispatch == "even":
        assert moments is not None
        run_even = EvenSearch(
            start, moments, shape, prev_n, move_cost, config=config, work=work, halves=halves
        )
        passes = None if cap is None else -(-cap // run_even.neighbourhood_size())
        if passes is None and prev_n is not None:
            passes = PASSES_GIVEN_PREVIOUS
        stopped = run_even.descend(expired, passes, call.left)
        # its moments are updated exactly (float64): only strict gains
        plan, changed = run_even.slots.copy(), np.flatnonzero((run_even.slots != start).any(axis=1))
        worse = changed[run_even.objective[changed] > run_even.start_objective[changed]]
        plan[worse] = start[worse]
        return plan, stopped
    if shape.gpus > MAX_ENUMERATED_CHIPLETS:
        return _pooled_search(call, config, start, w, move_cost, rng, iterations, work)
    run = LpSearch(start, w, shape, prev_n, move_cost, rng, config=config, work=work, target=target)
    stopped = run.run(expired, iterations)
    plan, changed = run.slots.copy(), np.flatnonzero((run.slots != start).any(axis=1))
    if changed.size:  # candidates are scored in float32: keep a start where float64 disagrees
        sub = None if prev_n is None else prev_n[changed]
        life = config.half_life
        new = _objective(plan[changed], w[changed], shape, sub, move_cost, None, life)
        worse = changed[new > _objective(start[changed], w[changed], shape, sub, move_cost, None, life)]
        plan[worse] = start[worse]
    return plan, stopped


def _pooled_search(
    call: _Call,
    config: SearchConfig,
    start: np.ndarray,
    w: np.ndarray,
    move_cost: float,
    rng: np.random.Generator,
    iterations: int | None,
    work: Work,
) -> tuple[np.ndarray, bool]:
    """`lp` on more GPUs than can be enumerated: best_split/pooled.py's rounds over every layer
    at once, each round's result kept per layer only where it is exactly better, so the plan is
    never worse, exactly, than `start`."""
    return pooled_search(_LpRounds(call, config, w, move_cost, rng, iterations, work), start.copy())


@dataclass
class _LpRounds:
    """The drop-in's pooled rounds: moves scored in float32 on per-layer pools, an absolute
    tolerance, a round cut short by the work budget or the clock not checked."""

    call: _Call
    config: SearchConfig
    w: np.ndarray
    move_cost: float
    rng: np.random.Generator
    iterations: int | None
    work: Work
    check_cut_short: bool = False

    def exact(
        self, plan: np.ndarray, pools: list[np.ndarray] | None
    ) -> tuple[np.ndarray, list[np.ndarray]] | None:
        return _exact(self.call, plan, self.w, self.move_cost, pools, self.config.half_life)

    def search(self, plan: np.ndarray, pools: list[np.ndarray]) -> tuple[np.ndarray, bool]:
        call = self.call
        run = LpSearch(
            plan, self.w, call.shape, call.prev_n, self.move_cost, self.rng,
            config=self.config, work=self.work, pools=pools,
        )  # fmt: skip
        cut_short = run.run(self.call.expired, self.iterations)
        return run.slots, cut_short

    def keep(
        self, best: np.ndarray, value: np.ndarray, found: np.ndarray, found_value: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        better = found_value < value - 1e-12
        best[better], value[better] = found[better], found_value[better]
        return best, value

    def stop(self) -> bool:
        return False  # `search` reads the clock and the work budget itself


def _exact(
    call: _Call,
    plan: np.ndarray,
    w: np.ndarray,
    move_cost: float,
    pools: list[np.ndarray] | None,
    half_life: float | None,
) -> tuple[np.ndarray, list[np.ndarray]] | None:
    """(objective per layer, pools grown by each step's bottleneck) for `lp` by min cut; None
    when the opt-in clock's deadline passes first (the min cuts are not cut by work: a round's
    result is always checked)."""
    n = slot_replicas(plan, w.shape[-1], call.shape.gpus)
    values, grown = np.empty(plan.shape[0]), []
    for layer in range(plan.shape[0]):
        if call.expired():
            return None
        spans, masks = unit_speed_bottlenecks(n[layer] > 0, w[layer])
        values[layer] = step_mean(spans, half_life)
        base = base_pool(call.shape.gpus) if pools is None else pools[layer]
        grown.append(device_sets.union(base, masks))
    return values + move_cost * moved(n, call.prev_n), grown


def _objective(
    plan: np.ndarray,
    w: np.ndarray,
    shape: Shape,
    prev_n: np.ndarray | None,
    move_cost: float,
    moments: Moments | None,
    half_life: float | None,
) -> np.ndarray:
    """[layers] what the search minimises: the expected peak (`even`, on `moments` when at hand)
    or the mean best-split max/mean (`lp`), steps weighted with `half_life`, plus the moves' price."""
    n = slot_replicas(plan, w.shape[-1], shape.gpus)
    if shape.dispatch == "even":
        value = expected_peaks(plan, w, shape.gpus, moments or step_moments(w, half_life))
    else:
        value = step_mean(scores(plan, w, shape), half_life)
    return value + move_cost * moved(n, prev_n)


def _best_start(
    starts: list[np.ndarray],
    w: np.ndarray,
    shape: Shape,
    prev_n: np.ndarray | None,
    move_cost: float,
    moments: Moments | None,
    config: SearchConfig,
    halves: tuple[Moments, Moments] | None = None,
) -> np.ndarray:
    """Per layer, the start that scores best once its moves are paid for (the first on ties);
    with `halves`, a start other than the first (the map in service) only where it also scores
    better than the first on each half of the steps, before its moves' price."""
    if len(starts) == 1:
        return starts[0]
    life = config.half_life
    values = np.stack([_objective(plan, w, shape, prev_n, move_cost, moments, life) for plan in starts])
    weights = None if halves is None else half_weights(w.shape[1], config.cross_block, life)
    if halves is not None and weights is not None:
        loads = [even_loads(plan, w, shape.gpus) for plan in starts]  # each step's, once
        for half, p in zip(halves, weights, strict=True):
            t = temperatures(half, shape.gpus)
            on_half = np.stack([peaks_of_loads(plan_loads, p, t) for plan_loads in loads])
            values[1:][on_half[1:] >= on_half[0]] = np.inf
    pick = values.argmin(axis=0)
    return np.stack(starts)[pick, np.arange(pick.size)]


def _report(
    method: str,
    dispatch: str,
    planned_on: str,
    plan: np.ndarray,
    eplb_map: np.ndarray,
    w: np.ndarray,
    shape: Shape,
    prev_n: np.ndarray | None,
    stopped: bool,
    seconds: float,
    half_life: float | None,
) -> Report:
    """The report, its objectives with the steps weighted as the search weighed them."""
    experts = w.shape[-1]
    moments = step_moments(w, half_life) if shape.dispatch == "even" else None
    score = float(scores(plan, w, shape).mean())
    eplb_score = float(scores(eplb_map, w, shape).mean())
    ours_moved = int(moved(slot_replicas(plan, experts, shape.gpus), prev_n).sum())
    eplb_moved = int(moved(slot_replicas(eplb_map, experts, shape.gpus), prev_n).sum())
    objective = float(_objective(plan, w, shape, prev_n, 0.0, moments, half_life).mean())
    eplb_objective = float(_objective(eplb_map, w, shape, prev_n, 0.0, moments, half_life).mean())
    return Report(
        method, dispatch, planned_on, score, eplb_score, objective, eplb_objective, ours_moved, eplb_moved,
        None, None, stopped, seconds,
    )  # fmt: skip


def _with_redundancy(
    report: Report,
    load: np.ndarray,
    scenarios: np.ndarray,
    replicas: int,
    groups: int,
    nodes: int,
    shape: Shape,
) -> Report:
    """The report with what EPLB's redundant slots buy on the steps (at most `EXPLAIN_STEPS` per
    layer) under the dispatch, against EPLB with one slot per expert, and two standard errors."""
    experts = load.shape[1]
    if replicas == experts:
        return report
    try:
        lean = eplb_rebalance(load, experts, groups, nodes, shape.gpus)[0]
    except ValueError:  # one slot per expert does not divide over these GPUs
        return report
    full = eplb_rebalance(load, replicas, groups, nodes, shape.gpus)[0]
    pick = np.unique(
        np.linspace(0, scenarios.shape[1] - 1, min(EXPLAIN_STEPS, scenarios.shape[1])).astype(int)
    )
    w = normalised(scenarios[:, pick], shape.gpus)
    with_spare, without = scores(full, w, shape).ravel(), scores(lean, w, shape).ravel()
    diff, base = without - with_spare, float(without.mean())
    noise = 2.0 * float(diff.std(ddof=1)) / np.sqrt(diff.size) if diff.size > 1 else float("inf")
    gain = float(diff.mean()) / base if base > 0 else 0.0
    return _replace(report, redundancy_gain=gain, redundancy_noise=float(noise / base) if base > 0 else 0.0)


def _replace(report: Report, **changes: Any) -> Report:
    return replace(report, **changes)


def _as_input(arrays: tuple[Any, ...], weight: Any) -> tuple[Any, ...]:
    """numpy, or torch tensors on `weight`'s device when `weight` is one (a report stays)."""
    if not _is_torch(weight):
        return arrays
    import torch

    def convert(x: Any) -> Any:
        if not isinstance(x, np.ndarray):
            return x
        return torch.from_numpy(np.ascontiguousarray(x)).to(weight.device)

    return tuple(convert(x) for x in arrays)


def _history(history: Any, shape: tuple[int, ...]) -> tuple[np.ndarray | None, str]:
    """(steps to plan on or None, what was planned on)."""
    if history is None:
        return None, "weight"
    steps = _loads(history, "history")
    if steps.ndim != 3 or steps.shape[1:] != shape:
        raise ArgumentError(f"history must be [steps, {shape[0]}, {shape[1]}], got shape {steps.shape}")
    used = steps.reshape(steps.shape[0], -1).any(axis=1)  # unused recorder rows are zero
    if not used.all():
        steps = steps[used]
    if steps.shape[0] == 0:
        return None, "weight (history holds no step with any load)"
    if steps.shape[0] > MAX_HISTORY_STEPS:
        pick = np.floor((np.arange(MAX_HISTORY_STEPS) + 0.5) * steps.shape[0] / MAX_HISTORY_STEPS)
        steps = steps[pick.astype(np.int64)]
    return steps, f"history ({steps.shape[0]} steps)"


def _previous(previous: Any, layers: int, replicas: int, experts: int) -> np.ndarray | None:
    """The engine's current phy2log [layers, num_replicas], every expert on some slot."""
    if previous is None:
        return None
    try:
        array = np.asarray(previous.detach().cpu().numpy() if _is_torch(previous) else previous)
    except (TypeError, ValueError) as exc:  # ragged nested lists
        raise ArgumentError(
            f"previous must be an integer array [{layers}, {replicas}]: {first_line(exc)}"
        ) from None
    if array.shape != (layers, replicas):
        raise ArgumentError(f"previous must be [{layers}, {replicas}], got shape {array.shape}")
    if array.dtype.kind not in "iu":
        raise ArgumentError(f"previous must hold integer expert ids, got dtype {array.dtype}")
    if array.min() < 0 or array.max() >= experts:
        raise ArgumentError(f"previous must hold expert ids in 0..{experts - 1}")
    present = np.zeros((layers, experts), dtype=bool)
    present[np.arange(layers)[:, None], array] = True
    if not present.all():
        layer, expert = (int(i) for i in np.argwhere(~present)[0])
        raise ArgumentError(f"previous[{layer}] holds no slot of expert {expert}")
    return array.astype(np.int64)


def _real(name: str, value: Any) -> float:
    """A finite, non-negative real number (bools refused)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ArgumentError(f"{name} must be a real number, got {_shown(value)}")
    number = float(value)
    if not np.isfinite(number) or number < 0:
        raise ArgumentError(f"{name} must be finite and non-negative, got {number!r}")
    return number


def _effort(value: Any) -> float:
    """A positive multiple of the work budget; infinity runs the search until nothing improves."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ArgumentError(f"effort must be a real number, got {_shown(value)}")
    number = float(value)
    if np.isnan(number) or number <= 0:
        raise ArgumentError(f"effort must be positive, got {number!r}")
    return number


def _is_torch(value: Any) -> bool:
    return type(value).__module__.startswith("torch")


def _count(name: str, value: Any, low: int = 1, high: int | None = None) -> int:
    """`value` as an int in [low, high]; floats (even 4.0) and bools are refused, as upstream's
    integer arithmetic would misuse them."""
    try:
        if isinstance(value, (bool, np.bool_)):
            raise TypeError
        number = operator.index(value)
    except TypeError:
        raise ArgumentError(f"{name} must be an integer, got {_shown(value)}") from None
    if number < low:
        raise ArgumentError(f"{name} must be at least {low}, got {number}")
    if high is not None and number > high:
        raise ArgumentError(f"{name} must be at most {high:,}, got {number:,}")
    return number


def _check_limits(weight_shape: Any, replicas: int, gpus: int) -> None:
    """The documented size limits on `weight`'s shape (an array's before any array is built from
    it; a list's once read) and on the slots and GPUs."""
    shape = tuple(int(d) for d in weight_shape)
    if len(shape) == 2 and shape[0] > MAX_LAYERS:
        raise ArgumentError(f"weight has {shape[0]:,} layers; at most {MAX_LAYERS:,}")
    if len(shape) == 2 and shape[1] > MAX_EXPERTS:
        raise ArgumentError(f"weight has {shape[1]:,} experts per layer; at most {MAX_EXPERTS:,}")
    if replicas > MAX_REPLICAS:
        raise ArgumentError(f"num_replicas must be at most {MAX_REPLICAS:,}, got {replicas:,}")
    if gpus > MAX_GPUS:
        raise ArgumentError(f"num_gpus must be at most {MAX_GPUS:,}, got {gpus:,}")


def _check_sizes(shape: tuple[int, ...], replicas: int, groups: int, nodes: int, gpus: int) -> None:
    """Upstream's divisibility rules, then the project's size limit on the arrays the plan needs
    (phy2log per GPU for the packing, log2phy at its widest)."""
    layers, experts = shape
    try:
        check_shape(experts, replicas, groups, nodes, gpus)
    except ValueError as exc:
        raise ArgumentError(str(exc)) from None
    for what, cells in (
        ("layers x num_replicas x num_gpus", layers * replicas * gpus),
        ("layers x experts x (num_replicas - experts + 1)", layers * experts * (replicas - experts + 1)),
    ):
        if cells > MAX_PLACEMENT_CELLS:
            raise ArgumentError(f"{what} = {cells:,} exceeds {MAX_PLACEMENT_CELLS:,}")


def _loads(value: Any, name: str) -> np.ndarray:
    """Loads as float64, from numpy or torch of any real dtype (bf16 and fp16 widen exactly);
    each finite, non-negative and at most `MAX_LOAD`."""
    if _is_torch(value):
        value = _torch_numpy(value, name)
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as exc:  # ragged nested lists
        raise ArgumentError(f"{name} must be a numeric array: {first_line(exc)}") from None
    if array.dtype.kind not in "iuf":
        raise ArgumentError(f"{name} must hold real numbers, got dtype {array.dtype}")
    array = np.asarray(array, dtype=np.float64)  # a copy only if it is not float64 already
    if array.size and array.min() >= 0 and array.max() <= MAX_LOAD:  # NaN fails both
        return array
    bad = ~np.isfinite(array) | (array < 0) | (array > MAX_LOAD)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        index = "".join(f"[{i}]" for i in where)
        problem = f"must be finite, non-negative and at most {MAX_LOAD:g}"
        raise ArgumentError(f"{name}{index} {problem}, got {float(array[where])!r}")
    return array


def _torch_numpy(tensor: Any, name: str) -> np.ndarray:
    """A tensor's values in numpy; bf16 (which numpy lacks) and fp16 widen to float32 exactly."""
    tensor = tensor.detach().cpu()
    if tensor.dtype.is_complex or str(tensor.dtype) == "torch.bool":
        raise ArgumentError(f"{name} must hold real numbers, got dtype {tensor.dtype}")
    if tensor.dtype.is_floating_point and tensor.element_size() < 4:
        tensor = tensor.float()
    return tensor.numpy()


def _shown(value: Any) -> str:
    text = first_line(ValueError(repr(value)))
    return text if len(text) <= 60 else text[:57] + "..."
