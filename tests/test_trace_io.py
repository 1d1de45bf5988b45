"""Trace files: npz/Parquet round trips, atomic writes, and clear errors on malformed files."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from comoe_opt.errors import InputError
from comoe_opt.trace import AggregateTrace, Trace, read_trace, write_trace
from comoe_opt.trace.io import FORMAT

# ------------------------------------------------------------------ helpers


def make_trace(tokens: int = 12, layers: int = 3, k: int = 2, experts: int = 6, seed: int = 0, **kw: Any):
    """A valid per-token trace with distinct ids, gate weights, sequences and positions."""
    rng = np.random.default_rng(seed)
    topk = np.argsort(rng.random((tokens, layers, experts)), axis=2)[:, :, :k].astype(np.int16)
    probs = rng.random((tokens, layers, k)).astype(np.float32)
    lengths = [3, 1, 5, 3] if tokens == 12 else [tokens]
    seq_id = np.repeat(np.arange(len(lengths), dtype=np.int32) * 7, lengths)
    pos = np.concatenate([np.arange(n, dtype=np.int32) + 10 for n in lengths])
    args: dict[str, Any] = dict(
        topk=topk,
        num_experts=experts,
        probs=probs,
        seq_id=seq_id,
        pos=pos,
        layer_ids=np.array([0, 7, 15][:layers] if layers <= 3 else np.arange(layers), dtype=np.int64),
        meta={"model": "hand-made", "nested": {"k": k, "list": [1, 2]}},
    )
    args.update(kw)
    return Trace(**args)


def assert_same_trace(a: Trace, b: Trace) -> None:
    assert np.array_equal(a.topk, b.topk)
    assert a.num_experts == b.num_experts
    assert np.array_equal(a.layer_ids, b.layer_ids)
    for name in ("probs", "seq_id", "pos"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert np.array_equal(x, y), name
    assert a.meta == b.meta


def save_npz(path: Path, **arrays: Any) -> Path:
    np.savez(path, **arrays)
    return path


# --------------------------------------------------------------- round trips


@pytest.mark.parametrize("suffix", [".npz", ".parquet"])
def test_round_trip(tmp_path: Path, suffix: str) -> None:
    trace = make_trace()
    path = write_trace(trace, tmp_path / f"t{suffix}")
    assert path == tmp_path / f"t{suffix}"
    back = read_trace(path)
    assert isinstance(back, Trace)
    assert_same_trace(trace, back)
    assert back.source == str(path)
    assert list(tmp_path.iterdir()) == [path]  # no temporary left behind


@pytest.mark.parametrize("suffix", [".npz", ".parquet"])
def test_round_trip_without_optional_arrays(tmp_path: Path, suffix: str) -> None:
    trace = make_trace(probs=None, seq_id=None, pos=None, layer_ids=None, meta={})
    back = read_trace(write_trace(trace, tmp_path / f"t{suffix}"))
    assert_same_trace(trace, back)
    assert np.array_equal(back.layer_ids, [0, 1, 2])


@pytest.mark.parametrize("suffix", [".npz", ".parquet"])
def test_round_trip_keeps_unused_experts(tmp_path: Path, suffix: str) -> None:
    """num_experts comes from the file, not from the largest id used."""
    trace = Trace(topk=np.array([[[0, 1]], [[1, 0]]], dtype=np.int16), num_experts=40)
    back = read_trace(write_trace(trace, tmp_path / f"t{suffix}"))
    assert back.num_experts == 40


@given(
    tokens=st.integers(1, 20),
    layers=st.integers(1, 4),
    experts=st.integers(2, 9),
    data=st.data(),
)
def test_round_trip_property(tmp_path_factory, tokens: int, layers: int, experts: int, data) -> None:
    k = data.draw(st.integers(1, experts))
    seed = data.draw(st.integers(0, 2**32 - 1))
    trace = make_trace(tokens, layers, k, experts, seed)
    folder = tmp_path_factory.mktemp("rt")
    for suffix in (".npz", ".parquet"):
        assert_same_trace(trace, read_trace(write_trace(trace, folder / f"t{suffix}")))


def test_generated_meta_round_trips(tmp_path: Path) -> None:
    from comoe_opt.instance import ModelShape, SyntheticTrace
    from comoe_opt.trace import generate

    trace = generate(ModelShape(2, 8, 2, 1.0, 4, 2), SyntheticTrace("synthetic", 1.1, 0.5, 2, 4, 3, 9))
    for suffix in (".npz", ".parquet"):
        back = read_trace(write_trace(trace, tmp_path / f"g{suffix}"))
        assert back.meta == trace.meta
        assert back.meta["seed"] == 9
        assert np.array_equal(back.topk, trace.topk)


def test_parquet_round_trip_many_experts(tmp_path: Path) -> None:
    trace = Trace(topk=np.array([[[39_999, 0]]], dtype=np.int32), num_experts=40_000)
    back = read_trace(write_trace(trace, tmp_path / "big.parquet"))
    assert np.array_equal(back.topk, trace.topk)


def test_npz_many_experts(tmp_path: Path) -> None:
    trace = Trace(topk=np.array([[[39_999, 0]]], dtype=np.int32), num_experts=40_000)
    back = read_trace(write_trace(trace, tmp_path / "big.npz"))
    assert np.array_equal(back.topk, trace.topk)


def test_write_unknown_suffix(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="unknown trace format") as info:
        write_trace(make_trace(), tmp_path / "t.csv")
    assert info.value.source == str(tmp_path / "t.csv")
    assert not list(tmp_path.iterdir())


def test_overwrite_replaces_file(tmp_path: Path) -> None:
    path = tmp_path / "t.npz"
    write_trace(make_trace(seed=1), path)
    write_trace(make_trace(seed=2), path)
    assert_same_trace(read_trace(path), make_trace(seed=2))
    assert list(tmp_path.iterdir()) == [path]


# ------------------------------------------------------------ atomic writes


def _boom_npz(fh, **arrays: Any) -> None:
    fh.write(b"PK\x03\x04 half a zip file")
    raise RuntimeError("disk full")


def _boom_parquet(table: Any, where: Any, **kw: Any) -> None:
    Path(where).write_bytes(b"PAR1 half a parquet file")
    raise RuntimeError("disk full")


@pytest.mark.parametrize("suffix", [".npz", ".parquet"])
@pytest.mark.parametrize("existing", [False, True], ids=["new", "overwrite"])
def test_failed_write_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffix: str, existing: bool
) -> None:
    path = tmp_path / f"t{suffix}"
    old = make_trace(seed=5)
    if existing:
        write_trace(old, path)
        before = path.read_bytes()
    monkeypatch.setattr(np, "savez_compressed", _boom_npz)
    monkeypatch.setattr(pq, "write_table", _boom_parquet)
    with pytest.raises(RuntimeError, match="disk full"):
        write_trace(make_trace(seed=6), path)
    if existing:
        assert path.read_bytes() == before
        assert list(tmp_path.iterdir()) == [path]
    else:
        assert not path.exists()
        assert list(tmp_path.iterdir()) == []


def test_failed_write_interrupt_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(fh, **arrays: Any) -> None:
        fh.write(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(np, "savez_compressed", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_trace(make_trace(), tmp_path / "t.npz")
    assert list(tmp_path.iterdir()) == []


def test_write_creates_parent_folder(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "t.npz"
    write_trace(make_trace(), path)
    assert_same_trace(read_trace(path), make_trace())


# ------------------------------------------------------- malformed npz files

GOOD = make_trace()


def _arrays(**override: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "topk": np.asarray(GOOD.topk),
        "num_experts": np.array(GOOD.num_experts),
        "probs": np.asarray(GOOD.probs),
        "seq_id": np.asarray(GOOD.seq_id),
        "pos": np.asarray(GOOD.pos),
    }
    for key, value in override.items():
        if value is None:
            base.pop(key)
        else:
            base[key] = value
    return base


def _topk_with(t: int, layer: int, r: int, value: int) -> np.ndarray:
    topk = np.array(GOOD.topk)
    topk[t, layer, r] = value
    return topk


def _probs_with_nan() -> np.ndarray:
    probs = np.array(GOOD.probs)
    probs[4, 1, 0] = np.nan
    return probs


def _nonconsecutive() -> np.ndarray:
    seq = np.array(GOOD.seq_id)
    seq[-1] = seq[0]
    return seq


# (id, arrays, field, problem fragment)
NPZ_CASES: list[tuple[str, dict[str, Any], str, str]] = [
    ("topk-2d", _arrays(topk=np.zeros((12, 3), np.int16)), "topk", "3-D array"),
    ("topk-4d", _arrays(topk=np.zeros((12, 3, 2, 1), np.int16)), "topk", "3-D array"),
    ("topk-float", _arrays(topk=np.asarray(GOOD.topk, dtype=np.float64)), "topk", "integer expert ids"),
    ("topk-bool", _arrays(topk=np.zeros((12, 3, 2), bool)), "topk", "integer expert ids"),
    ("id-out-of-range", _arrays(topk=_topk_with(3, 2, 1, 6)), "topk", "expert id 6 out of range 0..5"),
    ("id-negative", _arrays(topk=_topk_with(0, 0, 0, -1)), "topk", "expert id -1 out of range"),
    (
        "duplicate-ids",
        _arrays(topk=_topk_with(2, 1, 1, int(GOOD.topk[2, 1, 0]))),
        "topk",
        "duplicate expert ids",
    ),
    (
        "k-above-experts",
        _arrays(num_experts=np.array(2), topk=np.zeros((1, 1, 3), np.int16)),
        "topk",
        "k = 3",
    ),
    ("num-experts-not-scalar", _arrays(num_experts=np.array([6])), "num_experts", "integer scalar"),
    ("num-experts-float", _arrays(num_experts=np.array(6.0)), "num_experts", "integer scalar"),
    (
        "num-experts-one",
        _arrays(num_experts=np.array(1), topk=np.zeros((2, 1, 1), np.int16)),
        "num_experts",
        ">= 2",
    ),
    ("nan-probs", _arrays(probs=_probs_with_nan()), "probs", "NaN"),
    ("inf-probs", _arrays(probs=np.full((12, 3, 2), np.inf, np.float32)), "probs", "NaN or infinite"),
    ("probs-wrong-shape", _arrays(probs=np.zeros((12, 3, 1), np.float32)), "probs", "shape of topk"),
    ("probs-integer", _arrays(probs=np.zeros((12, 3, 2), np.int32)), "probs", "floating point"),
    (
        "empty-trace",
        _arrays(topk=np.zeros((0, 3, 2), np.int16), probs=None, seq_id=None, pos=None),
        "topk",
        "empty",
    ),
    ("zero-layers", _arrays(topk=np.zeros((12, 0, 2), np.int16), probs=None), "topk", "at least one layer"),
    ("seq-id-wrong-length", _arrays(seq_id=np.zeros(11, np.int32)), "seq_id", "12 entries"),
    ("seq-id-2d", _arrays(seq_id=np.zeros((12, 1), np.int32)), "seq_id", "1-D array"),
    ("seq-id-float", _arrays(seq_id=np.zeros(12, np.float64)), "seq_id", "must be integer"),
    ("seq-id-nonconsecutive", _arrays(seq_id=_nonconsecutive()), "seq_id", "consecutive"),
    ("pos-wrong-length", _arrays(pos=np.zeros(13, np.int32)), "pos", "12 entries"),
    ("layers-wrong-length", _arrays(layers=np.array([0, 1], np.int32)), "layers", "3 layer numbers"),
    ("layers-not-increasing", _arrays(layers=np.array([0, 7, 7], np.int32)), "layers", "strictly increasing"),
    ("layers-negative", _arrays(layers=np.array([-1, 0, 1], np.int32)), "layers", "non-negative"),
    ("meta-not-json", _arrays(meta=np.array("{not json")), "meta", "not valid JSON"),
    ("meta-not-object", _arrays(meta=np.array("[1, 2]")), "meta", "JSON object"),
    ("neither-topk-nor-counts", {"probs": np.zeros((1, 1, 1))}, "", "neither 'topk'"),
    ("counts-1d", {"counts": np.ones(4)}, "counts", "2-D array"),
    ("counts-negative", {"counts": np.array([[1, -1, 2]])}, "counts", "non-negative"),
    ("counts-nan", {"counts": np.array([[1.0, np.nan, 2.0]])}, "counts", "finite"),
    ("counts-zero", {"counts": np.zeros((2, 4), np.int64)}, "counts", "empty trace"),
    (
        "transitions-wrong-shape",
        {"counts": np.ones((3, 4), np.int64), "transitions": np.ones((2, 4, 3), np.int64)},
        "transitions",
        "must have shape (2, 4, 4)",
    ),
    (
        "aggregate-layers-skip-wrong",
        {"counts": np.ones((3, 4), np.int64), "layers": np.array([0, 15, 7], np.int16)},
        "layers",
        "strictly increasing",
    ),
]


@pytest.mark.parametrize(("name", "arrays", "field", "problem"), NPZ_CASES, ids=[c[0] for c in NPZ_CASES])
def test_malformed_npz(tmp_path: Path, cli, name: str, arrays: dict, field: str, problem: str) -> None:
    path = save_npz(tmp_path / f"{name}.npz", **arrays)
    with pytest.raises(InputError) as info:
        read_trace(path)
    assert info.value.source == str(path)
    assert info.value.field == (field or None)
    assert problem in str(info.value)
    result = cli("trace", "info", path)
    result.assert_user_error(path.name, problem)
    assert result.out == ""


def test_id_range_checked_against_instance_experts(tmp_path: Path) -> None:
    """Without num_experts in the file, the caller's expert count bounds the ids."""
    path = save_npz(tmp_path / "t.npz", topk=np.array([[[0, 5]]], np.int16))
    assert read_trace(path).num_experts == 6
    with pytest.raises(InputError, match=r"out of range 0\.\.3"):
        read_trace(path, num_experts=4)


def test_num_experts_disagrees_with_instance(tmp_path: Path) -> None:
    path = save_npz(tmp_path / "t.npz", topk=np.array([[[0, 1]]], np.int16), num_experts=np.array(8))
    with pytest.raises(InputError, match="file has 8 experts, the instance 16"):
        read_trace(path, num_experts=16)


BYTES_CASES: list[tuple[str, bytes, str]] = [
    ("garbage.npz", b"this is not a zip file at all\n" * 20, "not a readable .npz archive: no zip header"),
    ("zip-header.npz", b"PK\x03\x04" + b"\x00" * 60, "not a readable .npz"),
    ("empty.npz", b"", "no zip header"),
    ("renamed.npz", b"\x93NUMPY\x01\x00" + b" " * 80, "a single .npy array"),
    ("garbage.parquet", b"not parquet" * 30, "not a readable Parquet"),
    ("trace.csv", b"a,b\n1,2\n", "unknown trace format '.csv'"),
    ("trace", b"\x93NUMPY", "unknown trace format ''"),
]


@pytest.mark.parametrize(("name", "content", "problem"), BYTES_CASES, ids=[c[0] for c in BYTES_CASES])
def test_unreadable_files(tmp_path: Path, cli, name: str, content: bytes, problem: str) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(InputError, match="^" + str(path).replace(".", r"\.")) as info:
        read_trace(path)
    assert problem in str(info.value)
    cli("trace", "info", path).assert_user_error(name, problem)


def test_truncated_npz(tmp_path: Path, cli) -> None:
    full = tmp_path / "full.npz"
    write_trace(make_trace(tokens=200, layers=3, k=2, experts=6), full)
    data = full.read_bytes()
    path = tmp_path / "truncated.npz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=r"not a readable \.npz"):
        read_trace(path)
    cli("trace", "info", path).assert_user_error("truncated.npz", "not a readable .npz")


def test_corrupted_compressed_npz(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    path = tmp_path / "corrupt.npz"
    np.savez_compressed(path, topk=rng.integers(0, 8, (5000, 4, 1)).astype(np.int16), num_experts=np.array(8))
    data = bytearray(path.read_bytes())
    for i in range(200, 400):  # inside the deflate stream of the first member
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(InputError, match=r"corrupt\.npz"):
        read_trace(path)


def test_missing_file(tmp_path: Path, cli) -> None:
    for name in ("absent.npz", "absent.parquet", "absent.csv"):
        path = tmp_path / name
        with pytest.raises(InputError, match="no such trace file") as info:
            read_trace(path)
        assert info.value.source == str(path)
        cli("trace", "info", path).assert_user_error(name, "no such trace file")


def test_directory_named_npz(tmp_path: Path, cli) -> None:
    path = tmp_path / "folder.npz"
    path.mkdir()
    with pytest.raises(InputError, match=r"not a readable \.npz"):
        read_trace(path)
    cli("trace", "info", path).assert_user_error("folder.npz")


def test_domain_transitions_wrong_shape(tmp_path: Path) -> None:
    from comoe_opt.stats import aggregate_stats

    path = save_npz(
        tmp_path / "domains.npz",
        counts=np.ones((2, 4), np.int64),
        transitions=np.ones((1, 4, 4), np.int64),
        a_transitions=np.ones((1, 3, 3), np.int64),
        b_transitions=np.ones((1, 4, 4), np.int64),
    )
    with pytest.raises(InputError, match="a_transitions"):
        agg = read_trace(path)
        aggregate_stats(agg)


def test_aggregate_transitions_string_dtype(tmp_path: Path) -> None:
    path = save_npz(tmp_path / "s.npz", counts=np.ones((2, 4), np.int64), transitions=np.full((1, 4, 4), "x"))
    with pytest.raises(InputError, match="transitions"):
        read_trace(path)


def test_huge_id_without_num_experts(tmp_path: Path) -> None:
    from comoe_opt.stats import trace_stats

    path = save_npz(tmp_path / "huge.npz", topk=np.array([[[2**63]]], dtype=np.uint64))
    with pytest.raises(InputError, match=r"huge\.npz"):
        trace_stats(read_trace(path))


def test_aggregate_reads_domains_and_layers(tmp_path: Path) -> None:
    counts = np.array([[5, 1, 1, 1], [2, 2, 2, 2], [1, 1, 1, 9]], np.int64)
    trans = np.ones((2, 4, 4), np.int64)
    path = save_npz(
        tmp_path / "agg.npz",
        counts=counts,
        layers=np.array([0, 7, 15], np.int16),
        transitions=trans,
        arxiv_counts=counts,
        arxiv_transitions=trans,
        c4_counts=counts,
        counts_top1=counts,
        meta=np.array(json.dumps({"model": "x"})),
    )
    agg = read_trace(path)
    assert isinstance(agg, AggregateTrace)
    assert np.array_equal(agg.layer_ids, [0, 7, 15])
    assert agg.num_experts == 4 and agg.layers == 3
    assert set(agg.domains) == {"arxiv", "c4"}
    assert set(agg.domains["arxiv"]) == {"counts", "transitions"}
    assert agg.meta == {"model": "x"}
    with pytest.raises(InputError, match="has 4 experts, the instance 8"):
        read_trace(path, num_experts=8)


# ---------------------------------------------------- malformed Parquet files


def _parquet(path: Path, columns: dict[str, Any], header: dict[str, Any] | None = None) -> Path:
    table = pa.table(columns)
    if header is not None:
        table = table.replace_schema_metadata({FORMAT: json.dumps(header)})
    pq.write_table(table, path)
    return path


def _ids(values: list) -> Any:
    return pa.array(values, type=pa.int16())


PARQUET_CASES: list[tuple[str, Callable[[], dict[str, Any]], str, str]] = [
    ("null-id", lambda: {"e0_0": _ids([0, None, 1]), "e0_1": _ids([1, 0, 0])}, "e0_0", "1 missing (null)"),
    (
        "null-seq-id",
        lambda: {"seq_id": pa.array([0, None, 1], pa.int32()), "e0_0": _ids([0, 1, 1])},
        "seq_id",
        "missing (null)",
    ),
    (
        "missing-rank-column",
        lambda: {"e0_0": _ids([0]), "e0_1": _ids([1]), "e1_0": _ids([1])},
        "columns",
        "same number of e<layer>_<rank>",
    ),
    ("rank-gap", lambda: {"e0_0": _ids([0]), "e0_2": _ids([1])}, "e0_*", "ranks must be 0..k-1"),
    ("no-rank-0", lambda: {"e3_1": _ids([0])}, "e3_*", "ranks must be 0..k-1"),
    ("no-expert-columns", lambda: {"seq_id": pa.array([0, 1], pa.int32())}, "columns", "no expert columns"),
    ("float-ids", lambda: {"e0_0": pa.array([0.5, 1.0])}, "topk", "integer expert ids"),
    ("duplicate-ids", lambda: {"e0_0": _ids([0, 1]), "e0_1": _ids([1, 1])}, "topk", "duplicate expert ids"),
    ("zero-rows", lambda: {"e0_0": _ids([])}, "topk", "empty trace"),
    ("nan-prob", lambda: {"e0_0": _ids([0, 1]), "p0_0": pa.array([0.5, float("nan")])}, "probs", "NaN"),
]


@pytest.mark.parametrize(
    ("name", "columns", "field", "problem"), PARQUET_CASES, ids=[c[0] for c in PARQUET_CASES]
)
def test_malformed_parquet(
    tmp_path: Path, cli, name: str, columns: Callable, field: str, problem: str
) -> None:
    path = _parquet(tmp_path / f"{name}.parquet", columns())
    with pytest.raises(InputError) as info:
        read_trace(path)
    assert info.value.source == str(path)
    assert info.value.field == field
    assert problem in str(info.value)
    cli("trace", "info", path).assert_user_error(path.name, problem)


def test_parquet_id_out_of_range_from_header(tmp_path: Path, cli) -> None:
    path = _parquet(tmp_path / "range.parquet", {"e0_0": _ids([0, 4])}, {"num_experts": 4})
    with pytest.raises(InputError, match=r"expert id 4 out of range 0\.\.3"):
        read_trace(path)
    cli("trace", "info", path).assert_user_error("range.parquet", "out of range")


def test_parquet_bad_header(tmp_path: Path, cli) -> None:
    path = tmp_path / "header.parquet"
    table = pa.table({"e0_0": _ids([0, 1])}).replace_schema_metadata({FORMAT: "{oops"})
    pq.write_table(table, path)
    with pytest.raises(InputError, match="not valid JSON"):
        read_trace(path)
    cli("trace", "info", path).assert_user_error("header.parquet", "not valid JSON")


def test_parquet_partial_prob_columns(tmp_path: Path) -> None:
    path = _parquet(
        tmp_path / "probs.parquet", {"e0_0": _ids([0, 1]), "e1_0": _ids([1, 0]), "p0_0": pa.array([0.5, 0.5])}
    )
    with pytest.raises(InputError, match="p1_0"):
        read_trace(path)


def test_written_file_has_ordinary_permissions(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_bytes(b"")
    path = write_trace(make_trace(), tmp_path / "t.npz")
    assert path.stat().st_mode & 0o777 == plain.stat().st_mode & 0o777
