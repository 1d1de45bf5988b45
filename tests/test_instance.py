"""Instance files: the paper baseline, per-chiplet values, round trips and every kind of bad input."""

from __future__ import annotations

import copy
import dataclasses
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import BASELINE, ROOT, small_table
from hypothesis import given
from hypothesis import strategies as st

from comoe_opt.errors import InputError
from comoe_opt.instance import (
    FileTrace,
    Instance,
    Policy,
    SyntheticTrace,
    instance_from_table,
    load_instance,
    to_table,
)

# ----------------------------------------------------------------- baseline


def test_paper_baseline_has_table3_values() -> None:
    inst = load_instance(BASELINE)
    assert inst.name == "paper-baseline"
    assert inst.model.layers == 32
    assert inst.model.experts_per_layer == 64
    assert inst.model.top_k == 2
    assert inst.model.page_gb == 1.0
    assert inst.model.logical_experts == 32 * 64
    assert inst.hardware.chiplets == 8
    assert inst.hardware.d2d_bandwidth_gb_s == 512.0
    assert isinstance(inst.trace, SyntheticTrace)
    assert inst.trace.tokens_per_batch == 64
    assert inst.trace.zipf_alpha == 1.1
    assert inst.trace.rho == 0.65
    # per-chiplet values (assumed constants, not the paper's) expanded to one per chiplet
    for name in ("capacity_gb", "local_bandwidth_gb_s", "peak_tflops", "nop_hops", "prefetch_buffer_gb"):
        assert len(getattr(inst.hardware, name)) == 8, name
    assert len(set(inst.hardware.capacity_gb)) == 1
    assert inst.source == BASELINE.absolute()  # as named: the link to the shipped copy is kept


def test_defaults_filled_in(table: dict, write_toml: Callable[..., Path]) -> None:
    del table["policy"]
    table["trace"].pop("successor_weight", None)
    inst = load_instance(write_toml(table))
    assert inst.policy == Policy()  # every policy knob at its documented default
    default_weight = {f.name: f.default for f in dataclasses.fields(SyntheticTrace)}["successor_weight"]
    assert inst.trace.successor_weight == default_weight
    table["policy"] = {"window_batches": 7}
    inst = load_instance(write_toml(table, name="partial"))
    assert inst.policy == dataclasses.replace(Policy(), window_batches=7)


def test_name_defaults_to_file_stem(table: dict, write_toml: Callable[..., Path]) -> None:
    del table["name"]
    assert load_instance(write_toml(table, name="my-run")).name == "my-run"


def test_token_bytes(table: dict, write_toml: Callable[..., Path]) -> None:
    inst = load_instance(write_toml(table))
    assert inst.model.token_bytes == 16 * 2


# ------------------------------------------------------------ per-chiplet


def test_per_chiplet_scalar_expands(table: dict, write_toml: Callable[..., Path]) -> None:
    table["hardware"]["chiplets"] = 5
    table["hardware"]["nop_hops"] = 3
    hw = load_instance(write_toml(table)).hardware
    assert hw.capacity_gb == (4.0, 4.0, 4.0, 4.0, 4.0)
    assert hw.nop_hops == (3, 3, 3, 3, 3)
    assert all(isinstance(v, float) for v in hw.capacity_gb)
    assert all(isinstance(v, int) for v in hw.nop_hops)
    for name in ("capacity_gb", "local_bandwidth_gb_s", "peak_tflops", "nop_hops", "prefetch_buffer_gb"):
        assert len(getattr(hw, name)) == 5, name


def test_per_chiplet_list_kept_in_order(table: dict, write_toml: Callable[..., Path]) -> None:
    table["hardware"]["capacity_gb"] = [1, 2.5, 3, 4]
    hw = load_instance(write_toml(table)).hardware
    assert hw.capacity_gb == (1.0, 2.5, 3.0, 4.0)


@pytest.mark.parametrize("values", [[4, 4, 4], [4, 4, 4, 4, 4], []])
def test_per_chiplet_list_wrong_length(table: dict, write_toml: Callable[..., Path], values: list) -> None:
    table["hardware"]["capacity_gb"] = values
    path = write_toml(table)
    with pytest.raises(InputError) as info:
        load_instance(path)
    assert info.value.field == "hardware.capacity_gb"
    assert f"({4}), got {len(values)}" in str(info.value)
    assert str(path) in str(info.value)


# ---------------------------------------------------------------- round trip


def test_round_trip_baseline(tmp_path: Path) -> None:
    inst = load_instance(BASELINE)
    copy_path = tmp_path / "copy.toml"
    copy_path.write_text(inst.to_toml(), encoding="utf-8")
    again = load_instance(copy_path)
    assert to_table(again) == to_table(inst)
    assert (again.model, again.hardware, again.trace, again.policy) == (
        inst.model,
        inst.hardware,
        inst.trace,
        inst.policy,
    )
    assert again.name == inst.name


def test_round_trip_file_trace(table: dict, write_toml: Callable[..., Path], tmp_path: Path) -> None:
    table["trace"] = {"kind": "file", "path": "t.npz", "tokens_per_batch": 4, "batching": "token-order"}
    inst = load_instance(write_toml(table))
    assert isinstance(inst.trace, FileTrace)
    assert inst.resolve(inst.trace.path) == (tmp_path / "t.npz").resolve()
    again = instance_from_table(tomllib.loads(inst.to_toml()), "again.toml")
    assert to_table(again) == to_table(inst)
    assert again.trace == inst.trace


finite = st.floats(min_value=0.001, max_value=1e4, allow_nan=False, allow_infinity=False)


@st.composite
def instance_tables(draw: st.DrawFn) -> dict[str, Any]:
    t = small_table()
    chiplets = draw(st.integers(1, 6))
    experts = draw(st.integers(2, 64))
    t["model"].update(
        layers=draw(st.integers(1, 64)),
        experts_per_layer=experts,
        top_k=draw(st.integers(1, experts)),
        page_gb=draw(finite),
    )
    hw = t["hardware"]
    hw["chiplets"] = chiplets
    for key in ("capacity_gb", "local_bandwidth_gb_s", "peak_tflops", "prefetch_buffer_gb"):
        hw[key] = draw(st.one_of(finite, st.lists(finite, min_size=chiplets, max_size=chiplets)))
    hw["nop_hops"] = draw(
        st.one_of(st.integers(0, 9), st.lists(st.integers(0, 9), min_size=chiplets, max_size=chiplets))
    )
    t["trace"].update(
        zipf_alpha=draw(st.floats(0, 5)),
        rho=draw(st.floats(0, 1)),
        successor_weight=draw(st.floats(0, 1)),
        seed=draw(st.integers(0, 2**63 - 1)),
    )
    high = draw(st.floats(0, 1))
    t["policy"].update(theta_high=high, theta_low=draw(st.floats(0, high)))
    return t


@given(instance_tables())
def test_round_trip_property(t: dict[str, Any]) -> None:
    inst = instance_from_table(copy.deepcopy(t), "prop.toml")
    again = instance_from_table(tomllib.loads(inst.to_toml()), "prop.toml")
    assert to_table(again) == to_table(inst)
    assert again == inst
    chiplets = t["hardware"]["chiplets"]
    assert len(inst.hardware.capacity_gb) == chiplets
    assert len(inst.hardware.nop_hops) == chiplets


def test_instance_is_frozen() -> None:
    inst = load_instance(BASELINE)
    with pytest.raises(AttributeError):
        inst.model.layers = 3  # type: ignore[misc]
    assert isinstance(inst, Instance)


# ---------------------------------------------------------------- bad input

Mutation = Callable[[dict[str, Any]], Any]


def _set(section: str | None, key: str, value: Any) -> Mutation:
    def mutate(t: dict[str, Any]) -> None:
        (t if section is None else t[section])[key] = value

    return mutate


def _del(section: str | None, key: str) -> Mutation:
    def mutate(t: dict[str, Any]) -> None:
        del (t if section is None else t[section])[key]

    return mutate


def _file_trace(**extra: Any) -> Mutation:
    def mutate(t: dict[str, Any]) -> None:
        t["trace"] = {"kind": "file", "path": "t.npz", "tokens_per_batch": 4, **extra}

    return mutate


# (id, mutation, dotted key that must appear, problem text that must appear)
BAD: list[tuple[str, Mutation, str, str]] = [
    ("unknown-top-level", _set(None, "extra", 1), "extra", "unknown key"),
    ("unknown-in-model", _set("model", "layerz", 3), "model.layerz", "unknown key"),
    ("unknown-in-hardware", _set("hardware", "chiplet", 3), "hardware.chiplet", "unknown key"),
    ("unknown-in-trace", _set("trace", "colour", "red"), "trace.colour", "unknown key"),
    ("unknown-in-policy", _set("policy", "speed", 1), "policy.speed", "unknown key"),
    ("synthetic-key-in-file-trace", _file_trace(rho=0.5), "trace.rho", "unknown key"),
    ("missing-key-model", _del("model", "top_k"), "model.top_k", "missing required key"),
    ("missing-key-hardware", _del("hardware", "chiplets"), "hardware.chiplets", "missing required key"),
    ("missing-key-trace", _del("trace", "seed"), "trace.seed", "missing required key"),
    ("missing-kind", _del("trace", "kind"), "trace.kind", "missing required key"),
    ("missing-table-model", _del(None, "model"), "[model]", "missing required table"),
    ("missing-table-hardware", _del(None, "hardware"), "[hardware]", "missing required table"),
    ("missing-table-trace", _del(None, "trace"), "[trace]", "missing required table"),
    ("string-for-int", _set("model", "layers", "32"), "model.layers", "must be an integer"),
    ("bool-for-int", _set("model", "layers", True), "model.layers", "must be an integer"),
    ("float-for-int", _set("model", "layers", 32.0), "model.layers", "must be an integer"),
    ("float-for-int-list", _set("hardware", "nop_hops", [1, 1.5, 2, 2]), "hardware.nop_hops[1]", "integer"),
    ("bool-for-float", _set("trace", "rho", True), "trace.rho", "must be a number"),
    ("string-for-float", _set("model", "page_gb", "1 GB"), "model.page_gb", "must be a number"),
    ("nan-float", _set("trace", "zipf_alpha", float("nan")), "trace.zipf_alpha", "finite"),
    ("string-for-string-name", _set(None, "name", 5), "name", "must be a string"),
    ("table-is-scalar", _set(None, "hardware", "big"), "hardware", "must be a table"),
    ("policy-is-scalar", _set(None, "policy", 3), "policy", "must be a table"),
    ("negative-capacity", _set("hardware", "capacity_gb", -1), "hardware.capacity_gb", "must be >= 0"),
    (
        "negative-capacity-in-list",
        _set("hardware", "capacity_gb", [4, 4, -1, 4]),
        "hardware.capacity_gb[2]",
        "must be >= 0",
    ),
    ("zero-bandwidth", _set("hardware", "d2d_bandwidth_gb_s", 0), "hardware.d2d_bandwidth_gb_s", "> 0"),
    ("rho-above-1", _set("trace", "rho", 1.5), "trace.rho", "must be <= 1"),
    ("negative-alpha", _set("trace", "zipf_alpha", -0.1), "trace.zipf_alpha", "must be >= 0"),
    ("zero-layers", _set("model", "layers", 0), "model.layers", "must be >= 1"),
    ("one-expert", _set("model", "experts_per_layer", 1), "model.experts_per_layer", "must be >= 2"),
    ("top-k-above-experts", _set("model", "top_k", 9), "model.top_k", "experts_per_layer (8)"),
    ("zero-page", _set("model", "page_gb", 0), "model.page_gb", "must be > 0"),
    ("theta-low-above-high", _set("policy", "theta_low", 0.9), "policy.theta_low", "theta_high"),
    ("bad-trace-kind", _set("trace", "kind", "replay"), "trace.kind", "'synthetic', 'file' or 'counts'"),
    ("bad-batching", _file_trace(batching="prefill"), "trace.batching", "must be one of"),
    (
        "file-trace-missing-path",
        lambda t: _file_trace()(t) or t["trace"].pop("path"),
        "trace.path",
        "missing",
    ),
]


@pytest.fixture(params=BAD, ids=[case[0] for case in BAD])
def bad_instance(request: pytest.FixtureRequest, table: dict, write_toml: Callable[..., Path]):
    name, mutate, key, problem = request.param
    mutate(table)
    return write_toml(table, name=name), key, problem


def test_bad_instance_raises_input_error(bad_instance: tuple[Path, str, str]) -> None:
    path, key, problem = bad_instance
    with pytest.raises(InputError) as info:
        load_instance(path)
    message = str(info.value)
    assert info.value.source == str(path)
    assert info.value.field == key
    assert message.startswith(f"{path}: {key}: ")
    assert problem in message


def test_bad_instance_cli(bad_instance: tuple[Path, str, str], cli) -> None:
    path, key, problem = bad_instance
    result = cli("instance", "show", path)
    line = result.assert_user_error(path.name, key, problem)
    assert line.startswith("comoe-opt: error: ")
    assert result.out == ""


RAW: list[tuple[str, str | bytes, str]] = [
    ("syntax", "name = 'x'\n[model\nlayers = 3\n", "not valid TOML"),
    ("unterminated", "name = 'x\n", "not valid TOML"),
    ("duplicate-key", "[model]\nlayers = 1\nlayers = 2\n", "not valid TOML"),
    ("not-utf8", b"name = '\xff\xfe'\n", "cannot read"),
    ("empty", "", "missing required table"),
]


@pytest.mark.parametrize(("name", "content", "problem"), RAW, ids=[r[0] for r in RAW])
def test_unparsable_instance(tmp_path: Path, cli, name: str, content: str | bytes, problem: str) -> None:
    path = tmp_path / f"{name}.toml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(InputError) as info:
        load_instance(path)
    assert str(path) in str(info.value)
    assert problem in str(info.value)
    cli("instance", "show", path).assert_user_error(path.name, problem)


def test_missing_instance_file(tmp_path: Path, cli) -> None:
    path = tmp_path / "nowhere.toml"
    with pytest.raises(InputError, match="no such instance file") as info:
        load_instance(path)
    assert info.value.source == str(path)
    out = tmp_path / "o.npz"
    for args in (
        ["solve", path],
        ["instance", "show", path],
        ["trace", "info", path],
        ["trace", "gen", path, "-o", out],
    ):
        cli(*args).assert_user_error("nowhere.toml", "no such instance file")
    assert not out.exists()


def test_instance_is_a_directory(tmp_path: Path, cli) -> None:
    path = tmp_path / "dir.toml"
    path.mkdir()
    with pytest.raises(InputError, match="cannot read"):
        load_instance(path)
    cli("instance", "show", path).assert_user_error("dir.toml")


@pytest.mark.parametrize("kind", [[1], {"a": 1}], ids=["list", "table"])
def test_unhashable_trace_kind(table: dict, write_toml: Callable[..., Path], kind: Any) -> None:
    table["trace"]["kind"] = kind
    with pytest.raises(InputError, match=r"trace\.kind"):
        load_instance(write_toml(table))


@pytest.mark.parametrize(
    ("mutate", "key"),
    [(_set("trace", "colour", "red"), "trace.colour"), (_set("trace", "rho", 1.5), "trace.rho")],
    ids=["unknown-key", "out-of-range"],
)
def test_console_script_one_line_error(
    table: dict, write_toml: Callable[..., Path], mutate: Mutation, key: str
) -> None:
    """The installed `comoe-opt` script itself: exit 2, one stderr line, no traceback."""
    script = Path(sys.executable).parent / "comoe-opt"
    if not script.exists():
        pytest.skip(f"console script not installed at {script}")
    mutate(table)
    path = write_toml(table)
    proc = subprocess.run(
        [str(script), "trace", "info", str(path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert path.name in lines[0] and key in lines[0]


@pytest.mark.parametrize("name", ["paper-baseline", "paper-regime"])
def test_paper_instances_ship_with_the_package(name):
    """`comoe-opt paper` works outside a checkout: its default instances are package data, and
    the checkout's instances/<name>.toml is that same file."""
    from comoe_opt.instance import packaged_instance

    packaged = packaged_instance(f"{name}.toml")
    assert packaged.is_file()
    assert (ROOT / "instances" / f"{name}.toml").resolve() == packaged.resolve()
    assert load_instance(packaged).name == name
