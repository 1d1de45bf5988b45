"""Expert-load counts (`read_load_counts`): JSON or `.npz`, `[layers, experts]` or SGLang's
`[steps, layers, experts]` dump (summed over steps)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from comoe_opt.errors import InputError, first_line
from comoe_opt.jsonio import is_int, is_number, json_type, load_json
from comoe_opt.npzfile import npz_names, read_npz
from comoe_opt.schema import plain_number

LOAD_KEYS = ("logical_count", "counts")
MAX_COUNT = 1e15  # tokens per expert: far past any recording, and sums of such counts stay exact


def read_load_counts(
    path: str | Path,
    layers: int | None = None,
    experts: int | None = None,
    *,
    layer_ids: Sequence[int] | None = None,
    model_layer_ids: Sequence[int] | None = None,
    model_layers: int | None = None,
) -> np.ndarray:
    """Expert-load counts as float64 [layers, experts] (summed over steps): `read_step_counts`."""
    steps = read_step_counts(
        path,
        layers,
        experts,
        layer_ids=layer_ids,
        model_layer_ids=model_layer_ids,
        model_layers=model_layers,
    )
    return steps.sum(axis=0)


def read_step_counts(
    path: str | Path,
    layers: int | None = None,
    experts: int | None = None,
    *,
    layer_ids: Sequence[int] | None = None,
    model_layer_ids: Sequence[int] | None = None,
    model_layers: int | None = None,
) -> np.ndarray:
    """Expert-load counts per step as float64 [steps, layers, experts] from JSON, `.npz` or
    SGLang's `.pt` recorder dump.

    JSON: `{"logical_count": [...]}` (or `"counts"`, other keys ignored), or a bare list.
    `.npz`: array `logical_count` or `counts`. `.pt`: SGLang's expert-distribution recorder
    dump (`torch.save` of a dict with `logical_count`), read when torch is installed. A 2-D
    array is one step. Steps whose counts are all zero (the unused rows of the recorder's ring
    buffer) are dropped.

    Rows are layers. `layer_ids` picks rows before the shape check. `model_layer_ids` are
    the model layer ids of the instance's layers: a file with more rows than `layers` (SGLang's
    dumps have one row per model layer, dense ones included) is read at those rows, and must
    have `model_layers` rows when that is given (a dump of another model is refused, not cut).
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".json":
        counts, name = _load_counts_json(path)
    elif suffix == ".npz":
        counts, name = _load_counts_npz(path)
    elif suffix == ".pt":
        counts, name = _load_counts_torch(path)
    else:
        raise InputError(path, None, f"unknown load-count format {suffix!r} (expected .json, .npz or .pt)")
    if counts.ndim == 2:
        counts = counts[None]
    elif counts.ndim != 3:
        raise InputError(
            path,
            name,
            f"must be [layers, experts] or [steps, layers, experts], got shape {list(counts.shape)}",
        )
    if layer_ids is None and model_layer_ids is not None and layers is not None and counts.shape[1] > layers:
        if model_layers is not None and counts.shape[1] != model_layers:
            raise InputError(
                path,
                name,
                f"has {counts.shape[1]} layer rows: neither the instance's {layers} layers nor one row per"
                f" layer of its {model_layers}-layer model (model.model_layers, model.layer_ids)",
            )
        layer_ids = model_layer_ids
    if layer_ids is not None:
        ids = list(layer_ids)
        bad = [x for x in ids if not is_int(x) or not 0 <= x < counts.shape[1]]
        if bad:
            raise InputError(path, name, f"layer ids {bad} out of range 0..{counts.shape[1] - 1}")
        counts = counts[:, ids]
    if layers is not None and counts.shape[1] != layers:
        raise InputError(path, name, f"has {counts.shape[1]} layers, expected {layers}")
    if experts is not None and counts.shape[2] != experts:
        raise InputError(path, name, f"has {counts.shape[2]} experts, expected {experts}")
    counts = counts[counts.reshape(counts.shape[0], -1).any(axis=1)]
    if counts.size == 0:
        raise InputError(path, name, "all counts are zero (or empty): no load to plan on")
    return counts


def _load_counts_torch(path: Path) -> tuple[np.ndarray, str]:
    """SGLang's recorder dump; torch is optional (`pip install comoe-opt[torch]`)."""
    if not path.exists():
        raise InputError(path, None, "no such load-count file")
    try:
        import torch
    except ImportError:
        raise InputError(
            path,
            None,
            "reading a PyTorch dump needs torch (pip install 'comoe-opt[torch]'); or convert it: "
            'python -c "import json,sys,torch; d=torch.load(sys.argv[1]); '
            "json.dump({'logical_count': d['logical_count'].tolist()}, open(sys.argv[2], 'w'))\" "
            f"{path.name} counts.json",
        ) from None
    try:
        doc = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many kinds for a bad file; all mean the same here
        raise InputError(path, None, f"not a readable PyTorch file: {first_line(exc)}") from None
    if not isinstance(doc, dict):
        raise InputError(path, None, f"must hold a dict (SGLang's recorder dump), got {type(doc).__name__}")
    name = next((k for k in LOAD_KEYS if k in doc), None)
    if name is None:
        raise InputError(path, None, f"holds no {' or '.join(map(repr, LOAD_KEYS))} (has {sorted(doc)})")
    value = doc[name]
    array = value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)
    return _checked_numeric(array, name, path), name


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
            raise InputError(path, where, f"must be finite, got {plain_number(value)}")
        if value < 0:
            raise InputError(path, where, f"negative count {plain_number(value)}")
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
    return _checked_numeric(arrays[name], name, path), name


def _checked_numeric(arr: np.ndarray, name: str, path: Path) -> np.ndarray:
    """A numeric array of finite, non-negative counts below `MAX_COUNT`, as float64."""
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
            raise InputError(path, f"{name}{index}", f"{problem} {plain_number(arr[tuple(where[0])])}")
    return arr


# ================================================================ helpers
