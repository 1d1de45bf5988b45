"""The one HiGHS adapter: every MILP and LP of the project is solved here, and HiGHS's
statuses are mapped onto the project's `Status` here and nowhere else.

* `solve_with_highs(model)` solves a Pyomo model through Pyomo's persistent
  HiGHS interface (`pyomo.contrib.appsi`), which accepts a warm start from
  the model's variable values and reports the incumbent and the dual bound of
  a time-limited solve without raising. The slow loop's replica-count and
  full models and the fast loop's exact reference use it.
* `DirectModel` is a persistent highspy model built from arrays, for models
  re-solved many times with rows and columns added between solves (the exact
  scenario model's row generation), where handing the model over through
  Pyomo would cost seconds per round.

No `threads` option is set: HiGHS keeps one thread pool per process and
refuses a different count once a solve has started it.

Every call is bounded: by a time limit (the online loop), or else by work
(`mip_work`: branch-and-bound nodes; `lp_work`: simplex iterations), so that
a run without a clock ends and gives the same answer on any machine. A call
with neither is a bug in its caller and raises `UnboundedSolve` before HiGHS
starts (tests/test_work_limits.py runs every verb through this check).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import highspy
import numpy as np
import pyomo.environ as pyo
from pyomo.contrib.appsi.base import TerminationCondition as TC
from pyomo.contrib.appsi.solvers import Highs

from comoe_opt.deadline import Deadline
from comoe_opt.results import Status

_STATUS = {
    TC.optimal: Status.OPTIMAL,
    TC.maxTimeLimit: Status.TIME_LIMIT,
    TC.maxIterations: Status.FEASIBLE,
    TC.objectiveLimit: Status.FEASIBLE,
    TC.infeasible: Status.INFEASIBLE,
    TC.infeasibleOrUnbounded: Status.INFEASIBLE,
    TC.unbounded: Status.UNBOUNDED,
    TC.interrupted: Status.TIME_LIMIT,
    TC.error: Status.ERROR,
    TC.unknown: Status.ERROR,
}


class UnboundedSolve(RuntimeError):
    """A solver call with neither a time limit nor a work limit: a bug in its caller."""


def mip_work(nodes: int) -> dict[str, int]:
    """HiGHS options bounding a MIP by work: at most `nodes` branch-and-bound nodes. HiGHS applies
    no simplex iteration limit inside a MIP, so the caller bounds the work of a node by the model's
    size (`nodes_within`)."""
    return {"mip_max_nodes": int(nodes)}


def lp_work(rows: int, columns: int) -> dict[str, int]:
    """HiGHS options bounding an LP by work: `LP_ITERATIONS_PER_ROW` simplex iterations per row and
    column, far above what a simplex needs (a few per row), so that it binds only on a model
    that cycles or stalls; an LP stopped on it proves nothing and its caller treats it so."""
    return {"simplex_iteration_limit": max(LP_MIN_ITERATIONS, LP_ITERATIONS_PER_ROW * (rows + columns))}


def nodes_within(rows: int, node_rows: int, most: int) -> int:
    """Branch-and-bound nodes for a MIP of `rows` rows on a budget of `node_rows` node-rows (a
    node's simplex work grows with the rows), at most `most` and at least one."""
    return max(1, min(most, node_rows // max(rows, 1)))


LP_ITERATIONS_PER_ROW = 50  # simplex iterations per row and column of an LP without a time limit
LP_MIN_ITERATIONS = 10_000  # ... and at least this many


def _bounded(time_limit_s: float | None, options: dict | None, mip: bool, size: int) -> dict:
    """The call's options, bounded by work: its own work limit; with a time limit and none of its
    own, the backstop (`BACKSTOP_NODES`, `lp_work`), so that no call rests on the clock alone; with
    neither, `UnboundedSolve`."""
    options = dict(options or {})
    if "mip_max_nodes" in options or (not mip and "simplex_iteration_limit" in options):
        return options
    if time_limit_s is None or not math.isfinite(time_limit_s):
        kind = "a node limit (mip_work)" if mip else "an iteration limit (lp_work)"
        raise UnboundedSolve(f"a HiGHS call without a time limit needs {kind}")
    return {**options, **(mip_work(BACKSTOP_NODES) if mip else lp_work(size, 0))}


# Nodes of a MILP run under a time limit without a work limit of its own: a backstop that no solve
# of this project's shapes reaches within its time (HiGHS explores a few thousand nodes a second on
# them: GPT-OSS windows' replica and cut models, 60 s)
BACKSTOP_NODES = 10_000_000


def handed_time_limit(seconds: float) -> float:
    """The time limit HiGHS is given for `seconds` of a deadline. HiGHS measures real seconds; the
    tests replace this (their deadlines run on fake clocks, and no result of theirs may rest on
    HiGHS's own clock: tests/conftest.py)."""
    return seconds


@dataclass(frozen=True)
class HighsOutcome:
    status: Status
    objective: float  # incumbent, inf when none
    bound: float  # dual bound, -inf when none
    runtime_s: float
    solver_status: str  # HiGHS's own termination condition, for reports
    handover_s: float = 0.0  # handing the model to HiGHS (included in runtime_s)


def solve_with_highs(
    model: pyo.ConcreteModel,
    *,
    time_limit_s: float | None = None,
    mip_gap: float | None = None,
    warm_start: bool = False,
    options: dict | None = None,
    deadline: Deadline | None = None,
) -> HighsOutcome:
    """Solve `model`, load the incumbent into its variables, return status and bounds.

    With a `deadline` the model is handed over first and HiGHS gets the time that remains after
    the hand-over (at most `time_limit_s`); when none remains, HiGHS is not started.
    """
    solver = Highs()
    solver.config.load_solution = False
    solver.config.stream_solver = False
    solver.config.warmstart = warm_start
    if mip_gap is not None:
        solver.config.mip_gap = mip_gap
    solver.highs_options = {"random_seed": 0, **(options or {})}
    start = time.perf_counter()
    handover = 0.0
    if deadline is not None:
        began = deadline.clock()
        _hand_over(solver, model)  # seconds for a large model: it counts against the deadline
        handover = deadline.clock() - began
        if deadline.expired():
            return HighsOutcome(Status.TIME_LIMIT, math.inf, -math.inf, handover, NOT_STARTED, handover)
        left = deadline.remaining()
        time_limit_s = left if time_limit_s is None else min(time_limit_s, left)
    solver.highs_options = {
        **solver.highs_options,
        **_bounded(time_limit_s, options, _has_integers(model), model.nconstraints() + model.nvariables()),
    }
    if time_limit_s is not None and math.isfinite(time_limit_s):
        solver.config.time_limit = max(handed_time_limit(time_limit_s), 0.01)
    results = solver.solve(model)
    runtime = time.perf_counter() - start
    status = _STATUS.get(results.termination_condition, Status.ERROR)
    objective = results.best_feasible_objective
    bound = results.best_objective_bound
    has_incumbent = objective is not None and abs(objective) != float("inf")
    if has_incumbent:
        results.solution_loader.load_vars()
    elif status in (Status.TIME_LIMIT, Status.FEASIBLE):
        status = Status.ERROR if status == Status.FEASIBLE else status
    return HighsOutcome(
        status=status,
        objective=float(objective) if has_incumbent else float("inf"),
        bound=float(bound) if bound is not None else float("-inf"),
        runtime_s=runtime,
        solver_status=str(results.termination_condition.name),
        handover_s=handover,
    )


NOT_STARTED = "not started: the time limit passed during the model hand-over"


def _has_integers(model: pyo.ConcreteModel) -> bool:
    return any(not v.is_continuous() for v in model.component_data_objects(pyo.Var, active=True))


def _hand_over(solver: Highs, model: pyo.ConcreteModel) -> None:
    """Give `model` to HiGHS now; `solve` then re-checks nothing (the model does not change)."""
    solver.set_instance(model)
    for key in list(solver.update_config.keys()):
        if key != "treat_fixed_vars_as_params":  # how fixed variables are handed over, not a check
            setattr(solver.update_config, key, False)


# ------------------------------------------------------------------ highspy directly

INF = highspy.kHighsInf
_MS = highspy.HighsModelStatus
_DIRECT_STATUS = {
    _MS.kOptimal: Status.OPTIMAL,
    _MS.kTimeLimit: Status.TIME_LIMIT,
    _MS.kInterrupt: Status.TIME_LIMIT,
    _MS.kSolutionLimit: Status.FEASIBLE,
    _MS.kIterationLimit: Status.FEASIBLE,
    _MS.kObjectiveBound: Status.FEASIBLE,
    _MS.kObjectiveTarget: Status.FEASIBLE,
    _MS.kInfeasible: Status.INFEASIBLE,
    _MS.kUnboundedOrInfeasible: Status.INFEASIBLE,
    _MS.kUnbounded: Status.UNBOUNDED,
}
_FEASIBLE = 2  # HiGHS's kSolutionStatusFeasible


class DirectModel:
    """A persistent HiGHS model built from arrays: columns and rows can be added between solves.
    No start solution is passed: HiGHS can return a given start's values with another solution's
    objective when presolve solves the model."""

    def __init__(self) -> None:
        self.h = highspy.Highs()
        self.h.setOptionValue("output_flag", False)
        self.h.setOptionValue("random_seed", 0)
        # queued until `flush`: HiGHS takes many columns or rows in one call far faster than one by one
        self._columns: list[tuple[np.ndarray, np.ndarray, np.ndarray, bool]] = []
        self._queued_columns = 0
        self._rows: list[tuple[float, float, np.ndarray, np.ndarray]] = []

    @property
    def columns(self) -> int:
        """Columns so far, queued ones included."""
        return self.h.getNumCol() + self._queued_columns

    @property
    def rows(self) -> int:
        """Rows so far, queued ones included."""
        return self.h.getNumRow() + len(self._rows)

    def add_columns(self, cost, lower, upper, integer: bool = False) -> int:
        """Queue columns (no coefficients yet; added at the next `flush`); returns the index of
        the first."""
        cost = np.asarray(cost, dtype=np.float64).reshape(-1)
        first = self.columns
        lower, upper = (np.asarray(b, np.float64).reshape(-1) for b in (lower, upper))
        self._columns.append((cost, lower, upper, integer))
        self._queued_columns += cost.size
        return first

    def add_row(self, lower: float, upper: float, index, value) -> None:
        """Queue a row `lower <= sum value * x[index] <= upper` (added at the next `flush`)."""
        index = np.asarray(index, dtype=np.int32)
        value = np.asarray(value, dtype=np.float64)
        if value.shape != index.shape:  # one value for every column (np.full is the fast case)
            value = np.full(index.shape, value) if value.ndim == 0 else np.broadcast_to(value, index.shape)
        self._rows.append((lower, upper, index, value))

    def _flush_columns(self) -> None:
        columns, self._columns = self._columns, []
        n, self._queued_columns = self._queued_columns, 0
        if not n:
            return
        first = self.h.getNumCol()
        empty = np.zeros(0, dtype=np.int32)
        cost, lower, upper = (np.concatenate([c[k] for c in columns]) for k in range(3))
        self.h.addCols(n, cost, lower, upper, 0, empty, empty, np.zeros(0))
        integer = np.concatenate([np.full(c[0].size, c[3], dtype=np.uint8) for c in columns])
        if integer.any():
            self.h.changeColsIntegrality(n, np.arange(first, first + n, dtype=np.int32), integer)

    def flush(self) -> int:
        """Hand the queued columns, then the queued rows, to HiGHS in one call each; returns how
        many rows."""
        self._flush_columns()
        rows, self._rows = self._rows, []
        if rows:
            sizes = np.array([r[2].size for r in rows])
            starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int32)
            self.h.addRows(
                len(rows),
                np.array([r[0] for r in rows]),
                np.array([r[1] for r in rows]),
                int(sizes.sum()),
                starts,
                np.concatenate([r[2] for r in rows]).astype(np.int32),
                np.concatenate([r[3] for r in rows]),
            )
        return len(rows)

    def set_offset(self, offset: float) -> None:
        self.h.changeObjectiveOffset(float(offset))

    def solve(
        self, *, time_limit_s: float | None = None, mip_gap: float | None = None, options: dict | None = None
    ) -> HighsOutcome:
        """Solve as the model stands; `options` (HiGHS's, e.g. `mip_max_nodes`) stay set after."""
        self.flush()
        options = _bounded(
            time_limit_s, options, self._has_integers(), self.h.getNumRow() + self.h.getNumCol()
        )
        for name, value in options.items():
            self.h.setOptionValue(name, value)
        if time_limit_s is not None:
            self.h.setOptionValue("time_limit", max(handed_time_limit(time_limit_s), 0.01))
        if mip_gap is not None:
            self.h.setOptionValue("mip_rel_gap", mip_gap)
        start = time.perf_counter()
        self.h.run()
        runtime = time.perf_counter() - start
        model_status = self.h.getModelStatus()
        info = self.h.getInfo()
        feasible = info.primal_solution_status == _FEASIBLE
        status = _DIRECT_STATUS.get(model_status, Status.ERROR)
        if not feasible and status is Status.FEASIBLE:
            status = Status.ERROR
        bound = info.mip_dual_bound if math.isfinite(info.mip_dual_bound) else float("-inf")
        return HighsOutcome(
            status=status,
            objective=info.objective_function_value if feasible else float("inf"),
            bound=bound,
            runtime_s=runtime,
            solver_status=self.h.modelStatusToString(model_status),
        )

    def _has_integers(self) -> bool:
        return bool(np.any(np.asarray(self.h.getLp().integrality_) != 0))

    def values(self, first: int = 0, count: int | None = None) -> np.ndarray:
        col = np.asarray(self.h.getSolution().col_value)
        return col[first:] if count is None else col[first : first + count]
