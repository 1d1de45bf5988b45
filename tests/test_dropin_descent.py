"""The drop-in's `even` search: steepest descent over every move of a layer, and, given the map in
service, moves checked on two halves of the steps (`half_moments`). Hand-made cases."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import comoe_opt
from comoe_opt.balancers.dropin import objective as ds
from comoe_opt.balancers.dropin import rebalance as ep_balance
from comoe_opt.balancers.dropin.config import DEFAULT, SearchConfig
from comoe_opt.balancers.dropin.even_search import EvenSearch
from comoe_opt.best_split.even import slot_replicas

SHAPE = ds.Shape(8, 1, "even")
LIFE = DEFAULT.half_life
UNCHECKED = replace(DEFAULT, cross_block=None, eplb_guard=False)  # the search alone, no halves check


def _steps(seed: int, steps: int = 64, layers: int = 3, experts: int = 32) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.poisson(rng.gamma(0.5, 8.0, size=(steps, layers, experts))).astype(float)


def _search(
    steps: np.ndarray,
    slots: int,
    previous: np.ndarray | None = None,
    nodes: int = 1,
    config: SearchConfig = DEFAULT,
) -> EvenSearch:
    plan = comoe_opt.rebalance_experts(steps.sum(axis=0), slots, 4, nodes, SHAPE.gpus, method="eplb")[0]
    w = ds.normalised(steps.transpose(1, 0, 2), SHAPE.gpus)
    prev = None if previous is None else slot_replicas(previous, steps.shape[2], SHAPE.gpus)
    shape = ds.Shape(SHAPE.gpus, nodes, "even")
    return EvenSearch(plan, ds.step_moments(w, LIFE), shape, prev, 0.002, config=config)


@pytest.mark.parametrize("nodes", [1, 2])
def test_moves_scored_in_bulk_match_the_full_score(nodes):
    steps = _steps(1)
    eplb = comoe_opt.rebalance_experts(steps.sum(axis=0), 40, 4, nodes, 8, method="eplb")[0]
    previous = np.roll(eplb, 5, axis=1)  # every layer's map in service moved by a few slots
    for prev in (None, previous):
        run = _search(steps, 40, prev, nodes)
        c = run._neighbourhood(np.arange(3))
        assert c.swap.any() and not c.swap.all()  # both kinds of move
        fast = run._all_objectives(c)
        full = run._candidate_objectives(run._counted(c))
        assert np.array_equal(np.isfinite(fast), np.isfinite(full))
        assert np.isfinite(full).sum() > 1000
        finite = np.isfinite(full)
        assert fast[finite] == pytest.approx(full[finite], rel=1e-5)  # scored in float32, to choose by


def test_the_neighbourhood_is_every_move():
    """2 GPUs x 3 slots holding experts 0, 1, 2 | 0, 3, 1: the 9 swaps across the GPUs less the
    two that exchange an expert with itself, and each slot of expert 0 or 1 (two replicas each)
    given to any other expert."""
    plan = np.array([[0, 1, 2, 0, 3, 1]])
    w = ds.normalised(np.ones((1, 4, 4)), 2)
    run = EvenSearch(plan, ds.step_moments(w, LIFE), ds.Shape(2, 1, "even"), None, 0.0)
    c = run._neighbourhood(np.array([0]))
    valid = c.valid[0]
    swaps = {
        (int(e), int(f)) for e, f, s, ok in zip(c.e[0], c.f[0], c.swap[0], valid, strict=True) if s and ok
    }
    assert int((c.swap[0] & valid).sum()) == 7
    assert swaps == {(0, 3), (0, 1), (1, 0), (1, 3), (2, 0), (2, 3), (2, 1)}
    gifts = {
        (int(e), int(f), int(g))
        for e, f, g, s, ok in zip(c.e[0], c.f[0], c.gi[0], c.swap[0], valid, strict=True)
        if ok and not s
    }
    assert gifts == {(e, f, g) for e in (0, 1) for f in range(4) if f != e for g in (0, 1)}


def test_descent_applies_the_best_move_of_the_whole_neighbourhood_first():
    steps = _steps(2)
    run = _search(steps, 40, config=replace(DEFAULT, extra_moves=0))
    c = run._neighbourhood(np.arange(3))
    objective = run._candidate_objectives(run._counted(c))
    best = objective.argmin(axis=1)
    run.descend(lambda: False, iterations=1)
    # one pass: each layer took its best move, and the plan's objective is that move's
    assert run.objective == pytest.approx(objective[np.arange(3), best], rel=1e-12)
    for layer in range(3):
        slots = run.slots[layer]
        i, j = c.i[layer, best[layer]], c.j[layer, best[layer]]
        assert slots[i] == c.f[layer, best[layer]]
        if c.swap[layer, best[layer]]:
            assert slots[j] == c.e[layer, best[layer]]


def test_a_converged_descent_has_no_improving_move_left():
    steps = _steps(3)
    run = _search(steps, 40)
    start = run.objective.copy()
    assert not run.descend(lambda: False)
    assert np.all(run.objective < start)
    left = run._candidate_objectives(run._counted(run._neighbourhood(np.arange(3))))
    assert np.all(left.min(axis=1) >= run.objective - 1e-12)
    assert np.array_equal(slot_replicas(run.slots, 32, 8), run.n)


# 32 steps of one layer, 2 GPUs of 2 slots, map in service {0, 1} | {2, 3}. In alternate blocks
# of 8 steps (`SearchConfig.cross_block`), GPU 0's experts run hot (half A), or the loads are near
# even with GPU 1 a little heavier (half B): moving an expert of GPU 0 to GPU 1 pays on the whole history, but
# only half A asks for it, and on half B it makes the peak worse.
SIDE = (np.arange(32)[::-1] // 8) % 2
_NOISE = np.random.default_rng(0).normal(0.0, 0.5, size=(32, 4))
ONE_HALF = np.where(SIDE[:, None] == 0, [12.0, 12.0, 8.0, 8.0], [10.0, 10.5, 9.5, 10.6])[:, None, :]
ONE_HALF = ONE_HALF + _NOISE[:, None, :]
IN_SERVICE = np.array([[0, 1, 2, 3]])


def test_a_move_that_only_one_half_of_the_steps_asks_for_is_rejected():
    assert DEFAULT.cross_block == 8
    args = (ONE_HALF.sum(axis=0), 4, 1, 1, 2)
    search_only = replace(DEFAULT, eplb_guard=False)  # the search's own choice (guard.py aside)
    kept = comoe_opt.rebalance_experts(
        *args, history=ONE_HALF, previous=IN_SERVICE, moves=1000, config=search_only
    )[0]
    assert np.array_equal(kept, IN_SERVICE)
    # without the check, the search moves: the move lowers the objective on the whole history by
    # far more than its price, and on half B it raises it
    moved, *_, report = comoe_opt.rebalance_experts(
        *args, history=ONE_HALF, previous=IN_SERVICE, moves=1000, explain=True, config=UNCHECKED
    )
    assert report.moved > 0
    w = ds.normalised(ONE_HALF.transpose(1, 0, 2), 2)
    half_a, half_b = ds.half_moments(w, 8, LIFE)
    whole = ds.step_moments(w, LIFE)
    gain = ds.expected_peaks(IN_SERVICE, w, 2, whole) - ds.expected_peaks(moved, w, 2, whole)
    assert gain[0] > 10 * 0.002 * report.moved
    assert ds.expected_peaks(moved, w, 2, half_a)[0] < ds.expected_peaks(IN_SERVICE, w, 2, half_a)[0]
    assert ds.expected_peaks(moved, w, 2, half_b)[0] > ds.expected_peaks(IN_SERVICE, w, 2, half_b)[0]


def test_the_halves_are_alternate_blocks_weighted_as_the_whole():
    w = ds.normalised(ONE_HALF.transpose(1, 0, 2), 2)
    half_a, half_b = ds.half_moments(w, 8, LIFE)
    assert half_a.dev.shape[2] == half_b.dev.shape[2] == 16
    p = ds.step_weights(32, LIFE)
    for side, half in ((0, half_a), (1, half_b)):
        mask = np.equal(SIDE, side)
        q = p[mask] / p[mask].sum()
        assert half.mean == pytest.approx(np.einsum("lse,s->le", w[:, mask], q))
    assert SIDE[-8:].tolist() == [0] * 8  # the newest block is half A's
    assert ds.half_moments(w[:, :31], 8, LIFE) is None  # fewer than two blocks of 8 per half: no check
    assert ds.half_moments(w, 4, LIFE) is not None
    # the starts are scored on the halves from each step's GPU loads: the same objective
    loads = ds.even_loads(IN_SERVICE, w, 2)
    for half, q in zip((half_a, half_b), ds.half_weights(32, 8, LIFE), strict=True):
        t = ds.temperatures(half, 2)
        assert ds.peaks_of_loads(loads, q, t) == pytest.approx(
            ds.expected_peaks(IN_SERVICE, w, 2, half), rel=1e-12
        )


def test_without_the_map_in_service_there_is_no_half_check():
    """Moves are free then: the whole history decides, as with the check switched off."""
    args = (ONE_HALF.sum(axis=0), 4, 1, 1, 2)
    plan = comoe_opt.rebalance_experts(*args, history=ONE_HALF, moves=1000)[0]
    unchecked = comoe_opt.rebalance_experts(*args, history=ONE_HALF, moves=1000, config=UNCHECKED)[0]
    assert np.array_equal(plan, unchecked)


def test_given_the_map_in_service_a_call_makes_one_pass(monkeypatch):
    """From the map in service, each layer's best confirmed move and at most `extra_moves` more,
    however long the clock allows; run to the end, the search goes on."""
    steps = _steps(5, steps=96, layers=4)
    in_service = comoe_opt.rebalance_experts(steps[:48].sum(axis=0), 40, 1, 1, 8, history=steps[:48])[0]
    w = ds.normalised(steps.transpose(1, 0, 2), 8)
    kept = slot_replicas(in_service, 32, 8)
    shape, moments, halves = ds.Shape(8, 1, "even"), ds.step_moments(w, LIFE), ds.half_moments(w, 8, LIFE)

    def search() -> np.ndarray:
        call = ep_balance._Call(shape, 40, 1, 1, in_service, kept, 0, None, lambda: False, None, 0.0, DEFAULT)
        return ep_balance._search(call, DEFAULT, in_service, w, 0.002, moments, None, halves)[0]

    moved = np.maximum(slot_replicas(search(), 32, 8) - kept, 0).sum(axis=(1, 2))
    assert 0 < moved.max() <= 2 * (1 + DEFAULT.extra_moves)  # a swap moves two experts, a gift one
    monkeypatch.setattr(ep_balance, "PASSES_GIVEN_PREVIOUS", None)
    assert np.maximum(slot_replicas(search(), 32, 8) - kept, 0).sum() > moved.sum()
    # and the whole call does not hang on the clock: a standing clock gives a generous budget's plan
    monkeypatch.undo()
    args = (steps.sum(axis=0), 40, 1, 1, 8)
    plan = comoe_opt.rebalance_experts(*args, history=steps, previous=in_service, time_budget_s=1e9)[0]
    standing = comoe_opt.rebalance_experts(
        *args, history=steps, previous=in_service, time_budget_s=1.0, clock=lambda: 0.0
    )[0]
    assert np.array_equal(plan, standing)
