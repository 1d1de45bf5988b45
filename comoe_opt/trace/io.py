"""Trace files: NumPy `.npz` and Parquet, per-token and aggregate.

The formats are documented in `docs/trace-format.md`. Readers validate
everything and raise `InputError` naming the file, the array and the problem;
writers write to a temporary file and rename, so a file is either complete or
absent.
"""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path
from typing import Any

import numpy as np

from comoe_opt.errors import InputError, first_line
from comoe_opt.files import atomic_path
from comoe_opt.npzfile import read_npz
from comoe_opt.trace.model import AggregateTrace, Trace

FORMAT = "comoe-trace"
FORMAT_VERSION = 1
MAX_INFERRED_EXPERTS = 65536  # beyond this, an id is a corrupt value unless num_experts says so
_DOMAIN_KEY = re.compile(r"^(?P<domain>[a-z0-9]+)_(?P<what>counts|transitions|transitions_kxk)$")
_EXPERT_COLUMN = re.compile(r"^e(?P<layer>\d+)_(?P<rank>\d+)$")


def read_trace(path: str | Path, num_experts: int | None = None) -> Trace | AggregateTrace:
    """Read a per-token or aggregate trace from `.npz` or `.parquet`.

    `num_experts`, when known from the instance, is checked against the file;
    otherwise it comes from the file, or from the largest id seen.
    """
    path = Path(path)
    if not path.exists():
        raise InputError(path, None, "no such trace file")
    suffix = path.suffix.lower()
    if suffix == ".npz":
        return _read_npz(path, num_experts)
    if suffix in (".parquet", ".pq"):
        return _read_parquet(path, num_experts)
    raise InputError(path, None, f"unknown trace format {suffix!r} (expected .npz or .parquet)")


def write_trace(trace: Trace, path: str | Path) -> Path:
    """Write a per-token trace; the format follows the suffix (.npz or .parquet)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".npz":
        _write_npz(trace, path)
    elif suffix in (".parquet", ".pq"):
        _write_parquet(trace, path)
    else:
        raise InputError(path, None, f"unknown trace format {suffix!r} (expected .npz or .parquet)")
    return path


# --------------------------------------------------------------------- npz


def _read_npz(path: Path, num_experts: int | None) -> Trace | AggregateTrace:
    arrays = read_npz(path)
    if "topk" in arrays:
        return _per_token_from_arrays(arrays, path, num_experts)
    if "counts" in arrays:
        return _aggregate_from_arrays(arrays, path, num_experts)
    if "logical_count" in arrays:
        raise InputError(
            path,
            "logical_count",
            "a load dump, not a trace: give it to compare or solve with --counts, or write its instance"
            " with `instance new --from-counts` (trace.kind = 'counts')",
        )
    raise InputError(path, None, "holds neither 'topk' (per-token) nor 'counts' (aggregate)")


def _per_token_from_arrays(arrays: dict[str, np.ndarray], path: Path, num_experts: int | None) -> Trace:
    topk = arrays["topk"]
    meta = _meta(arrays, path)
    experts = _resolve_experts(arrays.get("num_experts"), topk, num_experts, path)
    probs = arrays.get("probs")
    if probs is not None and np.issubdtype(probs.dtype, np.floating):
        probs = probs.astype(np.float32)
    return Trace(
        topk=topk,
        num_experts=experts,
        probs=probs,
        seq_id=arrays.get("seq_id"),
        pos=arrays.get("pos"),
        layer_ids=typing.cast(np.ndarray, arrays.get("layers")),  # None: layers 0..L-1
        meta=meta,
        source=str(path),
    )


def _resolve_experts(stored: np.ndarray | None, topk: np.ndarray, expected: int | None, path: Path) -> int:
    if stored is not None:
        if stored.shape != () or not np.issubdtype(stored.dtype, np.integer):
            raise InputError(path, "num_experts", "must be an integer scalar")
        value = int(stored)
        if not 2 <= value <= MAX_INFERRED_EXPERTS:
            raise InputError(path, "num_experts", f"must be >= 2 and <= {MAX_INFERRED_EXPERTS}, got {value}")
        if expected is not None and value != expected:
            raise InputError(path, "num_experts", f"file has {value} experts, the instance {expected}")
        return value
    if expected is not None:
        return expected
    if not np.issubdtype(topk.dtype, np.integer) or topk.size == 0:
        return 2  # let validation report the real problem
    largest = int(topk.max())
    if largest >= MAX_INFERRED_EXPERTS:
        raise InputError(
            path,
            "topk",
            f"expert id {largest} is implausibly large; store 'num_experts' in the file if it is real",
        )
    return max(largest + 1, 2)


def _meta(arrays: dict[str, np.ndarray], path: Path) -> dict[str, Any]:
    raw = arrays.get("meta")
    if raw is None:
        return {}
    try:
        meta = json.loads(str(raw))
    except json.JSONDecodeError as exc:
        raise InputError(path, "meta", f"not valid JSON: {exc}") from None
    if not isinstance(meta, dict):
        raise InputError(path, "meta", "must be a JSON object")
    return meta


def _aggregate_from_arrays(
    arrays: dict[str, np.ndarray], path: Path, num_experts: int | None
) -> AggregateTrace:
    counts = arrays["counts"]
    if num_experts is not None and counts.ndim == 2 and counts.shape[1] != num_experts:
        raise InputError(path, "counts", f"has {counts.shape[1]} experts, the instance {num_experts}")
    layers = arrays.get("layers")
    if layers is None:  # 0..L-1 (a counts array of another shape is reported by validation)
        layers = np.arange(counts.shape[0] if counts.ndim == 2 else 0)
    domains: dict[str, dict[str, np.ndarray]] = {}
    for key, value in arrays.items():
        match = _DOMAIN_KEY.match(key)
        if match and match["domain"] not in ("transitions",):
            domains.setdefault(match["domain"], {})[match["what"]] = value
    return AggregateTrace(
        counts=counts,
        layer_ids=layers,
        transitions=arrays.get("transitions"),
        transitions_kxk=arrays.get("transitions_kxk"),
        counts_top1=arrays.get("counts_top1"),
        domains=domains,
        meta=_meta(arrays, path),
        source=str(path),
    )


def _write_npz(trace: Trace, path: Path) -> None:
    arrays: dict[str, Any] = {
        "format": np.array(f"{FORMAT}/{FORMAT_VERSION}"),
        "topk": trace.topk.astype(np.int16 if trace.num_experts <= np.iinfo(np.int16).max else np.int32),
        "num_experts": np.array(trace.num_experts, dtype=np.int64),
        "layers": np.asarray(trace.layer_ids, dtype=np.int32),
        "meta": np.array(json.dumps(trace.meta, sort_keys=True)),
    }
    for name in ("probs", "seq_id", "pos"):
        value = getattr(trace, name)
        if value is not None:
            arrays[name] = value
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        np.savez_compressed(fh, **arrays)


# ----------------------------------------------------------------- parquet


def _write_parquet(trace: Trace, path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns: dict[str, Any] = {}
    id_dtype = np.int16 if trace.num_experts <= np.iinfo(np.int16).max else np.int32
    if trace.seq_id is not None:
        columns["seq_id"] = pa.array(trace.seq_id.astype(np.int32))
    if trace.pos is not None:
        columns["pos"] = pa.array(trace.pos.astype(np.int32))
    for li, layer in enumerate(trace.layer_ids):
        for r in range(trace.top_k):
            columns[f"e{layer}_{r}"] = pa.array(trace.topk[:, li, r].astype(id_dtype))
    if trace.probs is not None:
        for li, layer in enumerate(trace.layer_ids):
            for r in range(trace.top_k):
                columns[f"p{layer}_{r}"] = pa.array(trace.probs[:, li, r].astype(np.float32))
    header = {
        "version": FORMAT_VERSION,
        "num_experts": trace.num_experts,
        "layers": [int(x) for x in trace.layer_ids],
        "top_k": trace.top_k,
        "meta": trace.meta,
    }
    table = pa.table(columns).replace_schema_metadata({FORMAT: json.dumps(header, sort_keys=True)})
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")


def _read_parquet(path: Path, num_experts: int | None) -> Trace:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(path).names
        duplicated = sorted({n for n in names if names.count(n) > 1})
        if duplicated:
            raise InputError(path, duplicated[0], "column appears more than once")
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise InputError(path, None, f"not a readable Parquet file: {first_line(exc)}") from None
    header = _parquet_header(table, path)
    layout = _parquet_layout(table.column_names, path)
    layers = sorted(layout)
    _check_header_layers(header, layers, path)
    ranks = len(layout[layers[0]])
    if any(len(layout[layer]) != ranks for layer in layers):
        raise InputError(path, "columns", "every layer needs the same number of e<layer>_<rank> columns")
    topk = np.stack(
        [np.stack([_column(table, f"e{layer}_{r}", path) for r in range(ranks)], axis=1) for layer in layers],
        axis=1,
    )
    probs = None
    gate_columns = [f"p{layer}_{r}" for layer in layers for r in range(ranks)]
    present = [name in table.column_names for name in gate_columns]
    if any(present) and not all(present):
        missing = gate_columns[present.index(False)]
        raise InputError(path, missing, "missing gate-weight column (give all p<layer>_<rank> or none)")
    if all(present):
        probs = np.stack(
            [
                np.stack([_column(table, f"p{layer}_{r}", path) for r in range(ranks)], axis=1)
                for layer in layers
            ],
            axis=1,
        ).astype(np.float32)
    stored = header.get("num_experts")
    if stored is not None and (isinstance(stored, bool) or not isinstance(stored, int)):
        raise InputError(path, f"metadata {FORMAT}.num_experts", f"must be an integer, got {stored!r}")
    if stored is not None and not 2 <= stored <= MAX_INFERRED_EXPERTS:
        limit = f"must be >= 2 and <= {MAX_INFERRED_EXPERTS}, got {stored}"
        raise InputError(path, f"metadata {FORMAT}.num_experts", limit)
    experts = _resolve_experts(None if stored is None else np.array(stored), topk, num_experts, path)
    return Trace(
        topk=topk,
        num_experts=experts,
        probs=probs,
        seq_id=_column(table, "seq_id", path) if "seq_id" in table.column_names else None,
        pos=_column(table, "pos", path) if "pos" in table.column_names else None,
        layer_ids=np.array(layers, dtype=np.int64),
        meta=header.get("meta", {}),
        source=str(path),
    )


def _parquet_header(table: Any, path: Path) -> dict[str, Any]:
    raw = (table.schema.metadata or {}).get(FORMAT.encode())
    if raw is None:
        return {}
    try:
        header = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InputError(path, f"metadata {FORMAT}", f"not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise InputError(path, f"metadata {FORMAT}", "must be a JSON object")
    return header


def _check_header_layers(header: dict[str, Any], layers: list[int], path: Path) -> None:
    """The header's `layers`, when given, must name the layers of the e<layer>_<rank> columns."""
    stored = header.get("layers")
    if stored is not None and stored != layers:
        raise InputError(
            path,
            f"metadata {FORMAT}.layers",
            f"is {str(stored)[:80]}, but the columns hold layers {str(layers)[:80]}",
        )


def _parquet_layout(names: list[str], path: Path) -> dict[int, list[int]]:
    layout: dict[int, list[int]] = {}
    for name in names:
        match = _EXPERT_COLUMN.match(name)
        if match:
            layout.setdefault(int(match["layer"]), []).append(int(match["rank"]))
    if not layout:
        raise InputError(path, "columns", "no expert columns named e<layer>_<rank> (e.g. e0_0)")
    for layer, ranks in layout.items():
        if sorted(ranks) != list(range(len(ranks))):
            raise InputError(path, f"e{layer}_*", f"ranks must be 0..k-1, got {sorted(ranks)}")
    return layout


def _column(table: Any, name: str, path: Path) -> np.ndarray:
    column = table.column(name)
    if column.null_count:
        raise InputError(path, name, f"{column.null_count} missing (null) values")
    return column.to_numpy()
