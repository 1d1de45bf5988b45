"""The makespan of a token mapping: one definition, used by every method, and the
`SolveResult` every mapping method returns (`mapping_result`, `no_mapping`).

Chiplet `c` serves its tokens one per `token_time[c]` in slots starting at
`start[c]`; a token of expert `e` may use slot `j` only from `slots[e, c]`
on (its page is ready then). Serving tokens in order of their first usable
slot is optimal on one chiplet (Jackson's rule), which gives the closed form

    C_c = base_c + token_time_c * max_{j used on c} (j + #tokens on c with first slot >= j)

with `base = start + finish`. The makespan is the largest `C_c` over the
chiplets that serve at least one token (formulations/mapping.md §2).
"""

from __future__ import annotations

import time

import numpy as np

from comoe_opt.mapping.problem import NEVER, LayerCosts, MappingProblem
from comoe_opt.mapping.report import MappingReport, MappingResult
from comoe_opt.results import SolveResult, Status


def pair_counts(costs: LayerCosts, experts: np.ndarray, assignment: np.ndarray) -> np.ndarray:
    """[E, C] selections of each expert served on each chiplet; checks the mapping is valid."""
    if assignment.shape != experts.shape:
        raise ValueError(f"assignment shape {assignment.shape} differs from experts {experts.shape}")
    chiplet = assignment.ravel().astype(np.int64)
    if chiplet.size and (chiplet.min() < 0 or chiplet.max() >= costs.chiplets):
        raise ValueError("assignment names a chiplet out of range")
    expert = experts.ravel().astype(np.int64)
    if (costs.ready[expert, chiplet] == NEVER).any():
        raise ValueError("assignment sends a token to a chiplet that cannot serve its expert")
    flat = np.bincount(expert * costs.chiplets + chiplet, minlength=costs.experts * costs.chiplets)
    return flat.reshape(costs.experts, costs.chiplets)


def completion_ticks(costs: LayerCosts, counts: np.ndarray, slots: np.ndarray | None = None) -> np.ndarray:
    """[C] completion time of every chiplet (0 for an idle one) for [rows, C] counts.

    Rows are experts (`slots` defaults to the experts' first usable slots) or
    any grouping with its own `slots` rows.
    """
    slots = costs.slots if slots is None else slots
    row, chiplet = np.nonzero(counts)
    n = counts[row, chiplet].astype(np.int64)
    first = slots[row, chiplet]
    order = np.lexsort((-first, chiplet))  # per chiplet, latest first slot first
    n, first, chiplet = n[order], first[order], chiplet[order]
    total = np.cumsum(n)
    new_chiplet = np.r_[True, chiplet[1:] != chiplet[:-1]] if chiplet.size else np.zeros(0, bool)
    before = np.maximum.accumulate(np.where(new_chiplet, total - n, 0))
    finish = costs.base[chiplet] + costs.token_time[chiplet] * (first + total - before)
    out = np.zeros(costs.chiplets, dtype=np.int64)
    np.maximum.at(out, chiplet, finish)
    return out


def makespan_from_counts(costs: LayerCosts, counts: np.ndarray, slots: np.ndarray | None = None) -> int:
    """Makespan in ticks of [rows, C] counts."""
    return int(completion_ticks(costs, counts, slots).max())


def makespan_ticks(costs: LayerCosts, experts: np.ndarray, assignment: np.ndarray) -> int:
    """Makespan in ticks of `assignment[s, r]` (chiplet of each selection)."""
    return makespan_from_counts(costs, pair_counts(costs, experts, assignment))


def on_demand_loads(costs: LayerCosts, counts: np.ndarray) -> int:
    """(expert, chiplet) pairs that serve tokens without a resident replica: pages to load."""
    return int(((counts > 0) & ~costs.resident).sum())


def mapping_result(
    method: str,
    status: Status,
    problem: MappingProblem,
    assignment: np.ndarray,
    makespan: int,
    bound: float,
    began: float,
    report: MappingReport | None = None,
) -> MappingResult:
    """Objective and bound in seconds; the exact integers stay in the report.

    `assignment[s, r]` is the chiplet serving token `s`'s rank-`r` expert.
    `bound` is in ticks (-inf when the method proves nothing). `report` is the method's own
    (its `makespan_ticks` is `makespan`); without one, a plain `MappingReport`.
    """
    tick = problem.costs.tick_s
    if report is None:
        report = MappingReport(makespan_ticks=makespan, tick_s=tick)
    return SolveResult(
        method=method,
        status=status,
        objective=makespan * tick,
        bound=bound * tick if np.isfinite(bound) else -np.inf,
        runtime_s=time.perf_counter() - began,
        solution=assignment,
        report=report,
    )


def no_mapping(method: str, status: Status, problem: MappingProblem, began: float) -> MappingResult:
    """The result of a method that found no mapping (e.g. an expert no chiplet can serve)."""
    report = MappingReport(makespan_ticks=None, tick_s=problem.costs.tick_s)
    return SolveResult(method, status, np.inf, -np.inf, time.perf_counter() - began, report=report)
