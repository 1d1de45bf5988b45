"""The drop-in's `even` planning on what comes next: the steps' moments weigh recent steps more
(`SearchConfig.half_life`), and the search starts from the better of EPLB's packing and a covariance-aware
one (`risk_pack`). Hand-checkable cases."""

from __future__ import annotations

import numpy as np
import pytest

import comoe_opt
from comoe_opt.balancers.dropin import objective as ds
from comoe_opt.balancers.dropin import rebalance as ep_balance
from comoe_opt.balancers.dropin.config import DEFAULT
from comoe_opt.balancers.dropin.even_search import EvenSearch
from comoe_opt.balancers.dropin.lp_search import LpSearch
from comoe_opt.balancers.dropin.starts import risk_pack

LIFE = DEFAULT.half_life

NO_LIMIT = 1e9


def test_step_weights_halve_every_half_life_and_sum_to_one():
    assert LIFE is not None
    p = ds.step_weights(3 * int(LIFE) + 1, LIFE)
    assert p.sum() == pytest.approx(1.0)
    assert p[-1] / p[-1 - int(LIFE)] == pytest.approx(2.0)  # a half-life back: half the weight
    assert p[-1] / p[0] == pytest.approx(8.0)  # three half-lives back: an eighth
    assert np.all(np.diff(p) > 0)  # the newest step weighs most
    assert ds.step_weights(1, LIFE).tolist() == [1.0]


def test_moments_are_the_recency_weighted_mean_and_variance():
    steps = np.array([[[4.0, 0.0]], [[0.0, 4.0]]])  # [S=2, layers=1, experts=2]
    w = ds.normalised(steps.transpose(1, 0, 2), 1)  # one GPU: each step's loads over its total
    assert w[0].tolist() == [[1.0, 0.0], [0.0, 1.0]]
    p = ds.step_weights(2, LIFE)  # the older step weighs 0.5 ** (1 / LIFE) of the newer
    m = ds.step_moments(w, LIFE)
    mean0 = p[0]
    assert m.mean[0].tolist() == pytest.approx([mean0, 1.0 - mean0])
    var0 = p[0] * (1.0 - mean0) ** 2 + p[1] * mean0**2
    assert m.var_w[0].tolist() == pytest.approx([var0, var0])
    # the deviations carry the weights: their mean product is the weighted covariance (-var0 here)
    assert (m.dev[0, 0] * m.dev[0, 1]).mean() == pytest.approx(-var0)


# two GPUs x 2 slots, four experts of equal mean: experts 0 and 2 burst together, 1 and 3 together.
# Their sums are equal, so EPLB (which sees only sums) pairs them in id order, {0, 2} and {1, 3}:
# every step is 4 : 0. Pairing each expert with one that bursts when it does not ({0, 1} and
# {2, 3}, or {0, 3} and {1, 2}) balances every step.
BURSTS = np.array([[[2.0, 0.0, 2.0, 0.0]], [[0.0, 2.0, 0.0, 2.0]]] * 8)


def _even_spans(plan: np.ndarray, steps: np.ndarray, gpus: int) -> np.ndarray:
    w = ds.normalised(steps.transpose(1, 0, 2), gpus)
    return ds.scores(plan, w, ds.Shape(gpus, 1, "even"))


def test_risk_pack_separates_experts_that_burst_together():
    w = ds.normalised(BURSTS.transpose(1, 0, 2), 2)
    eplb = comoe_opt.rebalance_experts(BURSTS.sum(axis=0), 4, 1, 1, 2, method="eplb")[0]
    assert _even_spans(eplb, BURSTS, 2).max() == pytest.approx(2.0)  # EPLB: each step 4 : 0
    packed = risk_pack(eplb, ds.step_moments(w, LIFE), 2, 1, ep_balance.RISK)
    gpu_of = {int(e): slot // 2 for slot, e in enumerate(packed[0])}
    assert gpu_of[0] != gpu_of[2] and gpu_of[1] != gpu_of[3]
    assert _even_spans(packed, BURSTS, 2).max() == pytest.approx(1.0)  # 2 : 2 on every step


def test_risk_pack_keeps_eplbs_replica_counts_and_nodes():
    rng = np.random.default_rng(3)
    steps = rng.poisson(rng.gamma(0.6, 6.0, size=(24, 2, 16))).astype(float)
    eplb = comoe_opt.rebalance_experts(steps.sum(axis=0), 24, 4, 2, 4, method="eplb")[0]
    w = ds.normalised(steps.transpose(1, 0, 2), 4)
    packed = risk_pack(eplb, ds.step_moments(w, LIFE), 4, 2, ep_balance.RISK)
    for layer in range(2):
        assert np.array_equal(np.sort(packed[layer]), np.sort(eplb[layer]))  # the same replicas
        for half in (slice(0, 12), slice(12, 24)):  # each node holds the experts EPLB put there
            assert set(packed[layer, half].tolist()) == set(eplb[layer, half].tolist())


def test_the_drop_in_starts_from_the_better_packing():
    """A search given no time at all returns its start: here the covariance-aware packing,
    which balances every step where EPLB's leaves each 4 : 0."""
    plan, _, _, report = comoe_opt.rebalance_experts(
        BURSTS.sum(axis=0), 4, 1, 1, 2, history=BURSTS, moves=0, explain=True
    )
    assert _even_spans(plan, BURSTS, 2).max() == pytest.approx(1.0)
    assert report.objective < report.eplb_objective


def test_expected_peaks_is_the_searchs_objective():
    rng = np.random.default_rng(8)
    steps = rng.poisson(rng.gamma(0.6, 6.0, size=(40, 3, 16))).astype(float)
    w = ds.normalised(steps.transpose(1, 0, 2), 4)
    plan = comoe_opt.rebalance_experts(steps.sum(axis=0), 20, 1, 1, 4, method="eplb")[0]
    run = EvenSearch(plan, ds.step_moments(w, LIFE), ds.Shape(4, 1, "even"), None, 0.0)
    assert ds.expected_peaks(plan, w, 4, ds.step_moments(w, LIFE)) == pytest.approx(run.objective)
    # one step: no spread, the objective is that step's peak
    one = w[:, :1]
    assert ds.expected_peaks(plan, one, 4, ds.step_moments(one, LIFE)) == pytest.approx(
        ds.scores(plan, one, ds.Shape(4, 1, "even"))[:, 0]
    )


def test_a_search_never_ends_above_its_start_on_the_objective():
    rng = np.random.default_rng(9)
    steps = rng.poisson(rng.gamma(0.5, 8.0, size=(48, 4, 16))).astype(float)
    previous = comoe_opt.rebalance_experts(steps[:24].sum(axis=0), 24, 1, 1, 4, method="eplb")[0]
    cost = ep_balance.MOVE_COST / 4  # per layer, in the report's means over layers
    for kwargs in ({}, {"previous": previous}):
        *_, report = comoe_opt.rebalance_experts(
            steps.sum(axis=0), 24, 1, 1, 4, history=steps, time_budget_s=NO_LIMIT, explain=True, **kwargs
        )
        # EPLB's packing is one of its starts; with `previous` the moves are paid for
        ours = report.objective + cost * report.moved
        assert ours <= report.eplb_objective + cost * report.eplb_moved + 1e-12


def test_guided_swaps_lead_to_the_target():
    """2 GPUs x 2 slots: the plan holds {0, 1} and {2, 3}, the target {0, 2} and {1, 3}. Expert 1
    is in excess on GPU 0 and short on GPU 1, expert 2 the reverse: every swap toward the target
    exchanges them, which reaches it."""
    plan, target = np.array([[0, 1, 2, 3]]), np.array([[0, 2, 1, 3]])
    w = ds.normalised(BURSTS.transpose(1, 0, 2), 2)
    lp = ds.Shape(2, 1, "lp")
    run = LpSearch(plan, w, lp, None, 0.0, np.random.default_rng(0), target=target)
    i, j, found = run._toward_target(np.array([0]), 20)
    assert found.all()
    assert {frozenset((int(plan[0, a]), int(plan[0, b]))) for a, b in zip(i[0], j[0], strict=True)} == {
        frozenset((1, 2))
    }
    # a plan already at its target has nothing to move toward
    at = LpSearch(target, w, lp, None, 0.0, np.random.default_rng(0), target=target)
    assert not at._toward_target(np.array([0]), 20)[2].any()
