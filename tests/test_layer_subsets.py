"""Traces that log a subset of a model's layers (model layers 0, 8, 12, 18 and 23 of 24), as
routing loggers often record: through every verb, both engine exports and load-count dumps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tomli_w

from comoe_opt.errors import InputError
from comoe_opt.formats import ModelLayers, read_placement, read_sglang, read_vllm_ascend
from comoe_opt.instance import instance_from_table, load_instance
from comoe_opt.trace import generate, load_batches, write_trace

IDS = [0, 8, 12, 18, 23]


@pytest.fixture
def logged(tmp_path: Path, table: dict[str, Any]) -> tuple[Path, Path]:
    """A trace of 5 logged layers with model ids `IDS`, and a file instance naming no ids."""
    table["model"].update(layers=5, layer_ids=IDS)
    table["hardware"]["capacity_gb"] = 12  # 48 pages for 40 experts: engines need every one resident
    table["trace"].update(micro_batches=16)
    trace = generate(instance_from_table(table, tmp_path / "gen.toml").model, table_trace(table))
    assert trace.layer_ids.tolist() == IDS
    path = write_trace(trace, tmp_path / "sampled.npz")
    del table["model"]["layer_ids"]
    table["trace"] = {"kind": "file", "path": "sampled.npz", "tokens_per_batch": 8}
    table["policy"] = {"window_batches": 4, "balance_scenarios": 3, "all_resident": True}
    instance = tmp_path / "inst.toml"
    instance.write_text(tomli_w.dumps(table))
    return instance, path


def table_trace(table: dict[str, Any]) -> Any:
    return instance_from_table(table, "gen.toml").trace


def test_an_instance_naming_no_ids_takes_the_traces(logged: tuple[Path, Path]) -> None:
    instance, _ = logged
    resolved, batches = load_batches(load_instance(instance))
    assert resolved.model.moe_layer_ids == IDS and resolved.model.hidden_layers == 24
    assert batches.layer_ids.tolist() == IDS


def test_every_verb_runs_on_a_sampled_trace(cli, logged: tuple[Path, Path]) -> None:
    instance, trace = logged
    info = cli("trace", "info", trace, "--json").json()
    assert [row["layer"] for row in info["layers"]] == IDS
    solved = cli("solve", instance, "--work-limits", "--json").json()
    assert solved["layer_ids"] == IDS and solved["status"] in ("optimal", "feasible")
    assert solved["bound"] <= solved["objective"] + 1e-9
    rolling = cli("solve", instance, "--rolling", "--method", "greedy", "--json").json()
    assert len(rolling["windows"]) == 4
    gap = cli("gap", instance, "--windows", "2", "--slow-windows", "1", "--json").json()
    slow = {row["method"]: row for row in gap["slow_loop"]}
    assert min(row["mean_gap_to_best"] for row in slow.values()) == 0.0  # the best is one of them
    assert all(row["mean_gap_to_bound"] >= -1e-6 for row in slow.values())  # no bound above a plan
    assert (
        slow["exact"]["mean_gap_to_bound"] <= slow["milp"]["mean_gap_to_bound"] + 1e-9
    )  # milp's steps first
    evaluated = cli("evaluate", instance, "--strategies", "static,comoe", "--json").json()
    assert [row["micro_batches"] for row in evaluated["results"]] == [16, 16]


def test_sglang_rows_are_the_logged_model_layers(cli, logged: tuple[Path, Path], tmp_path: Path) -> None:
    instance, _ = logged
    out = tmp_path / "loc.json"
    mine = tmp_path / "mine.json"
    cli("solve", instance, "--method", "greedy", "-o", mine, "--json").json()
    cli("solve", instance, "--method", "greedy", "--export", "sglang", "-o", out, "--json").json()
    table = np.array(json.loads(out.read_text())["physical_to_logical_map"])
    assert table.shape[0] == 24  # one row per model layer
    placement = read_placement(mine, 5, 8, 4).resident
    back = read_sglang(out, 4, layer_ids=IDS).resident
    assert np.array_equal(back | placement, back)  # every replica of ours is in the engine's row
    trivial = np.arange(table.shape[1]) % 8
    assert all(np.array_equal(table[row], trivial) for row in range(24) if row not in IDS)


def test_vllm_ascend_map_covers_every_moe_layer(cli, logged: tuple[Path, Path], tmp_path: Path) -> None:
    instance, _ = logged
    out = tmp_path / "map.json"
    mine = tmp_path / "mine.json"
    cli("solve", instance, "--method", "greedy", "-o", mine, "--json").json()
    cli("solve", instance, "--method", "greedy", "--export", "vllm-ascend", "-o", out, "--json").json()
    doc = json.loads(out.read_text())
    assert doc["moe_layer_count"] == 24
    placement = read_placement(mine, 5, 8, 4).resident
    back = read_vllm_ascend(out, experts=8, layers=ModelLayers(tuple(IDS), 24)).resident
    assert np.array_equal(back | placement, back)
    with pytest.raises(InputError, match="moe_layer_count"):
        read_vllm_ascend(out, experts=8, layers=ModelLayers(tuple(IDS), 30))


def test_counts_dump_is_read_at_the_logged_rows(cli, logged: tuple[Path, Path], tmp_path: Path) -> None:
    instance, _ = logged
    resolved = tmp_path / "named.toml"
    text = instance.read_text().replace("[model]\n", f"[model]\nlayer_ids = {IDS}\n")
    resolved.write_text(text)
    rng = np.random.default_rng(0)
    steps = rng.integers(0, 20, size=(6, 24, 8))
    steps[:, [r for r in range(24) if r not in IDS]] = 10**6  # rows a wrong reader would pick up
    dump = tmp_path / "dump.json"
    dump.write_text(json.dumps({"logical_count": steps.tolist()}))
    out = tmp_path / "loc.json"
    report = cli("solve", resolved, "--counts", dump, "--method", "eplb", "--export", "sglang", "-o", out)
    assert report.code == 0, report.err
    # EPLB's plan is a function of the load it is given: the exported rows at IDS are EPLB's plan of
    # the dump's rows IDS (a reader of rows 0..4 plans on other counts: mostly the 10**6 rows)
    exported = np.array(json.loads(out.read_text())["physical_to_logical_map"])[IDS]
    moe_only = tmp_path / "moe-only.json"
    moe_only.write_text(json.dumps({"logical_count": steps[:, IDS].tolist()}))
    plain = tmp_path / "plain-ids.json"
    assert cli("solve", instance, "--counts", moe_only, "--method", "eplb", "-o", plain).code == 0
    planned = read_placement(plain, 5, 8, 4).resident
    back = read_sglang(out, 4, layer_ids=IDS).resident
    assert np.array_equal(back, planned) and exported.shape == (5, 8)
    short = tmp_path / "short.json"
    short.write_text(json.dumps({"logical_count": steps[:, :6].tolist()}))
    cli("solve", resolved, "--counts", short).assert_user_error("short.json", "6 layer rows", "24-layer")


def test_a_four_layer_model_refuses_a_six_row_dump(cli, write_toml, table, tmp_path: Path) -> None:
    table["model"]["layers"] = 4
    instance = write_toml(table)
    dump = tmp_path / "six.json"
    dump.write_text(json.dumps({"logical_count": np.ones((2, 6, 8)).tolist()}))
    cli("solve", instance, "--counts", dump).assert_user_error("six.json", "6 layer rows", "4 layers")


@pytest.mark.parametrize(
    ("ids", "extra", "needle"),
    [
        ([0, 8, 12], {}, "lists 3 ids"),
        ([0, 8, 8, 12, 23], {}, "strictly increasing"),
        ([0, 8, 12, 18, 23], {"model_layers": 20}, "last layer is model layer 23"),
        ([0, 8, 12, 18, 23], {"first_moe_layer": 3}, "before model.first_moe_layer"),
        ([0, 8, 12, 18, -1], {}, "model.layer_ids[4]"),
    ],
)
def test_layer_ids_are_validated(cli, write_toml, table, ids: list[int], extra: dict, needle: str) -> None:
    table["model"].update(layers=5, layer_ids=ids, **extra)
    cli("instance", "show", write_toml(table)).assert_user_error("model.", needle)


def test_a_true_mismatch_names_both_id_lists(cli, logged: tuple[Path, Path], tmp_path: Path) -> None:
    instance, _ = logged
    other = tmp_path / "other.toml"
    other.write_text(instance.read_text().replace("[model]\n", "[model]\nlayer_ids = [0, 1, 2, 3, 4]\n"))
    cli("solve", other).assert_user_error("sampled.npz", "[0, 8, 12, 18, 23]", "0..4", "model.layer_ids")
