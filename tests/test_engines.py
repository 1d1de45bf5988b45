"""Serving-engine files for a model with dense layers, launch flags, and recorder dumps.

Where each engine's parser puts things (docs/placement-format.md cites the source lines):
SGLang 0.5.23 indexes `physical_to_logical_map` by model layer id, all `num_hidden_layers`
rows (61 for DeepSeek-V3, dense layers included); vLLM-Ascend counts MoE layers only
(`layer_list[i]` is the i-th MoE layer) and needs a `.json` name and `num_redundant_experts`
equal to the map's extra slots.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tomli_w
from conftest import ROOT

from comoe_opt.errors import InputError
from comoe_opt.formats import (
    launch_flags,
    read_load_counts,
    read_sglang,
    read_step_counts,
    read_trtllm,
    read_vllm_ascend,
    write_sglang,
    write_trtllm,
    write_vllm_ascend,
)
from comoe_opt.formats.engines import ModelLayers
from comoe_opt.instance import load_instance
from comoe_opt.residency.placement import Placement
from comoe_opt.stats.demand import demand_from_step_counts

DEEPSEEK = ROOT / "instances" / "deepseek-v3-ep32.toml"


def ep_placement(layers: int, experts: int, devices: int, slots: int, seed: int = 0) -> Placement:
    """Every expert once, then random extra replicas, `slots` per device (EPLB's shape)."""
    rng = np.random.default_rng(seed)
    resident = np.zeros((layers, experts, devices), dtype=bool)
    for layer in range(layers):
        order = rng.permutation(experts)
        for i, e in enumerate(order):
            resident[layer, e, i % devices] = True
        for d in range(devices):
            while resident[layer, :, d].sum() < slots:
                resident[layer, rng.integers(experts), d] = True
    return Placement(resident)


def test_deepseek_v3_sglang_map_has_a_row_per_model_layer(tmp_path: Path) -> None:
    model = load_instance(DEEPSEEK).model
    assert model.moe_layer_ids == list(range(3, 61)) and model.hidden_layers == 61
    placement = ep_placement(model.layers, model.experts_per_layer, 32, 9)
    path = write_sglang(
        placement, tmp_path / "ds.json", layer_ids=model.moe_layer_ids, num_model_layers=model.hidden_layers
    )
    table = np.array(json.loads(path.read_text())["physical_to_logical_map"])
    assert table.shape == (61, 288)  # num_hidden_layers x (256 logical + 32 redundant)
    trivial = np.arange(288) % 256  # SGLang's own map for layers without experts
    assert all((table[layer] == trivial).all() for layer in range(3))
    for moe, layer in enumerate(model.moe_layer_ids):  # MoE layer i is model layer i + 3
        devices = np.arange(288) // 9
        assert placement.resident[moe, table[layer], devices].all()
    back = read_sglang(path, 32, layer_ids=model.moe_layer_ids)
    assert np.array_equal(back.resident, placement.resident)
    flags = launch_flags("sglang", path, placement)
    assert flags == f"--init-expert-location {path} --ep-num-redundant-experts 32"


def test_deepseek_v3_vllm_ascend_map_counts_moe_layers(tmp_path: Path) -> None:
    model = load_instance(DEEPSEEK).model
    placement = ep_placement(model.layers, model.experts_per_layer, 32, 9, seed=1)
    path = write_vllm_ascend(placement, tmp_path / "ds.json")
    doc = json.loads(path.read_text())
    assert doc["moe_layer_count"] == 58 and len(doc["layer_list"]) == 58
    slots = {len(d["device_expert"]) for layer in doc["layer_list"] for d in layer["device_list"]}
    assert slots == {9}  # 9 x 32 = 256 + num_redundant_experts
    assert np.array_equal(read_vllm_ascend(path, experts=256).resident, placement.resident)
    config = json.loads(launch_flags("vllm-ascend", path, placement).split(" ", 1)[1].strip("'"))
    assert config == {"eplb_config": {"expert_map_path": str(path), "num_redundant_experts": 32}}
    with pytest.raises(InputError, match=r"ends in '\.json'"):
        write_vllm_ascend(placement, tmp_path / "ds.map")


class _LoadBalancerStandIn:
    """TensorRT-LLM's `MoeLoadBalancerConfig` as its source defines it (llmapi/llm_args.py): a
    strict model of `num_slots`, `initial_global_assignments: Dict[int, List[int]]` and
    `layer_updates_per_iter`, whose `setup(ep_rank, ep_size)` needs `num_slots` divisible by the
    EP size and whose per-layer lookup raises for a missing layer or a list not `num_slots` long."""

    def __init__(self, num_slots=None, initial_global_assignments=None, layer_updates_per_iter=0, **extra):
        assert not extra, f"extra keys {sorted(extra)}"
        assert isinstance(num_slots, int) and isinstance(layer_updates_per_iter, int)
        assert all(isinstance(k, int) for k in initial_global_assignments)
        assert all(isinstance(e, int) for ids in initial_global_assignments.values() for e in ids)
        self.num_slots, self.table = num_slots, initial_global_assignments

    def setup(self, ep_rank: int, ep_size: int) -> None:
        assert self.num_slots % ep_size == 0

    def get_layer_initial_global_assignments(self, layer_idx: int) -> list:
        ids = self.table[layer_idx]  # KeyError for a layer the file lacks, as TensorRT-LLM's
        assert len(ids) == self.num_slots
        return ids


def test_deepseek_v3_trtllm_file_loads_as_its_load_balancer_config(tmp_path: Path) -> None:
    import yaml

    model = load_instance(DEEPSEEK).model
    placement = ep_placement(model.layers, model.experts_per_layer, 32, 9, seed=2)
    layers = ModelLayers.of(model)
    path = write_trtllm(placement, tmp_path / "lb.yaml", layers=layers)
    config = _LoadBalancerStandIn(**yaml.safe_load(path.read_text()))
    config.setup(ep_rank=0, ep_size=32)
    for moe, layer in enumerate(model.moe_layer_ids):  # TensorRT-LLM looks up model layers 3..60
        ids = np.array(config.get_layer_initial_global_assignments(layer))
        assert placement.resident[moe, ids, np.arange(288) // 9].all()  # rank r owns slots 9r..9r+8
    with pytest.raises(KeyError):
        config.get_layer_initial_global_assignments(2)  # a dense layer: TensorRT-LLM never asks
    assert np.array_equal(read_trtllm(path, 32, experts=256, layers=layers).resident, placement.resident)
    assert "moe_config: {load_balancer: " + str(path) in launch_flags("trtllm", path, placement)
    with pytest.raises(InputError, match="name it"):
        write_trtllm(placement, tmp_path / "lb.json")
    # a sampled log's layers: the model's other MoE layers get the trivial map, none is missing
    part = Placement(placement.resident[:2])
    path = write_trtllm(part, tmp_path / "part.yaml", layers=ModelLayers((3, 9), 61, 3))
    doc = yaml.safe_load(path.read_text())
    assert sorted(doc["initial_global_assignments"]) == list(range(3, 61))
    assert doc["initial_global_assignments"][4] == (np.arange(288) % 256).tolist()


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("num_slots: 8\nextra: 1\ninitial_global_assignments: {0: [0, 1, 2, 3, 0, 1, 2, 3]}\n", "extra"),
        ("num_slots: 6\ninitial_global_assignments: {0: [0, 1, 2, 3, 0, 1]}\n", "multiple of 4"),
        ("num_slots: 8\ninitial_global_assignments: {0: [0, 1, 2, 3]}\n", "num_slots is 8"),
        ("num_slots: 8\ninitial_global_assignments: {0: [0, 1, 2, 3, 0, -1, 2, 3]}\n", "non-negative"),
        ("num_slots: [8\n", "not valid YAML at line"),
    ],
)
def test_a_bad_trtllm_file_is_one_line(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(InputError, match=needle):
        read_trtllm(path, 4)


def test_cli_export_prints_launch_flags(cli, tmp_path: Path, table) -> None:
    table["model"].update(first_moe_layer=1, model_layers=5)
    table["hardware"]["capacity_gb"] = 8  # 32 pages per device: every expert fits
    table["policy"]["all_resident"] = True  # engines need every expert somewhere
    path = tmp_path / "inst.toml"
    path.write_text(tomli_w.dumps(table))
    out = tmp_path / "map.json"
    report = cli("solve", path, "--method", "greedy", "-o", out, "--export", "sglang", "--json").json()
    assert report["launch_flags"].startswith(f"--init-expert-location {out} --ep-num-redundant-experts ")
    rows = json.loads(out.read_text())["physical_to_logical_map"]
    assert len(rows) == 5 and rows[0] == rows[4]  # model layers: dense layers 0 and 4 get the trivial row
    extra = int(report["launch_flags"].rsplit(" ", 1)[1])
    assert len(rows[0]) == 8 + extra  # physical slots = logical experts + redundant


def recorder_dump(steps: int, layers: int, experts: int, seed: int = 0) -> dict:
    """SGLang's `stat` recorder dump, as its keys and shapes are: logical_count
    [buffer steps, model layers, experts]; unused ring-buffer rows and dense layers are zero."""
    rng = np.random.default_rng(seed)
    counts = rng.poisson(rng.gamma(0.6, 20, size=experts), size=(steps, layers, experts))
    counts[:, 0] = 0  # a dense layer
    counts[-3:] = 0  # unused rows of the ring buffer
    return {"rank": 0, "logical_count": counts.tolist(), "average_utilization_rate_over_window": 0.8}


def test_recorder_dump_keeps_its_steps(tmp_path: Path) -> None:
    dump = recorder_dump(steps=12, layers=4, experts=8)
    path = tmp_path / "dump.json"
    path.write_text(json.dumps(dump))
    steps = read_step_counts(path, 3, 8, model_layer_ids=[1, 2, 3])
    full = np.array(dump["logical_count"], dtype=float)
    assert steps.shape == (9, 3, 8)  # the 3 unused buffer rows dropped, the dense layer skipped
    assert np.array_equal(steps, full[:9, 1:])
    assert np.array_equal(read_load_counts(path, 3, 8, model_layer_ids=[1, 2, 3]), full[:, 1:].sum(axis=0))
    demand = demand_from_step_counts(steps, tokens_per_batch=16, top_k=2, scenarios=4)
    assert demand.scenario_tokens.shape == (4, 3, 8)
    assert np.allclose(demand.tokens.sum(axis=1), 32)  # each layer's mean step: 16 tokens x top-2
    assert np.all(demand.peak >= demand.tokens)


def test_recorder_dump_round_trips_through_solve(cli, tmp_path: Path, table) -> None:
    table["model"].update(first_moe_layer=1, model_layers=4)
    instance = tmp_path / "inst.toml"
    instance.write_text(tomli_w.dumps(table))
    dump = tmp_path / "dump.json"
    recorded = recorder_dump(steps=10, layers=4, experts=8)
    dump.write_text(json.dumps(recorded))
    report = cli("solve", instance, "--counts", dump, "--scenarios", "5", "--work-limits", "--json").json()
    assert report["balance_scenarios"] == 5 and report["status"] in ("optimal", "feasible")
    assert report["bound"] <= report["objective"] + 1e-9
    # the same counts without the dense row, for an instance whose layers are rows 0..2: the same plan,
    # so the recorder's rows were read at the MoE layers (a reader taking rows 0..2 plans on a zero row)
    moe_only = tmp_path / "moe-only.json"
    moe_only.write_text(json.dumps({"logical_count": np.array(recorded["logical_count"])[:, 1:].tolist()}))
    plain = tmp_path / "plain.toml"
    plain.write_text(
        tomli_w.dumps(
            {
                **table,
                "model": {
                    k: v for k, v in table["model"].items() if k not in ("first_moe_layer", "model_layers")
                },
            }
        )
    )
    same = cli("solve", plain, "--counts", moe_only, "--scenarios", "5", "--work-limits", "--json").json()
    assert same["objective"] == report["objective"] and same["bound"] == report["bound"]
    summed = cli("solve", instance, "--counts", dump, "--scenarios", "0", "--work-limits", "--json").json()
    assert summed["balance_scenarios"] == 0 and summed["objective"] != report["objective"]


def test_pt_dump_without_torch_says_how_to_convert(cli, tmp_path: Path) -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("torch is installed: the dump is read")
    path = tmp_path / "expert_distribution_recorder_1.pt"
    path.write_bytes(b"PK\x03\x04")
    line = cli("solve", DEEPSEEK, "--counts", path).assert_user_error(path.name, "needs torch")
    assert "json.dump({'logical_count'" in line


def test_traces_use_the_models_layer_numbering(tmp_path: Path, table, cli) -> None:
    from comoe_opt.instance import instance_from_table
    from comoe_opt.trace import generate, read_trace, write_trace

    table["model"].update(first_moe_layer=2, model_layers=6)
    instance = instance_from_table(table, tmp_path / "inst.toml")
    trace = generate(instance.model, instance.trace)
    assert trace.layer_ids.tolist() == [2, 3, 4]  # MoE layers numbered as in the model
    path = write_trace(trace, tmp_path / "t.npz")
    assert read_trace(path).layer_ids.tolist() == [2, 3, 4]
    (tmp_path / "inst.toml").write_text(tomli_w.dumps(table))
    assert cli("solve", tmp_path / "inst.toml", "--trace", path, "--method", "greedy").code == 0
    table["model"].update(first_moe_layer=0, model_layers=0)  # names no ids: takes the trace's
    (tmp_path / "plain.toml").write_text(tomli_w.dumps(table))
    report = cli("solve", tmp_path / "plain.toml", "--trace", path, "--method", "greedy", "--json").json()
    assert report["layer_ids"] == [2, 3, 4]
    table["model"].update(first_moe_layer=1)  # names other ids: a true mismatch, both named
    (tmp_path / "other.toml").write_text(tomli_w.dumps(table))
    cli("solve", tmp_path / "other.toml", "--trace", path).assert_user_error(
        "t.npz", "model layers 2..4", "layers are 1..3", "model.first_moe_layer"
    )
