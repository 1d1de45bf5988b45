"""Expert-load counts (`read_load_counts`): JSON or `.npz`, `[layers, experts]` or SGLang's
`[steps, layers, experts]` dump (summed over steps)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from comoe_opt.errors import InputError
from comoe_opt.formats.jsonio import is_int, is_number, json_type, load_json
from comoe_opt.npzfile import npz_names, read_npz

LOAD_KEYS = ("logical_count", "counts")
MAX_COUNT = 1e15  # tokens per expert: far past any recording, and sums of such counts stay exact


def read_load_counts(
    path: str | Path,
    layers: int | None = None,
    experts: int | None = None,
    *,
    layer_ids: Sequence[int] | None = None,
) -> np.ndarray:
    """Expert-load counts as float64 [layers, experts] from JSON or `.npz`.

    JSON: `{"logical_count": [...]}` (or `"counts"`), or a bare 2-D list.
    `.npz`: array `logical_count` or `counts`. A 3-D array is SGLang's
    `[steps, layers, experts]` dump and is summed over steps. `layer_ids`
    picks rows (e.g. the MoE layers of a model with dense layers) before the
    shape check against `layers` and `experts`.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".json":
        counts, name = _load_counts_json(path)
    elif suffix == ".npz":
        counts, name = _load_counts_npz(path)
    elif suffix == ".pt":
        raise InputError(
            path,
            None,
            "PyTorch files are not read; convert SGLang's dump with "
            "json.dump({'logical_count': torch.load(p)['logical_count'].tolist()}, f)",
        )
    else:
        raise InputError(path, None, f"unknown load-count format {suffix!r} (expected .json or .npz)")
    if counts.ndim == 3:
        counts = counts.sum(axis=0)
    elif counts.ndim != 2:
        raise InputError(
            path,
            name,
            f"must be [layers, experts] or [steps, layers, experts], got shape {list(counts.shape)}",
        )
    if layer_ids is not None:
        ids = list(layer_ids)
        bad = [x for x in ids if not is_int(x) or not 0 <= x < counts.shape[0]]
        if bad:
            raise InputError(path, name, f"layer_ids {bad} out of range 0..{counts.shape[0] - 1}")
        counts = counts[ids]
    if layers is not None and counts.shape[0] != layers:
        raise InputError(path, name, f"has {counts.shape[0]} layers, expected {layers}")
    if experts is not None and counts.shape[1] != experts:
        raise InputError(path, name, f"has {counts.shape[1]} experts, expected {experts}")
    if counts.size == 0 or not counts.any():
        raise InputError(path, name, "all counts are zero (or empty): no load to plan on")
    return counts


def _load_counts_json(path: Path) -> tuple[np.ndarray, str]:
    doc = load_json(path, "load-count file")
    if isinstance(doc, dict):
        name = next((k for k in LOAD_KEYS if k in doc), None)
        if name is None:
            raise InputError(path, None, f"JSON object needs a key {' or '.join(map(repr, LOAD_KEYS))}")
        raw, prefix = doc[name], name
    elif isinstance(doc, list):
        raw, name, prefix = doc, "counts", ""
    else:
        raise InputError(path, None, f"must be a JSON object or a 2-D list, got {json_type(doc)}")
    return _numeric_array(raw, prefix, path), name or "counts"


def _numeric_array(raw: Any, prefix: str, path: Path) -> np.ndarray:
    """Nested JSON lists → float64 array, naming the first bad element."""
    shape: list[int] = []
    node = raw
    while isinstance(node, list):
        shape.append(len(node))
        if not node:
            break
        node = node[0]
    label = prefix or "counts"

    def walk(value: Any, where: str, depth: int) -> None:
        if depth < len(shape):
            if not isinstance(value, list):
                raise InputError(
                    path, where or label, f"must be a list (ragged rows), got {json_type(value)}"
                )
            if len(value) != shape[depth]:
                raise InputError(
                    path,
                    where or label,
                    f"has {len(value)} entries, the first row at this depth {shape[depth]} (ragged rows)",
                )
            for i, item in enumerate(value):
                walk(item, f"{where}[{i}]", depth + 1)
            return
        if isinstance(value, list):
            raise InputError(path, where, "is a list where a number was expected (ragged rows)")
        if not is_number(value):
            raise InputError(path, where, f"not a number: {value!r}")
        if isinstance(value, int) and abs(value) > MAX_COUNT:
            raise InputError(path, where, f"count above {MAX_COUNT:g} ({len(str(value))} digits)")
        if not math.isfinite(value):
            raise InputError(path, where, f"must be finite, got {value!r}")
        if value < 0:
            raise InputError(path, where, f"negative count {value!r}")
        if value > MAX_COUNT:
            raise InputError(path, where, f"count {value:g} above {MAX_COUNT:g}: sums would overflow")

    if not isinstance(raw, list):
        raise InputError(path, label, f"must be a list of lists, got {json_type(raw)}")
    walk(raw, prefix, 0)
    return np.array(raw, dtype=np.float64).reshape(shape)


def _load_counts_npz(path: Path) -> tuple[np.ndarray, str]:
    if not path.exists():
        raise InputError(path, None, "no such load-count file")
    arrays = read_npz(path, LOAD_KEYS)
    name = next((k for k in LOAD_KEYS if k in arrays), None)
    if name is None:
        raise InputError(
            path, None, f"holds no array {' or '.join(map(repr, LOAD_KEYS))} (has {sorted(npz_names(path))})"
        )
    arr = arrays[name]
    if (
        arr.dtype == np.bool_
        or not np.issubdtype(arr.dtype, np.number)
        or np.issubdtype(arr.dtype, np.complexfloating)
    ):
        raise InputError(path, name, f"must be numeric, got dtype {arr.dtype}")
    arr = arr.astype(np.float64)
    checks = (
        (~np.isfinite(arr), "NaN or infinite count"),
        (arr < 0, "negative count"),
        (arr > MAX_COUNT, f"count above {MAX_COUNT:g} (sums would overflow):"),
    )
    for bad, problem in checks:
        where = np.argwhere(bad)
        if where.size:
            index = "".join(f"[{int(i)}]" for i in where[0])
            raise InputError(path, f"{name}{index}", f"{problem} {arr[tuple(where[0])]!r}")
    return arr, name


# ================================================================ helpers
