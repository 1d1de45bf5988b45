"""Evaluator: directory invariants, hand-computed metrics, strategies keep the router's experts."""

from __future__ import annotations

import numpy as np
import pytest

from comoe_opt.evaluator import fastmap
from comoe_opt.evaluator.directory import DirectoryError, ExpertDirectory
from comoe_opt.evaluator.layer import chiplet_finish, page_loads
from comoe_opt.evaluator.metrics import summarize
from comoe_opt.evaluator.runs import evaluate_strategy
from comoe_opt.evaluator.runtime import simulate
from comoe_opt.evaluator.strategies import STRATEGIES
from comoe_opt.instance import instance_from_table, with_overrides
from comoe_opt.trace import instance_batches
from comoe_opt.trace.io import write_trace
from comoe_opt.trace.model import Trace

# ------------------------------------------------------------- directory


def test_copy_is_usable_only_after_arrival_and_verification():
    d = ExpertDirectory(1, 2, 2)
    d.prepare((0, 0, 1), ready_at=5.0)
    assert not d.published(0)[0, 1]
    with pytest.raises(DirectoryError, match="preparing"):
        d.read(0, _pair(0, 1))
    d.publish_due(4.9)
    assert not d.published(0)[0, 1]
    d.publish_due(5.0)
    assert d.published(0)[0, 1]
    d.read(0, _pair(0, 1))
    d.release(0, _pair(0, 1))


def test_failed_copy_rolls_back():
    d = ExpertDirectory(1, 2, 2)
    d.prepare((0, 1, 0), ready_at=1.0, verified=False)
    d.publish_due(2.0)
    assert not d.held().any() and d.rolled_back == 1
    with pytest.raises(DirectoryError, match="absent"):
        d.read(0, _pair(1, 0))


def test_no_reclaim_while_a_token_reads():
    d = ExpertDirectory(1, 2, 2)
    d.install(np.array([[[True, False], [False, False]]]))
    d.read(0, _pair(0, 0))
    d.retire((0, 0, 0))
    assert d.held()[0, 0, 0] and d.reclaimed == 0  # still being read: kept
    with pytest.raises(DirectoryError, match="retiring"):
        d.read(0, _pair(0, 0))  # but no new reader may start
    d.release(0, _pair(0, 0))
    assert not d.held()[0, 0, 0] and d.reclaimed == 1


def test_release_without_reader_is_an_error():
    d = ExpertDirectory(1, 1, 1)
    d.install(np.ones((1, 1, 1), dtype=bool))
    with pytest.raises(DirectoryError):
        d.release(0, np.ones((1, 1), dtype=bool))


def _pair(e: int, c: int) -> np.ndarray:
    out = np.zeros((2, 2), dtype=bool)
    out[e, c] = True
    return out


# ------------------------------------------------------- layer formulas


def test_chiplet_finish_closed_form_matches_a_queue():
    rng = np.random.default_rng(0)
    for _ in range(50):
        exec_ = np.where(rng.random((6, 3)) < 0.5, rng.random((6, 3)), 0.0)
        ready = rng.random((6, 3)) * 2
        arrive = rng.random(3)
        finish = chiplet_finish(exec_, ready, arrive)
        for c in range(3):
            t = arrive[c]
            for e in sorted(np.flatnonzero(exec_[:, c] > 0), key=lambda e, c=c: ready[e, c]):
                t = max(t, ready[e, c]) + exec_[e, c]
            assert finish[c] == pytest.approx(t if (exec_[:, c] > 0).any() else 0.0)


def test_page_loads_are_sequential_on_the_shared_link():
    done = page_loads(np.array([1, 5, 3]), page_ms=2.0, derate=0.0, start_ms=1.0)
    assert done.tolist() == [7.0, 3.0, 5.0]  # heaviest expert first
    derated = page_loads(np.array([1, 1]), page_ms=2.0, derate=0.5, start_ms=0.0)
    assert derated.tolist() == pytest.approx([2.0 / 0.75, 4.0 / 0.75])


# ------------------------------------------------- hand-computed metrics

HAND = {
    "name": "hand",
    "model": {
        "layers": 2,
        "experts_per_layer": 2,
        "top_k": 1,
        "page_gb": 1.0,
        "hidden_size": 1000,
        "bytes_per_element": 1,
        "expert_gflop_per_token": 1.0,
    },
    "hardware": {
        "chiplets": 2,
        "capacity_gb": 2,
        "local_bandwidth_gb_s": 1000,  # page read 1 ms
        "peak_tflops": 1,  # 1 ms per token
        "d2d_bandwidth_gb_s": 1000,  # page load 1 ms; a token 1e-6 ms
        "nop_hops": 0,
        "hop_latency_ns": 0,
        "prefetch_buffer_gb": 0,
    },
    "trace": {"kind": "file", "path": "hand.npz", "tokens_per_batch": 4, "batching": "token-order"},
    "policy": {"window_batches": 1},
    "runtime": {"attention_ms": 0.5, "route_ms": 0.1, "d2d_concurrency_derate": 0.0},
}


def hand_instance(tmp_path, capacity_gb: float = 2):
    topk = np.array([[0, 1], [0, 1], [0, 0], [1, 1]], dtype=np.int16)[:, :, None]  # 4 tokens, 2 layers
    write_trace(Trace(topk=topk, num_experts=2), tmp_path / "hand.npz")
    table = {k: (dict(v) if isinstance(v, dict) else v) for k, v in HAND.items()}
    table["hardware"]["capacity_gb"] = capacity_gb
    return instance_from_table(table, tmp_path / "hand.toml")


def test_metrics_by_hand_all_resident(tmp_path):
    instance = hand_instance(tmp_path)
    log = simulate(instance, instance_batches(instance), STRATEGIES["static"])
    # layer 0: expert 0 has 3 tokens (chiplet 0, home block), expert 1 one (chiplet 1)
    # chiplet 0: arrives after 4 token copies (4e-6 ms), runs max(1 ms read, 3 ms compute) = 3 ms
    # latency = 0.5 + 0.1 + (4e-6 + 3) + reduce (4 copies back: 4e-6) ; layer 1 is the mirror image
    expected = 0.6 + 3.0 + 8e-6
    assert log.latency_ms[0].tolist() == pytest.approx([expected, expected])
    assert log.balance[0].tolist() == pytest.approx([2 / 3, 2 / 3])  # mean(3, 1) / 3
    assert log.imbalance_tokens[0].tolist() == pytest.approx([1.5, 1.5])  # 3 / mean(3, 1)
    m = summarize(log)
    assert m["mean_ms"] == pytest.approx(expected) and m["p95_ms"] == pytest.approx(expected)
    assert m["token_gb_per_batch"] == pytest.approx(2 * 8 * 1000 / 1e9)  # 8 copies a layer, 2 layers
    assert m["load_gb_per_batch"] == 0.0 and m["replica_factor"] == 1.0
    # energy of a layer: 8e3 B over the link + 2 page reads + 8e3 B of SRAM + 4 tokens x 1 GFLOP
    rt = instance.runtime
    energy = 1e-9 * (8e3 * 8 * rt.d2d_pj_per_bit + 2e9 * 8 * rt.hbm_pj_per_bit)
    energy += 1e-9 * (8e3 * 8 * rt.sram_pj_per_bit + 4e9 * rt.pj_per_flop)
    assert log.energy_mj[0, 0] == pytest.approx(energy)


def test_metrics_by_hand_with_an_on_demand_load(tmp_path):
    # one page per chiplet: static keeps the most used expert of each layer
    # (layer 0: expert 0 on chiplet 0; layer 1: expert 1 on chiplet 1)
    instance = hand_instance(tmp_path, capacity_gb=1)
    log = simulate(instance, instance_batches(instance), STRATEGIES["static"])
    # layer 0: expert 1 (1 token) is loaded on demand to its home, chiplet 1: ready at 1 ms, runs 1 ms
    # chiplet 0 still finishes last: 3 ms of compute
    assert log.latency_ms[0, 0] == pytest.approx(0.6 + 3.0 + 8e-6)
    assert log.demand_load_bytes[0].tolist() == [1e9, 1e9]
    assert summarize(log)["load_gb_per_batch"] == pytest.approx(2.0)


# ------------------------------------- every strategy keeps the router's experts

SMALL = {
    "name": "small",
    "model": {"layers": 3, "experts_per_layer": 8, "top_k": 2, "page_gb": 1.0, "hidden_size": 64,
              "bytes_per_element": 2},
    "hardware": {"chiplets": 4, "capacity_gb": 5, "local_bandwidth_gb_s": 2000, "peak_tflops": 200,
                 "d2d_bandwidth_gb_s": 512, "nop_hops": [1, 1, 2, 2], "hop_latency_ns": 20,
                 "prefetch_buffer_gb": 2},
    "trace": {"kind": "synthetic", "zipf_alpha": 1.1, "rho": 0.65, "drift_every": 20, "tokens_per_batch": 16,
              "micro_batches": 60, "seed": 1},
    "policy": {"window_batches": 20},
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_strategies_keep_the_routed_experts_and_read_only_published_pages(name, monkeypatch):
    instance = instance_from_table(SMALL, "small.toml")
    seen = []
    original = fastmap.map_tokens

    def spy(rt, layer, experts, published, buffered, ahead):
        assignment = original(rt, layer, experts, published, buffered, ahead)
        seen.append((experts.copy(), assignment.copy(), published.copy(), np.isfinite(buffered)))
        return assignment

    monkeypatch.setattr("comoe_opt.evaluator.runtime.map_tokens", spy)
    # copies fail half the time: the directory must roll them back, never expose them
    log = simulate(instance, instance_batches(instance), STRATEGIES[name], copy_failure_rate=0.5, seed=2)
    assert len(seen) == 60 * 3
    for experts, assignment, published, buffered in seen:
        assert assignment.shape == experts.shape
        assert ((assignment >= 0) & (assignment < 4)).all()
        # a token runs where its page is (a published replica or a buffered page) whenever one exists;
        # only an expert with neither is loaded on demand
        present = published | buffered
        assert (present[experts, assignment] | ~present.any(axis=1)[experts]).all()
    assert log.latency_ms.min() > 0


def test_evaluation_is_deterministic():
    instance = instance_from_table(SMALL, "small.toml")
    a = evaluate_strategy(instance, "comoe", 40)
    b = evaluate_strategy(instance, "comoe", 40)
    a.pop("runtime_s"), b.pop("runtime_s")
    assert a == b


def test_evaluation_does_not_depend_on_the_clock(monkeypatch):
    """An evaluation's plans run without a time limit: on a machine so slow that every clock
    reading is 100 s after the last, `milp`'s plans, and so the numbers, are the same (with the
    policy's 10-s limit the warm start would stop after one heuristic and the model be skipped)."""
    from comoe_opt.deadline import Deadline

    instance = instance_from_table(SMALL, "small.toml")
    normal = evaluate_strategy(instance, "comoe", 40)

    class Crawling(Deadline):
        def __init__(self, limit_s, clock=None, **kwargs):
            ticks = iter(range(0, 10**9, 100))
            super().__init__(limit_s, lambda: float(next(ticks)), **kwargs)

    monkeypatch.setattr("comoe_opt.planning.window.Deadline", Crawling)
    slow = evaluate_strategy(instance, "comoe", 40)
    normal.pop("runtime_s"), slow.pop("runtime_s")
    assert slow == normal


def test_more_bandwidth_never_slows_static():
    instance = instance_from_table(SMALL, "small.toml")
    slow = evaluate_strategy(with_overrides(instance, {"hardware.d2d_bandwidth_gb_s": 128.0}), "static", 40)
    fast = evaluate_strategy(with_overrides(instance, {"hardware.d2d_bandwidth_gb_s": 2048.0}), "static", 40)
    assert fast["mean_ms"] <= slow["mean_ms"]


def test_cli_evaluate_with_overrides(table, write_toml, cli):
    instance = write_toml(table)
    out = cli("evaluate", instance, "--strategies", "static", "--jobs", "1", "--json").json()
    slow = cli(
        "evaluate",
        instance,
        "--strategies",
        "static",
        "--jobs",
        "1",
        "--json",
        "--set",
        "hardware.d2d_bandwidth_gb_s=5",
        "--set",
        "trace.micro_batches=8",
    ).json()
    assert out["results"][0]["micro_batches"] == 12 and slow["results"][0]["micro_batches"] == 8
    assert slow["results"][0]["mean_ms"] > out["results"][0]["mean_ms"]  # slower page loads
    cli("evaluate", instance, "--set", "policy.nope=1").assert_user_error("policy.nope", "unknown key")
    cli("evaluate", instance, "--set", "nope").assert_user_error("SECTION.KEY=VALUE")
    cli("evaluate", instance, "--set", "policy.balance_scenarios=-1").assert_user_error("balance_scenarios")


@pytest.mark.parametrize("balance", ["tokens", "work"])
@pytest.mark.parametrize(
    "name, capacity_gb",
    [("comoe", 5.0), ("eplb-flow", 9.0)],  # 5: prefetched and on-demand pages; 9: 12 slots for 8 experts
)
def test_shared_flow_costs_give_the_same_replay(name, capacity_gb, balance, monkeypatch):
    """Micro-batches that meet equal layer costs share one `LayerCosts` (and so its flow skeleton
    and arc sets); the replay is the same as with fresh costs for every micro-batch."""
    from collections import OrderedDict

    overrides = {"policy.balance": balance, "hardware.capacity_gb": capacity_gb}
    instance = with_overrides(instance_from_table(SMALL, "small.toml"), overrides)
    built = []
    original = fastmap.LayerCosts

    def counting(**kwargs):
        built.append(1)
        return original(**kwargs)

    monkeypatch.setattr(fastmap, "LayerCosts", counting)
    monkeypatch.setattr(fastmap, "_COSTS", OrderedDict())
    shared = simulate(instance, instance_batches(instance), STRATEGIES[name])
    shared_builds = len(built)
    monkeypatch.setattr(fastmap, "COSTS_KEPT", 0)
    monkeypatch.setattr(fastmap, "_COSTS", OrderedDict())
    fresh = simulate(instance, instance_batches(instance), STRATEGIES[name])
    assert 0 < shared_builds < len(built) - shared_builds  # the costs were shared
    for field in ("latency_ms", "expert_ms", "balance", "imbalance_tokens", "energy_mj", "load_bytes"):
        assert np.array_equal(getattr(shared, field), getattr(fresh, field)), field
