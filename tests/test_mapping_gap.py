"""The fast loop's gap report, the built-in placement and the `comoe-opt gap` verb."""

from __future__ import annotations

import numpy as np
import pytest

from comoe_opt.instance import instance_from_table
from comoe_opt.mapping import default_placement, fast_loop_gap, layer_placement
from comoe_opt.mapping.gap import sample_windows
from comoe_opt.mapping.placement import slots_per_layer
from comoe_opt.trace import instance_batches, make_batches


def test_layer_placement_hottest_first_then_replicas():
    counts = np.array([5, 50, 0, 20])
    resident = layer_placement(counts, np.array([2, 2, 2]))  # 6 slots, 4 experts
    assert resident.sum(axis=0).tolist() == [2, 2, 2]  # every slot used
    assert resident.sum(axis=1).tolist() == [1, 2, 1, 2]  # the two hottest get a second replica
    assert resident[1, 0] and resident[3, 1] and resident[0, 2]  # hottest first, round-robin
    tight = layer_placement(counts, np.array([1, 1]))
    assert tight.sum(axis=1).tolist() == [0, 1, 0, 1]  # only the hottest fit


def test_default_placement_fits_capacity(table):
    instance = instance_from_table(table, "small.toml")
    batches = instance_batches(instance)
    placement = default_placement(instance, batches)
    per_layer = slots_per_layer(instance, batches.layers)  # 4 pages per chiplet / 3 layers -> 1
    assert placement.shape == (3, 8, 4)
    assert (placement.sum(axis=1) <= per_layer).all()
    assert np.array_equal(placement, default_placement(instance, batches))  # deterministic


def test_sample_windows_skip_the_profile_and_do_not_repeat(table):
    batches = instance_batches(instance_from_table(table, "small.toml"))
    picks = sample_windows(batches, 10, seed=1, skip=4)
    assert len({tuple(p) for p in picks.tolist()}) == 10
    assert (picks[:, 0] >= 4).all() and (picks[:, 1] < batches.layers).all()
    assert len(sample_windows(batches, 10_000, seed=1)) == batches.batches * batches.layers


def test_gap_report_flow_is_optimal_heuristics_are_not_below(table):
    instance = instance_from_table(table, "small.toml")
    report = fast_loop_gap(instance, instance_batches(instance), windows=20, seed=2)
    summary = report.summary.set_index("method")
    assert summary.loc["min-cost-flow", "max_gap"] == 0.0
    assert summary.loc["min-cost-flow", "optimal_share"] == 1.0
    assert (report.samples["gap"] >= 0).all()
    assert set(summary.index) >= {
        "exact",
        "home",
        "round-robin",
        "even-split",
        "least-loaded",
        "power-of-two",
    }
    assert report.to_dict()["samples"] == 20


def test_cli_gap_json(cli, table, write_toml):
    result = cli("gap", write_toml(table), "--windows", "12", "--json")
    assert result.code == 0, result.err
    payload = result.json()
    rows = {row["method"]: row for row in payload["methods"]}
    assert payload["samples"] == 12
    assert rows["min-cost-flow"]["max_gap"] == 0.0
    text = cli("gap", write_toml(table), "--windows", "5")
    assert text.code == 0 and "min-cost-flow" in text.out


def test_cli_gap_user_errors(cli, table, write_toml, tmp_path):
    path = write_toml(table)
    cli("gap", path, "--placement", tmp_path / "p.json").assert_user_error("p.json")
    cli("gap", path, "--windows", "0").assert_user_error("--windows", ">= 1")
    cli("gap", tmp_path / "missing.toml").assert_user_error("missing.toml")
    cli("gap", path, "--trace", tmp_path / "none.npz").assert_user_error("none.npz")


def test_gap_on_gptoss_routing(gptoss_trace, table):
    # GPT-OSS routing (32 experts, top-4) on the small instance's hardware, 5 samples
    batches = make_batches(gptoss_trace, 16, "decode", limit=20)
    report = fast_loop_gap(instance_from_table(table, "small.toml"), batches, windows=5)
    summary = report.summary.set_index("method")
    assert summary.loc["min-cost-flow", "max_gap"] == 0.0
    assert report.meta["top_k"] == 4


@pytest.mark.parametrize("windows", [1, 3])
def test_gap_with_a_given_placement(table, windows):
    instance = instance_from_table(table, "small.toml")
    batches = instance_batches(instance)
    everywhere = np.ones((batches.layers, batches.num_experts, 4), dtype=bool)
    report = fast_loop_gap(instance, batches, windows=windows, placement=everywhere)
    assert report.meta["placement"] == "given"
    assert report.meta["replica_factor"] == 4.0
    assert report.summary.set_index("method").loc["min-cost-flow", "max_gap"] == 0.0


def test_cli_gap_reads_a_placement_and_reports_the_slow_loop(cli, table, write_toml, tmp_path):
    import json

    path = write_toml(table)
    placement = tmp_path / "placement.json"
    assert cli("solve", path, "--method", "greedy", "-o", placement).code == 0
    result = cli("gap", path, "--placement", placement, "--windows", "5", "--slow-windows", "1", "--json")
    assert result.code == 0
    report = json.loads(result.out)
    assert report["placement"] == "given"
    slow = {row["method"]: row for row in report["slow_loop"]}
    assert min(row["mean_gap_to_best"] for row in slow.values()) == 0.0
    for name in ("milp", "static", "hot", "eplb", "greedy"):
        assert slow[name]["mean_gap_to_bound"] >= slow["exact"]["mean_gap_to_bound"] - 1e-9, name
    for row in slow.values():
        assert row["mean_gap_to_bound"] >= -1e-6  # a bound above an objective would be a bug
