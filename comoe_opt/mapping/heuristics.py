"""Heuristic token-to-replica mappings, scored with the same makespan as the exact methods.

An expert's *candidates* are the chiplets that can serve it (its replicas; every
chiplet for an expert loaded on demand), in chiplet order.

* home: all of an expert's tokens go to one candidate, the first at or after
  chiplet `e mod C` (cyclically), so experts loaded on demand spread out;
* round-robin: the selection of token `s` goes to candidate `s mod m_e`
  (stateless, as engines that pick a replica from the token index);
* even split: an expert's selections, in token order, are cut into `m_e`
  contiguous blocks of equal size (+-1), the first block on candidate
  `e mod m_e`: what EPLB-style engines do;
* least-loaded: selections in token order, each to the candidate where it
  would finish first given what is already queued there (online greedy);
* power-of-two: each selection draws two distinct candidates (seeded) and
  takes the one where it would finish first.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import numpy as np

from comoe_opt.best_split.even import slot_of_selection
from comoe_opt.mapping.makespan import makespan_ticks, mapping_result, no_mapping
from comoe_opt.mapping.problem import MappingProblem
from comoe_opt.mapping.report import MappingResult
from comoe_opt.results import Status

Heuristic = Callable[[MappingProblem, np.ndarray, np.ndarray], np.ndarray]


def candidates(problem: MappingProblem) -> tuple[np.ndarray, np.ndarray]:
    """([E, C] candidates first, in chiplet order; [E] how many) of the problem's layer."""
    allowed = problem.costs.slots >= 0
    return np.argsort(~allowed, axis=1, kind="stable"), allowed.sum(axis=1)


def _run(name: str, problem: MappingProblem, rule: Heuristic) -> MappingResult:
    """Apply `rule(problem, cand, count) -> assignment` and score it with the common makespan."""
    began = time.perf_counter()
    cand, count = candidates(problem)
    if (count[problem.experts] == 0).any():  # an expert no chiplet can serve
        return no_mapping(name, Status.INFEASIBLE, problem, began)
    assignment = rule(problem, cand, count).astype(np.int16)
    span = makespan_ticks(problem.costs, problem.experts, assignment)
    return mapping_result(name, Status.FEASIBLE, problem, assignment, span, -np.inf, began)


def home(problem: MappingProblem) -> MappingResult:
    return _run("home", problem, _home)


def round_robin(problem: MappingProblem) -> MappingResult:
    return _run("round-robin", problem, _round_robin)


def even_split(problem: MappingProblem) -> MappingResult:
    return _run("even-split", problem, _even_split)


def least_loaded(problem: MappingProblem) -> MappingResult:
    return _run("least-loaded", problem, _least_loaded)


def power_of_two(problem: MappingProblem, seed: int = 0) -> MappingResult:
    """Deterministic for a given `seed`."""
    return _run("power-of-two", problem, functools.partial(_power_of_two, seed=seed))


def _home(problem: MappingProblem, cand: np.ndarray, count: np.ndarray) -> np.ndarray:
    costs = problem.costs
    shift = (np.arange(costs.chiplets)[None, :] - np.arange(costs.experts)[:, None]) % costs.chiplets
    home_of = np.where(costs.slots >= 0, shift, costs.chiplets).argmin(axis=1)
    return home_of[problem.experts]


def _round_robin(problem: MappingProblem, cand: np.ndarray, count: np.ndarray) -> np.ndarray:
    token = np.arange(problem.experts.shape[0])[:, None]
    return cand[problem.experts, token % count[problem.experts]]


def _even_split(problem: MappingProblem, cand: np.ndarray, count: np.ndarray) -> np.ndarray:
    """The engines' even split, the project's one rule (best_split/even.py)."""
    flat = problem.experts.ravel()
    slot = slot_of_selection(flat, count)
    return cand[flat, slot].reshape(problem.experts.shape)


def _least_loaded(problem: MappingProblem, cand: np.ndarray, count: np.ndarray) -> np.ndarray:
    return _online(problem, lambda e, i: cand[e, : count[e]].tolist())


def _power_of_two(problem: MappingProblem, cand: np.ndarray, count: np.ndarray, seed: int) -> np.ndarray:
    flat = problem.experts.ravel()
    m = count[flat]
    draws = np.random.default_rng(seed).random((flat.size, 2))
    first = (draws[:, 0] * m).astype(np.int64)
    second = (draws[:, 1] * np.maximum(m - 1, 1)).astype(np.int64)
    second = np.where(m > 1, second + (second >= first), first)  # distinct when there is a choice
    pairs = np.stack((cand[flat, first], cand[flat, second]), axis=1).tolist()
    return _online(problem, lambda e, i: pairs[i])


def _online(problem: MappingProblem, options: Callable[[int, int], list[int]]) -> np.ndarray:
    """Selections in token order, each to the first of its options where it would finish earliest.

    A chiplet's clock is when its queue ends; a token of `e` on `c` starts at
    the later of that and its page's first usable slot (one Python step per
    selection: these are the baselines, not the fast path).
    """
    costs = problem.costs
    tau = costs.token_time.tolist()
    ready = (costs.start[None, :] + costs.slots * costs.token_time).tolist()
    clock = costs.start.tolist()
    out = []
    for i, e in enumerate(problem.experts.ravel().tolist()):
        best, best_end = -1, 0
        for c in options(e, i):
            end = max(clock[c], ready[e][c]) + tau[c]
            if best < 0 or end < best_end:
                best, best_end = c, end
        clock[best] = best_end
        out.append(best)
    return np.array(out, dtype=np.int16).reshape(problem.experts.shape)


HEURISTICS: dict[str, Callable[[MappingProblem], MappingResult]] = {
    "home": home,
    "round-robin": round_robin,
    "even-split": even_split,
    "least-loaded": least_loaded,
    "power-of-two": power_of_two,
}
