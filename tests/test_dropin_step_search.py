"""The search by steps (balancers/dropin/step_search.py): each pass takes, per layer, the swap off
its hottest GPU that a brute force over the same swaps finds best, its loads and objective stay
those of the plan, and the drop-in that opts into it keeps EPLB's shape and never plans worse than
its start."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from comoe_opt import rebalance_experts
from comoe_opt.balancers.dropin.config import SearchConfig, Work
from comoe_opt.balancers.dropin.objective import Shape, even_loads, normalised, step_weights
from comoe_opt.balancers.dropin.step_search import StepSearch, gpu_step_loads, step_objective
from comoe_opt.balancers.eplb import deepseek_eplb
from comoe_opt.best_split.even import slot_replicas


def _instance(seed: int, gpus: int, nodes: int, steps: int = 6, layers: int = 2, experts: int = 24):
    rng = np.random.default_rng(seed)
    history = rng.poisson(rng.gamma(0.6, 20.0, size=(layers, experts)), size=(steps, layers, experts))
    history = history.astype(np.float64) + 1.0
    slots = experts + gpus  # one spare slot per GPU
    plan = deepseek_eplb(history.sum(axis=0), slots, nodes, nodes, gpus)[0]
    return history, plan, normalised(history.transpose(1, 0, 2), gpus)


def _brute_best(slots, w, p, gpus, per_node, hot, partners, prev_n, price):
    """The best objective over every swap of a slot of `hot` with a slot of a GPU in `partners`."""
    per_gpu = slots.size // gpus
    best = np.inf
    for a in range(hot * per_gpu, (hot + 1) * per_gpu):
        for g in partners:
            for c in range(g * per_gpu, (g + 1) * per_gpu):
                trial = slots.copy()
                trial[a], trial[c] = trial[c], trial[a]
                value = step_objective(trial[None], w[None], p, gpus)[0]
                if prev_n is not None:
                    value += (
                        price * np.maximum(slot_replicas(trial[None], w.shape[-1], gpus)[0] - prev_n, 0).sum()
                    )
                best = min(best, value)
    return best


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**16), st.sampled_from([(4, 1), (4, 2), (6, 3), (8, 2)]), st.booleans())
def test_a_pass_takes_the_best_swap_off_the_hot_gpu(seed, gpus_nodes, with_previous):
    gpus, nodes = gpus_nodes
    _, plan, w = _instance(seed, gpus, nodes)
    shape = Shape(gpus, nodes, "even")
    prev_n = None
    if with_previous:
        rng = np.random.default_rng(seed + 1)
        prev = np.stack([row[rng.permutation(row.size)] for row in plan])
        prev_n = slot_replicas(prev, w.shape[-1], gpus)
    run = StepSearch(plan, w, shape, prev_n, 0.01, 4.0, Work(), partners=gpus)  # every partner
    before = run.objective.copy()
    p = step_weights(w.shape[1], 4.0)
    per_node = gpus // nodes
    expected = []
    for layer in range(plan.shape[0]):
        loads = run.loads[layer]  # [G, S]
        weight = np.zeros(gpus)
        np.add.at(weight, loads.argmax(axis=0), p)
        hot = int(weight.argmax())
        node = hot // per_node
        partners = [g for g in range(node * per_node, (node + 1) * per_node) if g != hot]
        sub = None if prev_n is None else prev_n[layer]
        expected.append(_brute_best(plan[layer], w[layer], p, gpus, per_node, hot, partners, sub, 0.01))
    run.descend(lambda: False, 1)
    for layer in range(plan.shape[0]):
        want = min(before[layer], expected[layer])
        assert np.isclose(run.objective[layer], want, rtol=1e-5, atol=1e-9)
    # the loads kept in place are the plan's, and so is the objective
    assert np.allclose(run.loads, gpu_step_loads(run.slots, w.transpose(0, 2, 1), gpus))
    assert np.allclose(run.loads.transpose(0, 2, 1), even_loads(run.slots, w, gpus))
    assert np.allclose(run.objective, step_objective(run.slots, w, p, gpus) + run.price())


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**16), st.sampled_from([(16, 2), (16, 1), (24, 3)]))
def test_the_drop_in_by_steps_keeps_eplb_shape_and_never_plans_worse(seed, gpus_nodes):
    gpus, nodes = gpus_nodes
    history, _, w = _instance(seed, gpus, nodes, steps=8, layers=3, experts=48)
    slots = 48 + gpus
    config = SearchConfig(step_search_gpus=12, eplb_guard=False)
    phy2log, _, logcnt = rebalance_experts(
        history.sum(axis=0), slots, nodes, nodes, gpus, history=history, config=config
    )
    eplb = deepseek_eplb(history.sum(axis=0), slots, nodes, nodes, gpus)[0]
    assert phy2log.shape == (3, slots)
    assert (logcnt >= 1).all() and (logcnt.sum(axis=1) == slots).all()
    assert np.array_equal(np.sort(phy2log, axis=1), np.sort(eplb, axis=1))  # the counts are EPLB's
    p = step_weights(8, 64.0)
    assert (step_objective(phy2log, w, p, gpus) <= step_objective(eplb, w, p, gpus) + 1e-9).all()


def test_the_search_by_steps_is_bounded_by_work_and_the_same_every_run():
    history, _, _ = _instance(7, 16, 2, steps=8, layers=3, experts=48)
    config = SearchConfig(step_search_gpus=12)
    args = (history.sum(axis=0), 64, 2, 2, 16)
    first = rebalance_experts(*args, history=history, config=config, effort=50.0)[0]
    again = rebalance_experts(*args, history=history, config=config, effort=50.0)[0]
    assert np.array_equal(first, again)
    one = rebalance_experts(*args, history=history, config=config, moves=1)[0]  # one pass
    assert np.array_equal(one, rebalance_experts(*args, history=history, config=config, moves=1)[0])


def test_the_report_names_the_search_that_planned():
    history, _, _ = _instance(3, 16, 2, steps=8, layers=2, experts=48)
    args = (history.sum(axis=0), 64, 2, 2, 16)
    by_steps = rebalance_experts(*args, history=history, explain=True)[-1]
    by_moments = rebalance_experts(
        *args, history=history, explain=True, config=SearchConfig(step_search_gpus=None)
    )[-1]
    eplb = rebalance_experts(*args, history=history, explain=True, method="eplb")[-1]
    assert (by_steps.search, by_moments.search, eplb.search) == ("by steps", "by moments", "")
    assert by_steps.summary().startswith("comoe (search by steps) for even dispatch")
