"""Placement files: own JSON round trips, SGLang / vLLM-Ascend exports, load-count import."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from comoe_opt.errors import InputError
from comoe_opt.formats import (
    device_slots,
    read_load_counts,
    read_placement,
    read_placement_file,
    read_sglang,
    read_vllm_ascend,
    write_placement,
    write_sglang,
    write_vllm_ascend,
)
from comoe_opt.formats.placement_file import FORMAT
from comoe_opt.residency.placement import Placement

# ------------------------------------------------------------ strategies


@st.composite
def placements(draw, all_resident: bool = False) -> Placement:
    """Small random placements; with `all_resident`, every expert has a replica."""
    layers = draw(st.integers(1, 3))
    experts = draw(st.integers(1, 6))
    chiplets = draw(st.integers(1, 4))
    bits = draw(
        st.lists(st.booleans(), min_size=layers * experts * chiplets, max_size=layers * experts * chiplets)
    )
    resident = np.array(bits, dtype=bool).reshape(layers, experts, chiplets)
    if all_resident:
        homes = draw(
            st.lists(st.integers(0, chiplets - 1), min_size=layers * experts, max_size=layers * experts)
        )
        for i, c in enumerate(homes):
            resident[i // experts, i % experts, c] = True
    return Placement(resident)


@st.composite
def placement_and_load(draw) -> tuple[Placement, np.ndarray | None]:
    placement = draw(placements(all_resident=True))
    if draw(st.booleans()):
        return placement, None
    values = draw(
        st.lists(
            st.integers(0, 50),
            min_size=placement.layers * placement.experts,
            max_size=placement.layers * placement.experts,
        )
    )
    return placement, np.array(values, dtype=np.float64).reshape(placement.layers, placement.experts)


def _assert_error(exc: pytest.ExceptionInfo[InputError], path: Path, *needles: str) -> None:
    message = str(exc.value)
    assert "\n" not in message
    assert path.name in message, message
    for needle in needles:
        assert needle in message, (needle, message)


def _write(path: Path, doc: object) -> Path:
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc), encoding="utf-8")
    return path


# ---------------------------------------------------------- own JSON format


@given(placement=placements())
def test_own_json_round_trip(tmp_path_factory, placement):
    path = tmp_path_factory.mktemp("own") / "plan.json"
    write_placement(placement, path)
    back = read_placement(path, placement.layers, placement.experts, placement.chiplets)
    assert back.resident.shape == placement.resident.shape
    assert np.array_equal(back.resident, placement.resident)


def test_own_json_header_and_layout(tmp_path):
    resident = np.zeros((2, 3, 2), dtype=bool)
    resident[0, 0, [0, 1]] = True
    resident[1, 2, 1] = True
    path = write_placement(
        Placement(resident), tmp_path / "p.json", page_gb=0.5, instance="small", meta={"z": 1, "a": [1, 2]}
    )
    doc = json.loads(path.read_text())
    assert doc["format"] == FORMAT and doc["version"] == 1
    assert (doc["layers"], doc["experts_per_layer"], doc["chiplets"]) == (2, 3, 2)
    assert doc["placement"] == [[[0, 1], [], []], [[], [], [1]]]
    assert list(doc["meta"]) == ["a", "z"]  # sorted
    lines = path.read_text().splitlines()
    assert "      [0, 1]," in lines  # one line per expert: diff-friendly
    loaded = read_placement_file(path)
    assert (loaded.page_gb, loaded.instance, loaded.meta) == (0.5, "small", {"a": [1, 2], "z": 1})
    first = path.read_bytes()
    write_placement(Placement(resident), path, page_gb=0.5, instance="small", meta={"a": [1, 2], "z": 1})
    assert path.read_bytes() == first  # deterministic
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"]  # no temporary files left


def _valid_doc() -> dict:
    return {
        "format": FORMAT,
        "version": 1,
        "layers": 2,
        "experts_per_layer": 3,
        "chiplets": 2,
        "placement": [[[0], [1], []], [[0, 1], [], [1]]],
    }


def _with(**changes) -> dict:
    doc = _valid_doc()
    for key, value in changes.items():
        if value is _DROP:
            del doc[key]
        else:
            doc[key] = value
    return doc


_DROP = object()


@pytest.mark.parametrize(
    ("doc", "needles"),
    [
        ("{not json", ["not valid JSON", "line 1"]),
        ([1, 2], ["must be a JSON object"]),
        (_with(format="other"), ["format", "comoe-placement"]),
        (_with(version=2), ["version", "unsupported version 2"]),
        (_with(version="1"), ["version", "integer"]),
        (_with(layers=0), ["layers", "positive integer"]),
        (_with(chiplets=True), ["chiplets", "positive integer"]),
        (_with(placment=[]), ["placment", "unknown key"]),
        (_with(placement=_DROP), ["placement", "missing"]),
        (_with(page_gb=-1), ["page_gb", "positive"]),
        (_with(meta=[1]), ["meta", "JSON object"]),
        (_with(placement=[[[0], [1], []]]), ["placement:", "1 entries, expected 2 layers"]),
        (_with(placement=[[[0], [1]], [[0], [1], []]]), ["placement[0]", "expected 3 experts"]),
        (_with(placement=[[[0], 1, []], [[0], [1], []]]), ["placement[0][1]", "list of chiplet ids"]),
        (_with(placement=[[[0], [1], []], [[0, 2], [], []]]), ["placement[1][0][1]", "out of range 0..1"]),
        (_with(placement=[[[0], [1], []], [[-1], [], []]]), ["placement[1][0][0]", "out of range"]),
        (_with(placement=[[[0], [1], []], [[1, 1], [], []]]), ["placement[1][0]", "listed twice"]),
        (_with(placement=[[[0.5], [1], []], [[0], [], []]]), ["placement[0][0][0]", "integer"]),
        (_with(placement=[[[True], [1], []], [[0], [], []]]), ["placement[0][0][0]", "integer"]),
    ],
)
def test_own_json_malformed(tmp_path, doc, needles):
    path = _write(tmp_path / "bad.json", doc)
    with pytest.raises(InputError) as exc:
        read_placement(path)
    _assert_error(exc, path, *needles)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [({"layers": 3}, "layers"), ({"experts": 4}, "experts_per_layer"), ({"chiplets": 1}, "chiplets")],
)
def test_own_json_expected_shape_mismatch(tmp_path, kwargs, needle):
    path = _write(tmp_path / "p.json", _valid_doc())
    read_placement(path, layers=2, experts=3, chiplets=2)
    with pytest.raises(InputError) as exc:
        read_placement(path, **kwargs)
    _assert_error(exc, path, needle, "expected")


def test_own_json_missing_file(tmp_path):
    with pytest.raises(InputError) as exc:
        read_placement(tmp_path / "none.json")
    _assert_error(exc, tmp_path / "none.json", "no such")


# ------------------------------------------------------------------ SGLang


@given(case=placement_and_load())
def test_sglang_export_invariants(tmp_path_factory, case):
    placement, load = case
    path = tmp_path_factory.mktemp("sgl") / "loc.json"
    write_sglang(placement, path, load=load)
    doc = json.loads(path.read_text())
    assert list(doc) == ["physical_to_logical_map"]  # SGLang passes every key to init_by_mapping(**doc)
    table = np.array(doc["physical_to_logical_map"])
    layers, experts, devices = placement.resident.shape
    assert table.ndim == 2 and table.shape[0] == layers  # every layer the same number of physical slots
    physical = table.shape[1]
    assert physical % devices == 0
    slots = physical // devices
    assert slots == placement.resident.sum(axis=1).max()
    for li in range(layers):
        assert set(table[li].tolist()) == set(range(experts))  # every logical expert present
        for d in range(devices):
            mine = table[li, d * slots : (d + 1) * slots]  # contiguous slots of device d
            assert len(set(mine.tolist())) == slots  # no expert twice on one device
            own = set(np.flatnonzero(placement.resident[li, :, d]).tolist())
            assert own <= set(mine.tolist())  # every original replica on its device
    back = read_sglang(path, devices, experts=experts)
    assert back.resident.shape == placement.resident.shape
    assert np.all(back.resident >= placement.resident)  # originals kept, padding only adds
    assert back.resident.sum(axis=(1, 2)).tolist() == [physical] * layers


def test_sglang_padding_follows_load_per_replica(tmp_path):
    resident = np.zeros((1, 4, 3), dtype=bool)
    resident[0, [0, 1, 2], 0] = True  # device 0 holds 0, 1, 2
    resident[0, 3, [1, 2]] = True  # devices 1 and 2 hold only 3: two padding slots each
    placement = Placement(resident)
    load = np.array([[25.0, 40.0, 30.0, 5.0]])
    slots = device_slots(placement, load)[0]
    assert slots[0].tolist() == [0, 1, 2]
    assert slots[1].tolist() == [3, 1, 2]  # 40/1, then 30/1
    assert slots[2].tolist() == [3, 0, 1]  # now 25/1 > 40/2 > 30/2, then 40/2 > 30/2
    assert device_slots(placement)[0, 1:].tolist() == [[3, 0, 1], [3, 0, 1]]  # without load: lowest ids
    tie = np.ones((1, 4))
    assert device_slots(placement, tie)[0, 1:].tolist() == [[3, 0, 1], [3, 2, 0]]  # ties: lowest id
    path = write_sglang(placement, tmp_path / "loc.json", load=load)
    assert json.loads(path.read_text())["physical_to_logical_map"] == [[0, 1, 2, 3, 1, 2, 3, 0, 1]]


def test_sglang_missing_replica_is_an_error(tmp_path):
    resident = np.zeros((2, 3, 2), dtype=bool)
    resident[:, :, 0] = True
    resident[1, 2, 0] = False
    path = tmp_path / "loc.json"
    with pytest.raises(InputError) as exc:
        write_sglang(Placement(resident), path)
    _assert_error(exc, path, "placement[1][2]", "SGLang needs every expert resident")
    assert list(tmp_path.iterdir()) == []  # nothing written, no temporary file


def test_sglang_needs_json_suffix(tmp_path):
    placement = Placement(np.ones((1, 2, 2), dtype=bool))
    with pytest.raises(InputError) as exc:
        write_sglang(placement, tmp_path / "loc.txt")
    _assert_error(exc, tmp_path / "loc.txt", ".json")


def test_sglang_bad_load_is_an_error(tmp_path):
    placement = Placement(np.ones((1, 2, 2), dtype=bool))
    with pytest.raises(InputError) as exc:
        write_sglang(placement, tmp_path / "loc.json", load=np.ones((2, 2)))
    _assert_error(exc, tmp_path / "loc.json", "load", "shape")
    with pytest.raises(InputError) as exc:
        write_sglang(placement, tmp_path / "loc.json", load=np.array([[1.0, -1.0]]))
    _assert_error(exc, tmp_path / "loc.json", "load", "negative")


def test_sglang_model_layers_with_dense_rows(tmp_path):
    resident = np.zeros((2, 4, 2), dtype=bool)
    resident[:, [0, 1], 0] = True
    resident[:, [2, 3], 1] = True
    placement = Placement(resident)
    path = write_sglang(placement, tmp_path / "loc.json", layer_ids=[1, 3], num_model_layers=5)
    table = json.loads(path.read_text())["physical_to_logical_map"]
    assert len(table) == 5
    assert table[0] == table[2] == table[4] == [0, 1, 2, 3]  # SGLang's trivial map for dense layers
    assert table[1] == table[3] == [0, 1, 2, 3]
    back = read_sglang(path, 2, layer_ids=[1, 3])
    assert np.array_equal(back.resident, resident)
    with pytest.raises(InputError, match="layer_ids"):
        write_sglang(placement, tmp_path / "x.json", layer_ids=[3, 1])
    with pytest.raises(InputError, match="layer_ids"):
        write_sglang(placement, tmp_path / "x.json", layer_ids=[1, 5], num_model_layers=5)


@pytest.mark.parametrize(
    ("doc", "chiplets", "needles"),
    [
        ({"logical_count": [[1]]}, 1, ["physical_to_logical_map", "missing"]),
        ({"physical_to_logical_map": [[0, 1]], "meta": {}}, 1, ["meta", "unexpected key"]),
        ({"physical_to_logical_map": [[0, 1], [0]]}, 1, ["physical_to_logical_map[1]", "same count"]),
        ({"physical_to_logical_map": [[0, -1]]}, 1, ["physical_to_logical_map[0][1]", "non-negative"]),
        ({"physical_to_logical_map": [[0, 1, 2]]}, 2, ["physical_to_logical_map", "do not split over 2"]),
        ({"physical_to_logical_map": []}, 1, ["physical_to_logical_map", "non-empty"]),
    ],
)
def test_sglang_malformed(tmp_path, doc, chiplets, needles):
    path = _write(tmp_path / "loc.json", doc)
    with pytest.raises(InputError) as exc:
        read_sglang(path, chiplets)
    _assert_error(exc, path, *needles)


def test_sglang_expert_out_of_range(tmp_path):
    path = _write(tmp_path / "loc.json", {"physical_to_logical_map": [[0, 5]]})
    with pytest.raises(InputError) as exc:
        read_sglang(path, 1, experts=4)
    _assert_error(exc, path, "physical_to_logical_map", "out of range 0..3")


def test_sglang_reads_colocated_duplicates_as_one_replica(tmp_path):
    # SGLang accepts two slots of one device holding the same expert (EPLB makes them); we never write any.
    path = _write(tmp_path / "loc.json", {"physical_to_logical_map": [[0, 0, 1, 2]]})
    back = read_sglang(path, 2)
    assert back.resident[0].astype(int).tolist() == [[1, 0], [0, 1], [0, 1]]


# ------------------------------------------------------------- vLLM-Ascend


@given(case=placement_and_load())
def test_vllm_ascend_round_trip(tmp_path_factory, case):
    placement, load = case
    path = tmp_path_factory.mktemp("va") / "map.json"
    write_vllm_ascend(placement, path, load=load)
    doc = json.loads(path.read_text())
    layers, experts, devices = placement.resident.shape
    assert doc["moe_layer_count"] == layers == len(doc["layer_list"])
    slots = int(placement.resident.sum(axis=1).max())
    for li, layer in enumerate(doc["layer_list"]):
        assert set(layer) == {"layer_id", "device_count", "device_list"}
        assert layer["layer_id"] == li and layer["device_count"] == devices == len(layer["device_list"])
        seen = set()
        for d, dev in enumerate(layer["device_list"]):
            assert set(dev) == {"device_id", "device_expert"} and dev["device_id"] == d
            assert len(dev["device_expert"]) == slots  # equal counts (vLLM-Ascend builds a dense tensor)
            assert len(set(dev["device_expert"])) == slots  # no expert twice on one device
            seen |= set(dev["device_expert"])
        assert seen == set(range(experts))
    back = read_vllm_ascend(path, experts=experts)
    assert back.resident.shape == placement.resident.shape
    assert np.all(back.resident >= placement.resident)
    assert back.resident.sum(axis=(1, 2)).tolist() == [devices * slots] * layers


def test_vllm_ascend_missing_replica_is_an_error(tmp_path):
    resident = np.ones((1, 3, 2), dtype=bool)
    resident[0, 1] = False
    with pytest.raises(InputError) as exc:
        write_vllm_ascend(Placement(resident), tmp_path / "map.json")
    _assert_error(exc, tmp_path / "map.json", "placement[0][1]", "vLLM-Ascend")


def _vllm_doc() -> dict:
    return {
        "moe_layer_count": 2,
        "layer_list": [
            {
                "layer_id": li,
                "device_count": 2,
                "device_list": [
                    {"device_id": 0, "device_expert": [0, 1]},
                    {"device_id": 1, "device_expert": [2, 3]},
                ],
            }
            for li in range(2)
        ],
    }


def _vllm_with(edit) -> dict:
    doc = _vllm_doc()
    edit(doc)
    return doc


@pytest.mark.parametrize(
    ("doc", "needles"),
    [
        ("[", ["not valid JSON"]),
        (_vllm_with(lambda d: d.update(moe_layer_count=3)), ["layer_list", "expected 3"]),
        (_vllm_with(lambda d: d.pop("moe_layer_count")), ["moe_layer_count", "positive integer"]),
        (
            _vllm_with(lambda d: d["layer_list"][1].update(layer_id=7)),
            ["layer_list[1].layer_id", "must be 1"],
        ),
        (
            _vllm_with(lambda d: d["layer_list"][1].pop("device_count")),
            ["layer_list[1].device_count", "missing"],
        ),
        (
            _vllm_with(lambda d: d["layer_list"][0].update(device_count=3)),
            ["layer_list[0].device_list", "expected 3"],
        ),
        (
            _vllm_with(lambda d: d["layer_list"][1]["device_list"][1].update(device_id=0)),
            ["layer_list[1].device_list[1].device_id", "must be 1"],
        ),
        (
            _vllm_with(lambda d: d["layer_list"][1]["device_list"][1].update(device_expert=[2, 3, 0])),
            ["layer_list[1].device_list[1].device_expert", "equal counts"],
        ),
        (
            _vllm_with(lambda d: d["layer_list"][0]["device_list"][0].update(device_expert=[1, 1])),
            ["layer_list[0].device_list[0].device_expert", "listed twice"],
        ),
        (
            _vllm_with(lambda d: d["layer_list"][0]["device_list"][0].update(device_expert=[0, "1"])),
            ["layer_list[0].device_list[0].device_expert[1]", "integer"],
        ),
    ],
)
def test_vllm_ascend_malformed(tmp_path, doc, needles):
    path = _write(tmp_path / "map.json", doc)
    with pytest.raises(InputError) as exc:
        read_vllm_ascend(path)
    _assert_error(exc, path, *needles)


def test_vllm_ascend_reads_upstream_example(tmp_path):
    path = _write(tmp_path / "map.json", _vllm_doc())
    back = read_vllm_ascend(path)
    assert back.resident.shape == (2, 4, 2)
    assert back.resident[0].astype(int).tolist() == [[1, 0], [1, 0], [0, 1], [0, 1]]
    with pytest.raises(InputError) as exc:
        read_vllm_ascend(path, experts=3)
    _assert_error(exc, path, "out of range 0..2")


# ------------------------------------------------------------- load counts

COUNTS = [[3, 0, 5], [1, 2, 0]]


def test_load_counts_json_object_and_bare_list(tmp_path):
    for doc in ({"logical_count": COUNTS}, {"counts": COUNTS}, COUNTS, {"logical_count": COUNTS, "rank": 0}):
        path = _write(tmp_path / "c.json", doc)
        counts = read_load_counts(path, layers=2, experts=3)
        assert counts.dtype == np.float64
        assert counts.tolist() == COUNTS


def test_load_counts_npz(tmp_path):
    for key in ("logical_count", "counts"):
        path = tmp_path / f"{key}.npz"
        np.savez(path, **{key: np.array(COUNTS, dtype=np.int32)})
        assert read_load_counts(path).tolist() == COUNTS


def test_load_counts_sums_sglang_steps(tmp_path):
    steps = np.array([COUNTS, COUNTS, [[0, 0, 1], [0, 0, 0]]])
    expected = [[6, 0, 11], [2, 4, 0]]
    path = _write(tmp_path / "dump.json", {"logical_count": steps.tolist(), "rank": 0})
    assert read_load_counts(path, layers=2, experts=3).tolist() == expected
    npz = tmp_path / "dump.npz"
    np.savez(npz, logical_count=steps)
    assert read_load_counts(npz).tolist() == expected
    # a model with a dense first layer: its all-zero row is dropped by layer_ids
    dense = np.concatenate([np.zeros((3, 1, 3)), steps], axis=1)
    np.savez(npz, logical_count=dense)
    assert read_load_counts(npz, layers=2, layer_ids=[1, 2]).tolist() == expected


@pytest.mark.parametrize(
    ("doc", "needles"),
    [
        ({"logical_count": [[1, "x"], [1, 2]]}, ["logical_count[0][1]", "not a number"]),
        ({"logical_count": [[1, None], [1, 2]]}, ["logical_count[0][1]", "not a number"]),
        ({"logical_count": [[1, True], [1, 2]]}, ["logical_count[0][1]", "not a number"]),
        ({"logical_count": [[1, 2], [1, -2]]}, ["logical_count[1][1]", "negative"]),
        ('{"logical_count": [[1, NaN], [1, 2]]}', ["logical_count[0][1]", "finite"]),
        ({"logical_count": [[1, 2], [1]]}, ["logical_count[1]", "ragged"]),
        ({"logical_count": [[1, 2], 3]}, ["logical_count[1]", "ragged"]),
        ({"logical_count": [1, 2]}, ["logical_count", "shape"]),
        ({"logical_count": [[0, 0], [0, 0]]}, ["logical_count", "all counts are zero"]),
        ({"logical_count": 4}, ["logical_count", "list of lists"]),
        ({"something": []}, ["logical_count"]),
        ([[1, 2], [3]], ["[1]", "ragged"]),
        ("nope", ["not valid JSON"]),
    ],
)
def test_load_counts_json_malformed(tmp_path, doc, needles):
    path = _write(tmp_path / "c.json", doc)
    with pytest.raises(InputError) as exc:
        read_load_counts(path)
    _assert_error(exc, path, *needles)


def test_load_counts_shape_mismatch(tmp_path):
    path = _write(tmp_path / "c.json", {"logical_count": COUNTS})
    with pytest.raises(InputError) as exc:
        read_load_counts(path, layers=4)
    _assert_error(exc, path, "logical_count", "2 layers, expected 4")
    with pytest.raises(InputError) as exc:
        read_load_counts(path, experts=8)
    _assert_error(exc, path, "logical_count", "3 experts, expected 8")


@pytest.mark.parametrize(
    ("arrays", "needles"),
    [
        ({"counts": np.array([[1.0, np.nan]])}, ["counts[0][1]", "NaN"]),
        ({"counts": np.array([[1, -3]])}, ["counts[0][1]", "negative"]),
        ({"logical_count": np.array([["a", "b"]])}, ["logical_count", "numeric"]),
        ({"counts": np.zeros((2, 3))}, ["counts", "all counts are zero"]),
        ({"counts": np.ones((2, 2, 2, 2))}, ["counts", "shape"]),
        ({"other": np.ones((2, 2))}, ["holds no array"]),
    ],
)
def test_load_counts_npz_malformed(tmp_path, arrays, needles):
    path = tmp_path / "c.npz"
    np.savez(path, **arrays)
    with pytest.raises(InputError) as exc:
        read_load_counts(path)
    _assert_error(exc, path, *needles)


def test_load_counts_other_files(tmp_path):
    import importlib.util

    torch = importlib.util.find_spec("torch") is not None  # with torch the dump is read: a bad one is named
    for name, needle in (
        ("c.pt", "not a readable PyTorch file" if torch else "convert"),
        ("c.csv", "unknown load-count format"),
        ("none.json", "no such"),
    ):
        path = tmp_path / name
        if name != "none.json":
            path.write_bytes(b"x")
        with pytest.raises(InputError) as exc:
            read_load_counts(path)
        _assert_error(exc, path, needle)
    broken = tmp_path / "broken.npz"
    broken.write_bytes(b"not a zip")
    with pytest.raises(InputError) as exc:
        read_load_counts(broken)
    _assert_error(exc, broken, "not a readable .npz")


def test_sglang_read_layer_ids_out_of_range(tmp_path):
    path = _write(tmp_path / "loc.json", {"physical_to_logical_map": [[0, 1], [1, 0]]})
    with pytest.raises(InputError) as exc:
        read_sglang(path, 2, layer_ids=[1, 2])
    _assert_error(exc, path, "layer_ids", "out of range")


def test_write_placement_rejects_bad_header(tmp_path):
    placement = Placement(np.ones((1, 2, 2), dtype=bool))
    with pytest.raises(InputError, match="meta"):
        write_placement(placement, tmp_path / "p.json", meta={"x": object()})
    with pytest.raises(InputError, match="meta"):
        write_placement(placement, tmp_path / "p.json", meta={"x": float("nan")})
    with pytest.raises(InputError, match="page_gb"):
        write_placement(placement, tmp_path / "p.json", page_gb=0)
    assert list(tmp_path.iterdir()) == []


def test_docs_examples_are_what_the_writers_write(tmp_path):
    text = (Path(__file__).resolve().parents[1] / "docs" / "placement-format.md").read_text(encoding="utf-8")
    blocks = [b.split("```", 1)[0] for b in text.split("```json\n")[1:]]
    own, sglang, vllm = blocks
    resident = np.zeros((2, 4, 3), dtype=bool)
    for li, layer in enumerate([[[0], [1, 2], [], [0, 2]], [[2], [0], [1], [0, 1, 2]]]):
        for e, chiplets in enumerate(layer):
            resident[li, e, chiplets] = True
    meta = {"method": "milp", "window": [0, 256]}
    path = write_placement(
        Placement(resident), tmp_path / "p.json", page_gb=1.0, instance="paper-baseline", meta=meta
    )
    assert path.read_text() == own
    resident = resident.copy()  # Placement made the array read-only
    resident[0, 2, 2] = True
    load = np.array([[50, 80, 10, 30], [20, 60, 40, 90]])
    assert write_sglang(Placement(resident), tmp_path / "s.json", load=load).read_text() == sglang
    assert write_vllm_ascend(Placement(resident), tmp_path / "v.json", load=load).read_text() == vllm
