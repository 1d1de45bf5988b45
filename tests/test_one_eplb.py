"""One EPLB: `solve --method eplb` (through the residency problem) and
`comoe_opt.rebalance_experts(method="eplb")` give the same map on the same loads and slots.

Two things used to part them: the residency problem handed EPLB λ (the counts scaled to a mean
micro-batch), which rounds differently in EPLB's float32 and broke its ties another way; and
EPLB's two slots of one expert on one device became one page and a padded slot of another
expert in the exported map."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import ROOT
from hypothesis import given, settings
from hypothesis import strategies as st

import comoe_opt
from comoe_opt.balancers.eplb import deepseek_eplb as eplb_port
from comoe_opt.errors import InputError
from comoe_opt.formats import device_slots, launch_flags
from comoe_opt.instance import load_instance, with_overrides
from comoe_opt.planning import plan_window
from comoe_opt.residency.heuristics import eplb
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.problem import residency_problem
from comoe_opt.stats.demand import demand_from_step_counts
from comoe_opt.trace.batching import make_batches

INSTANCE = ROOT / "instances" / "real-gptoss20b.toml"  # 40 slots per layer on 8 devices
SLOTS, GPUS = 40, 8


def _step_counts(trace, steps: int, in_flight=None) -> np.ndarray:
    """[steps, layers, experts] selections of decode steps of 64 sequences in flight (the project's
    continuous batching), as SGLang's recorder logs them; `in_flight[s]` keeps only that many."""
    batches = make_batches(trace, 64, "decode", limit=steps).experts.astype(np.int64)
    b, _, layers, _ = batches.shape
    counts = np.zeros((b, layers, trace.num_experts), dtype=np.int64)
    for s in range(b):
        chosen = batches[s, : None if in_flight is None else in_flight[s]]
        for layer in range(layers):
            counts[s, layer] = np.bincount(chosen[:, layer].ravel(), minlength=trace.num_experts)
    return counts


def _dropin(summed: np.ndarray) -> np.ndarray:
    return comoe_opt.rebalance_experts(summed, SLOTS, 1, 1, GPUS, method="eplb")[0]


def _solve_export(cli, tmp_path, counts: np.ndarray) -> tuple[np.ndarray, str]:
    dump = tmp_path / "dump.json"
    dump.write_text(json.dumps({"rank": 0, "logical_count": counts.tolist()}))
    plan = tmp_path / "plan.json"
    args = ["--counts", dump, "--method", "eplb", "--scenarios", "0", "--export", "sglang", "-o", plan]
    result = cli("solve", INSTANCE, *args, "--json")
    assert result.code == 0, result.err
    return np.array(json.loads(plan.read_text())["physical_to_logical_map"]), result.json()["launch_flags"]


def test_solve_exports_the_dropins_map_on_a_recorded_dump(cli, tmp_path, gptoss_trace):
    counts = _step_counts(gptoss_trace, 128)  # 128 decode steps, as a recorder dump
    want = _dropin(counts.sum(axis=0))
    # the case that parted them: EPLB gives some device two slots of one expert
    assert any(len(set(want[layer, g * 5 : g * 5 + 5])) < 5 for layer in range(24) for g in range(GPUS))
    got, flags = _solve_export(cli, tmp_path, counts)
    assert got.shape == (24, SLOTS)
    np.testing.assert_array_equal(got, want)
    assert flags.endswith("--ep-num-redundant-experts 8")


def test_solve_matches_on_uneven_steps_where_float32_ties_differ(cli, tmp_path, gptoss_trace):
    """Steps with 40..64 sequences: λ is the counts times a factor that is no power of two."""
    in_flight = 40 + (np.arange(100) * 7) % 25
    counts = _step_counts(gptoss_trace, 100, in_flight)
    summed = counts.sum(axis=0)
    scaled = demand_from_step_counts(counts, 64, 4).tokens
    # the case that parted them: EPLB on λ and on the counts break a tie differently
    assert (eplb_port(scaled, SLOTS, 1, 1, GPUS)[0] != _dropin(summed)).any()
    got, _ = _solve_export(cli, tmp_path, counts)
    np.testing.assert_array_equal(got, _dropin(summed))


def test_trace_window_plans_on_its_summed_counts(gptoss_trace):
    """From a per-token trace too: a window of 96 micro-batches (λ = counts / 96)."""
    instance = load_instance(INSTANCE)
    window = make_batches(gptoss_trace, 64, "decode", limit=96)
    plan = plan_window(instance, window, method="eplb")
    summed = _step_counts(gptoss_trace, 96).sum(axis=0)
    slot_map = plan.placement.slot_map
    np.testing.assert_array_equal(slot_map.reshape(24, SLOTS), _dropin(summed))


@settings(max_examples=12)
@given(
    seed=st.integers(0, 2**32 - 1),
    steps=st.integers(2, 9),
    hierarchical=st.booleans(),
)
def test_residency_eplb_is_the_dropin_on_any_dump(seed, steps, hierarchical):
    """Any dump (integer counts, uneven steps), global or hierarchical (4 groups on 2 nodes)."""
    instance = load_instance(INSTANCE)
    groups, nodes = (4, 2) if hierarchical else (1, 1)
    if hierarchical:
        instance = with_overrides(instance, {"model.expert_groups": 4, "hardware.devices_per_node": 4})
    rng = np.random.default_rng(seed)
    counts = rng.poisson(rng.gamma(0.4, 6.0, size=(steps, 24, 32))) + (np.arange(24)[:, None] == 0)
    demand = demand_from_step_counts(counts.astype(float), 64, 4)
    placement = eplb(residency_problem(instance, demand))
    want = comoe_opt.rebalance_experts(counts.sum(axis=0), SLOTS, groups, nodes, GPUS, method="eplb")[0]
    np.testing.assert_array_equal(placement.slot_map.reshape(24, SLOTS), want)
    # the pages are the map's distinct (expert, device) pairs
    device = np.arange(SLOTS) // (SLOTS // GPUS)
    assert placement.pages == sum(len(set(zip(want[li], device, strict=True))) for li in range(24))


def test_only_sglang_gets_two_slots_of_one_expert(tmp_path):
    """vLLM-Ascend refuses an expert twice on a device: it gets the padded map and its flags."""
    resident = np.zeros((1, 3, 2), dtype=bool)
    resident[0, [0, 1], 0] = True  # device 0 holds experts 0 (twice in the map) and 1
    resident[0, [0, 2], 1] = True
    slot_map = np.array([[[0, 0, 1], [2, 0, 2]]])
    placement = Placement(resident, slot_map=slot_map)
    np.testing.assert_array_equal(device_slots(placement, repeats=True), slot_map)
    padded = device_slots(placement)
    assert padded.shape == (1, 2, 2) and all(len(set(row)) == 2 for row in padded[0])
    assert launch_flags("sglang", tmp_path / "p.json", placement).endswith("redundant-experts 3")
    assert '"num_redundant_experts": 1' in launch_flags("vllm-ascend", tmp_path / "p.json", placement)


@pytest.mark.parametrize(
    ("slot_map", "message"),
    [
        (np.array([[[0, 1], [0, 1]]]), "does not hold the experts resident"),
        (np.array([[[0, 5], [0, 2]]]), r"expert ids must be in 0\.\.2"),
        (np.array([[0, 1, 0, 2]]), r"must be \[1, 2, slots\]"),
    ],
)
def test_a_slot_map_must_match_the_residency(slot_map, message):
    resident = np.zeros((1, 3, 2), dtype=bool)
    resident[0, [0, 1], 0] = True
    resident[0, [0, 2], 1] = True
    with pytest.raises(InputError, match=message):
        Placement(resident, slot_map=slot_map)


def test_where_upstream_cannot_plan_there_is_no_planned_map():
    """A replica limit below the devices: `eplb` plans as `eplb-distinct`, one slot per page."""
    instance = with_overrides(load_instance(INSTANCE), {"policy.max_replicas": 4})
    counts = np.ones((3, 24, 32))
    placement = eplb(residency_problem(instance, demand_from_step_counts(counts, 64, 4)))
    assert placement.slot_map is None
