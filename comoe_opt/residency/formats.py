"""Placement files: our own JSON, SGLang and vLLM-Ascend expert maps, expert-load counts.

Formats are documented in `docs/placement-format.md`:

* `comoe-placement` JSON (`write_placement` / `read_placement`): for every
  logical expert, the chiplets holding a replica. Versioned, one line per
  expert, so a diff between two plans shows which experts moved.
* SGLang `--init-expert-location` JSON (`write_sglang` / `read_sglang`):
  `physical_to_logical_map[layer][physical slot]`, device `d` owning slots
  `d*S .. d*S+S-1`.
* vLLM-Ascend `expert_map_path` JSON (`write_vllm_ascend` /
  `read_vllm_ascend`): `layer_list[l].device_list[d].device_expert`.
* expert-load counts (`read_load_counts`): JSON or `.npz`, `[layers, experts]`
  or SGLang's `[steps, layers, experts]` dump.

Engines need the same number of physical slots on every device; devices that
hold fewer replicas are padded (`device_slots`). Every reader validates and
raises `InputError` naming the file, the JSON field path and the problem;
every writer is atomic (temporary file + rename) and deterministic.
"""

from __future__ import annotations

import itertools
import json
import math
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from comoe_opt.errors import InputError
from comoe_opt.residency.placement import Placement
from comoe_opt.trace.io import atomic_path

FORMAT = "comoe-placement"
FORMAT_VERSION = 1
SGLANG_KEY = "physical_to_logical_map"
LOAD_KEYS = ("logical_count", "counts")

_HEADER_KEYS = ("format", "version", "layers", "experts_per_layer", "chiplets", "page_gb", "instance", "meta")
_ALLOWED_KEYS = frozenset((*_HEADER_KEYS, "placement"))


@dataclass(frozen=True, eq=False)
class PlacementFile:
    """Everything a `comoe-placement` file holds: the placement and its header."""

    placement: Placement
    page_gb: float | None = None
    instance: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


# ======================================================= our placement JSON


def write_placement(
    placement: Placement,
    path: str | Path,
    *,
    page_gb: float | None = None,
    instance: str | None = None,
    meta: dict[str, Any] | None = None,
) -> Path:
    """Write `placement` as `comoe-placement` JSON (version 1); returns the path."""
    path = Path(path)
    if page_gb is not None and not (_is_number(page_gb) and math.isfinite(page_gb) and page_gb > 0):
        raise InputError(None, "page_gb", f"must be a positive number, got {page_gb!r}")
    if instance is not None and not isinstance(instance, str):
        raise InputError(None, "instance", f"must be a string, got {type(instance).__name__}")
    if meta is not None and not isinstance(meta, dict):
        raise InputError(None, "meta", f"must be a dict, got {type(meta).__name__}")
    doc: dict[str, Any] = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "layers": placement.layers,
        "experts_per_layer": placement.experts,
        "chiplets": placement.chiplets,
    }
    if page_gb is not None:
        doc["page_gb"] = float(page_gb)
    if instance is not None:
        doc["instance"] = instance
    if meta:
        doc["meta"] = _plain_json(meta, "meta")
    doc["placement"] = [
        [np.flatnonzero(placement.resident[li, e]).tolist() for e in range(placement.experts)]
        for li in range(placement.layers)
    ]
    _write_json(doc, path)
    return path


def read_placement(
    path: str | Path,
    layers: int | None = None,
    experts: int | None = None,
    chiplets: int | None = None,
) -> Placement:
    """Read a `comoe-placement` file; the optional shape is checked against the file."""
    return read_placement_file(path, layers=layers, experts=experts, chiplets=chiplets).placement


def read_placement_file(
    path: str | Path,
    layers: int | None = None,
    experts: int | None = None,
    chiplets: int | None = None,
) -> PlacementFile:
    """Read a `comoe-placement` file with its header (`page_gb`, `instance`, `meta`)."""
    path = Path(path)
    doc = _load_json(path, "placement file")
    if not isinstance(doc, dict):
        raise InputError(path, None, f"must be a JSON object, got {_json_type(doc)}")
    unknown = sorted(set(doc) - _ALLOWED_KEYS)
    if unknown:
        raise InputError(path, unknown[0], f"unknown key (allowed: {', '.join(sorted(_ALLOWED_KEYS))})")
    fmt = doc.get("format")
    if fmt != FORMAT:
        raise InputError(path, "format", f"must be {FORMAT!r}, got {fmt!r}")
    version = doc.get("version")
    if not _is_int(version):
        raise InputError(path, "version", f"must be an integer, got {version!r}")
    if version != FORMAT_VERSION:
        raise InputError(
            path, "version", f"unsupported version {version} (this comoe-opt reads {FORMAT_VERSION})"
        )
    shape = []
    for key, expected in (("layers", layers), ("experts_per_layer", experts), ("chiplets", chiplets)):
        value = doc.get(key)
        if not _is_int(value) or value < 1:
            raise InputError(path, key, f"must be a positive integer, got {value!r}")
        if expected is not None and value != expected:
            raise InputError(path, key, f"file has {value}, expected {expected}")
        shape.append(value)
    page_gb = doc.get("page_gb")
    if page_gb is not None and not (_is_number(page_gb) and math.isfinite(page_gb) and page_gb > 0):
        raise InputError(path, "page_gb", f"must be a positive number, got {page_gb!r}")
    instance = doc.get("instance")
    if instance is not None and not isinstance(instance, str):
        raise InputError(path, "instance", f"must be a string, got {_json_type(instance)}")
    meta = doc.get("meta", {})
    if not isinstance(meta, dict):
        raise InputError(path, "meta", f"must be a JSON object, got {_json_type(meta)}")
    if "placement" not in doc:
        raise InputError(path, "placement", "missing")
    resident = _parse_replica_sets(doc["placement"], *shape, path)
    return PlacementFile(
        Placement(resident),
        page_gb=None if page_gb is None else float(page_gb),
        instance=instance,
        meta=meta,
    )


def _parse_replica_sets(raw: Any, layers: int, experts: int, chiplets: int, path: Path) -> np.ndarray:
    resident = np.zeros((layers, experts, chiplets), dtype=bool)
    _expect_list(raw, layers, "placement", path, "layers")
    for li, layer in enumerate(raw):
        _expect_list(layer, experts, f"placement[{li}]", path, "experts")
        for e, ids in enumerate(layer):
            where = f"placement[{li}][{e}]"
            if not isinstance(ids, list):
                raise InputError(path, where, f"must be a list of chiplet ids, got {_json_type(ids)}")
            for i, c in enumerate(ids):
                if not _is_int(c):
                    raise InputError(path, f"{where}[{i}]", f"chiplet id must be an integer, got {c!r}")
                if not 0 <= c < chiplets:
                    raise InputError(path, f"{where}[{i}]", f"chiplet id {c} out of range 0..{chiplets - 1}")
                if resident[li, e, c]:
                    raise InputError(path, where, f"chiplet {c} listed twice for one expert")
                resident[li, e, c] = True
    return resident


# ================================================================ padding


def device_slots(
    placement: Placement, load: np.ndarray | None = None, *, engine: str = "the engine"
) -> np.ndarray:
    """Physical slots per device: int array [layers, devices, S] of logical expert ids.

    Every device gets the same number of slots S per layer, the largest
    replica count of any device in any layer. A device's own replicas come
    first (ascending expert id); a device with fewer is padded with extra
    replicas of experts of that layer it does not hold yet: with `load`
    ([layers, experts]), the expert with the largest load per replica
    (counting the padding already added in that layer), ties to the lowest
    id; without it, the lowest id. A device never holds one expert twice.
    Raises `InputError` if a logical expert has no replica: serving engines
    need every expert resident somewhere.
    """
    resident = placement.resident
    layers, experts, devices = resident.shape
    replicas = placement.replicas()
    missing = np.argwhere(replicas == 0)
    if missing.size:
        li, e = (int(x) for x in missing[0])
        raise InputError(
            None,
            f"placement[{li}][{e}]",
            f"logical expert ({li}, {e}) has no replica; {engine} needs every expert resident on at least "
            f"one device ({len(missing)} expert(s) missing in total)",
        )
    weights = _check_load(load, layers, experts)
    per_device = resident.sum(axis=1)  # [layers, devices]
    slots = int(per_device.max())
    out = np.empty((layers, devices, slots), dtype=np.int64)
    for li in range(layers):
        counts = replicas[li].astype(np.float64)
        for d in range(devices):
            held = resident[li, :, d].copy()
            own = np.flatnonzero(held)
            out[li, d, : own.size] = own
            for s in range(own.size, slots):
                if weights is None:
                    pick = int(np.flatnonzero(~held)[0])
                else:
                    score = np.where(held, -np.inf, weights[li] / counts)
                    pick = int(np.argmax(score))  # first maximum = lowest id
                out[li, d, s] = pick
                held[pick] = True
                counts[pick] += 1
    return out


def _check_load(load: np.ndarray | None, layers: int, experts: int) -> np.ndarray | None:
    if load is None:
        return None
    arr = np.asarray(load)
    if arr.shape != (layers, experts):
        raise InputError(None, "load", f"must have shape [{layers}, {experts}], got {list(arr.shape)}")
    if not (np.issubdtype(arr.dtype, np.number) and not np.issubdtype(arr.dtype, np.complexfloating)):
        raise InputError(None, "load", f"must be numeric, got dtype {arr.dtype}")
    arr = arr.astype(np.float64)
    if not np.isfinite(arr).all():
        raise InputError(None, "load", "contains NaN or infinite values")
    if (arr < 0).any():
        raise InputError(None, "load", "contains negative values")
    return arr


# ================================================================= SGLang


def write_sglang(
    placement: Placement,
    path: str | Path,
    *,
    load: np.ndarray | None = None,
    layer_ids: Sequence[int] | None = None,
    num_model_layers: int | None = None,
) -> Path:
    """Write SGLang's `--init-expert-location` JSON: `{"physical_to_logical_map": [[...]]}`.

    Devices are the placement's chiplets (SGLang's EP ranks); padding follows
    `device_slots`. SGLang indexes this map by *model* layer (all
    `num_hidden_layers`, dense ones included): pass the model layer number
    of each placement layer in `layer_ids` (and the model's layer count) when
    the model has dense layers; their rows get SGLang's trivial map
    (`slot % experts`). The file name must end in `.json`: SGLang parses any
    other argument as a JSON string or a `.pt` file.
    """
    path = Path(path)
    if not path.name.endswith(".json"):
        raise InputError(
            path, None, "SGLang reads --init-expert-location as a file only when its name ends in '.json'"
        )
    slots = _with_source(path, lambda: device_slots(placement, load, engine="SGLang"))
    rows = slots.reshape(placement.layers, -1)  # device d owns slots d*S .. d*S+S-1
    model_rows, total = _sglang_model_layers(placement.layers, layer_ids, num_model_layers)
    physical = rows.shape[1]
    table = np.tile(np.arange(physical) % placement.experts, (total, 1))
    table[model_rows] = rows
    _write_json({SGLANG_KEY: table.tolist()}, path)
    return path


def read_sglang(
    path: str | Path,
    chiplets: int,
    *,
    experts: int | None = None,
    layer_ids: Sequence[int] | None = None,
) -> Placement:
    """Read an SGLang `physical_to_logical_map` JSON back into a Placement.

    `chiplets` is SGLang's EP size (the file does not hold it); `experts`
    defaults to the largest logical id + 1; `layer_ids` selects the MoE rows
    (default: every row). Two slots of one device holding the same expert
    (SGLang allows it) read as one replica.
    """
    path = Path(path)
    if not _is_int(chiplets) or chiplets < 1:
        raise InputError(None, "chiplets", f"must be a positive integer, got {chiplets!r}")
    doc = _load_json(path, "SGLang expert-location file")
    if not isinstance(doc, dict):
        raise InputError(path, None, f"must be a JSON object, got {_json_type(doc)}")
    if SGLANG_KEY not in doc:
        raise InputError(path, SGLANG_KEY, "missing (the only key SGLang's init_by_mapping accepts)")
    extra = sorted(set(doc) - {SGLANG_KEY})
    if extra:
        raise InputError(path, extra[0], "unexpected key: SGLang passes every key to init_by_mapping(**...)")
    table = _int_table(doc[SGLANG_KEY], SGLANG_KEY, path)
    num_rows, physical = table.shape
    if physical % chiplets:
        raise InputError(
            path, SGLANG_KEY, f"{physical} physical slots per layer do not split over {chiplets} devices"
        )
    if layer_ids is None:
        rows = list(range(num_rows))
    else:
        rows, _ = _with_source(path, lambda: _sglang_model_layers(len(layer_ids), layer_ids, num_rows))
    n = _num_logical(table[rows], experts, SGLANG_KEY, path)
    devices = np.arange(physical) // (physical // chiplets)  # device d owns slots d*S .. d*S+S-1
    resident = np.zeros((len(rows), n, chiplets), dtype=bool)
    for i, row in enumerate(rows):
        resident[i, table[row], devices] = True
    return Placement(resident)


def _sglang_model_layers(
    layers: int, layer_ids: Sequence[int] | None, num_model_layers: int | None
) -> tuple[list[int], int]:
    """Model layer of each placement layer, and the model's layer count."""
    if layer_ids is None:
        if num_model_layers is not None and num_model_layers != layers:
            raise InputError(
                None,
                "num_model_layers",
                f"is {num_model_layers} but the placement has {layers} layers; pass layer_ids",
            )
        return list(range(layers)), layers
    ids = list(layer_ids)
    if len(ids) != layers or not all(_is_int(x) for x in ids):
        raise InputError(
            None, "layer_ids", f"must be {layers} integers (one per placement layer), got {ids!r}"
        )
    if any(b <= a for a, b in itertools.pairwise(ids)) or (ids and ids[0] < 0):
        raise InputError(None, "layer_ids", f"must be non-negative and strictly increasing, got {ids}")
    total = num_model_layers if num_model_layers is not None else (ids[-1] + 1 if ids else 0)
    if ids and ids[-1] >= total:
        raise InputError(None, "layer_ids", f"layer {ids[-1]} is out of range for a {total}-layer model")
    return ids, total


# =========================================================== vLLM-Ascend


def write_vllm_ascend(placement: Placement, path: str | Path, *, load: np.ndarray | None = None) -> Path:
    """Write vLLM-Ascend's `expert_map_path` JSON (`moe_layer_count`, `layer_list`).

    Layers are MoE layers in order (vLLM-Ascend skips dense layers itself);
    devices are the placement's chiplets; padding follows `device_slots`.
    """
    path = Path(path)
    slots = _with_source(path, lambda: device_slots(placement, load, engine="vLLM-Ascend"))
    doc = {
        "moe_layer_count": placement.layers,
        "layer_list": [
            {
                "layer_id": li,
                "device_count": placement.chiplets,
                "device_list": [
                    {"device_id": d, "device_expert": slots[li, d].tolist()}
                    for d in range(placement.chiplets)
                ],
            }
            for li in range(placement.layers)
        ],
    }
    _write_json(doc, path)
    return path


def read_vllm_ascend(path: str | Path, *, experts: int | None = None) -> Placement:
    """Read a vLLM-Ascend expert map back into a Placement (`experts` defaults to largest id + 1)."""
    path = Path(path)
    doc = _load_json(path, "vLLM-Ascend expert map")
    if not isinstance(doc, dict):
        raise InputError(path, None, f"must be a JSON object, got {_json_type(doc)}")
    count = doc.get("moe_layer_count")
    if not _is_int(count) or count < 1:
        raise InputError(path, "moe_layer_count", f"must be a positive integer, got {count!r}")
    layer_list = doc.get("layer_list")
    _expect_list(layer_list, count, "layer_list", path, "layers (moe_layer_count)")
    tables = []
    devices = slots = None
    for li, layer in enumerate(layer_list):
        where = f"layer_list[{li}]"
        if not isinstance(layer, dict):
            raise InputError(path, where, f"must be a JSON object, got {_json_type(layer)}")
        for key in ("layer_id", "device_count", "device_list"):
            if key not in layer:
                raise InputError(path, f"{where}.{key}", "missing")
        if not _is_int(layer["layer_id"]) or layer["layer_id"] != li:
            raise InputError(
                path,
                f"{where}.layer_id",
                f"is {layer['layer_id']!r}; vLLM-Ascend reads layers by position, so it must be {li}",
            )
        n_dev = layer["device_count"]
        if not _is_int(n_dev) or n_dev < 1:
            raise InputError(path, f"{where}.device_count", f"must be a positive integer, got {n_dev!r}")
        if devices is not None and n_dev != devices:
            raise InputError(path, f"{where}.device_count", f"is {n_dev}, layer 0 has {devices}")
        devices = n_dev
        _expect_list(layer["device_list"], n_dev, f"{where}.device_list", path, "devices (device_count)")
        rows = []
        for d, dev in enumerate(layer["device_list"]):
            dwhere = f"{where}.device_list[{d}]"
            if not isinstance(dev, dict):
                raise InputError(path, dwhere, f"must be a JSON object, got {_json_type(dev)}")
            if not _is_int(dev.get("device_id")) or dev["device_id"] != d:
                raise InputError(
                    path,
                    f"{dwhere}.device_id",
                    f"is {dev.get('device_id')!r}; devices are read by position, so it must be {d}",
                )
            ids = dev.get("device_expert")
            if not isinstance(ids, list) or not ids:
                raise InputError(path, f"{dwhere}.device_expert", "must be a non-empty list of expert ids")
            for i, e in enumerate(ids):
                if not _is_int(e) or e < 0:
                    raise InputError(
                        path, f"{dwhere}.device_expert[{i}]", f"must be a non-negative integer, got {e!r}"
                    )
            if len(set(ids)) != len(ids):
                dup = next(e for e in ids if ids.count(e) > 1)
                raise InputError(path, f"{dwhere}.device_expert", f"expert {dup} listed twice on one device")
            if slots is not None and len(ids) != slots:
                raise InputError(
                    path,
                    f"{dwhere}.device_expert",
                    f"has {len(ids)} slots, others {slots}: vLLM-Ascend needs equal counts",
                )
            slots = len(ids)
            rows.append(ids)
        tables.append(rows)
    table = np.array(tables, dtype=np.int64)  # [layers, devices, slots]
    n = _num_logical(table, experts, "layer_list[*].device_list[*].device_expert", path)
    resident = np.zeros((count, n, devices), dtype=bool)
    l_idx, d_idx, _ = np.indices(table.shape)
    resident[l_idx, table, d_idx] = True
    return Placement(resident)


# ============================================================ load counts


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
        bad = [x for x in ids if not _is_int(x) or not 0 <= x < counts.shape[0]]
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
    doc = _load_json(path, "load-count file")
    if isinstance(doc, dict):
        name = next((k for k in LOAD_KEYS if k in doc), None)
        if name is None:
            raise InputError(path, None, f"JSON object needs a key {' or '.join(map(repr, LOAD_KEYS))}")
        raw, prefix = doc[name], name
    elif isinstance(doc, list):
        raw, name, prefix = doc, "counts", ""
    else:
        raise InputError(path, None, f"must be a JSON object or a 2-D list, got {_json_type(doc)}")
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
                    path, where or label, f"must be a list (ragged rows), got {_json_type(value)}"
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
        if not _is_number(value):
            raise InputError(path, where, f"not a number: {value!r}")
        if not math.isfinite(value):
            raise InputError(path, where, f"must be finite, got {value!r}")
        if value < 0:
            raise InputError(path, where, f"negative count {value!r}")

    if not isinstance(raw, list):
        raise InputError(path, label, f"must be a list of lists, got {_json_type(raw)}")
    walk(raw, prefix, 0)
    return np.array(raw, dtype=np.float64).reshape(shape)


def _load_counts_npz(path: Path) -> tuple[np.ndarray, str]:
    if not path.exists():
        raise InputError(path, None, "no such load-count file")
    try:
        with np.load(path, allow_pickle=False) as data:
            name = next((k for k in LOAD_KEYS if k in data.files), None)
            if name is None:
                raise InputError(
                    path,
                    None,
                    f"holds no array {' or '.join(map(repr, LOAD_KEYS))} (has {sorted(data.files)})",
                )
            arr = data[name]
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise InputError(path, None, f"not a readable .npz file: {exc}") from None
    if (
        arr.dtype == np.bool_
        or not np.issubdtype(arr.dtype, np.number)
        or np.issubdtype(arr.dtype, np.complexfloating)
    ):
        raise InputError(path, name, f"must be numeric, got dtype {arr.dtype}")
    arr = arr.astype(np.float64)
    for bad, problem in ((~np.isfinite(arr), "NaN or infinite count"), (arr < 0, "negative count")):
        where = np.argwhere(bad)
        if where.size:
            index = "".join(f"[{int(i)}]" for i in where[0])
            raise InputError(path, f"{name}{index}", f"{problem} {arr[tuple(where[0])]!r}")
    return arr, name


# ================================================================ helpers


def _load_json(path: Path, what: str) -> Any:
    if not path.exists():
        raise InputError(path, None, f"no such {what}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(path, None, f"cannot read: {exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            path, None, f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None


def _int_table(raw: Any, name: str, path: Path) -> np.ndarray:
    if not isinstance(raw, list) or not raw:
        raise InputError(path, name, "must be a non-empty list of rows")
    width = None
    for r, row in enumerate(raw):
        if not isinstance(row, list) or not row:
            raise InputError(path, f"{name}[{r}]", "must be a non-empty list of logical expert ids")
        if width is not None and len(row) != width:
            raise InputError(
                path,
                f"{name}[{r}]",
                f"has {len(row)} slots, row 0 has {width}: every layer needs the same count",
            )
        width = len(row)
        for i, x in enumerate(row):
            if not _is_int(x) or x < 0:
                raise InputError(
                    path, f"{name}[{r}][{i}]", f"must be a non-negative integer expert id, got {x!r}"
                )
    return np.array(raw, dtype=np.int64)


def _num_logical(table: np.ndarray, experts: int | None, name: str, path: Path) -> int:
    largest = int(table.max())
    if experts is None:
        return largest + 1
    if largest >= experts:
        where = tuple(int(i) for i in np.argwhere(table == largest)[0])
        raise InputError(path, name, f"expert id {largest} at {list(where)} out of range 0..{experts - 1}")
    return experts


def _expect_list(value: Any, length: int, where: str, path: Path, what: str) -> None:
    if not isinstance(value, list):
        raise InputError(path, where, f"must be a list, got {_json_type(value)}")
    if len(value) != length:
        raise InputError(path, where, f"has {len(value)} entries, expected {length} {what}")


def _with_source(path: Path, fn: Any) -> Any:
    """Run `fn`, attaching `path` to an InputError that names no file."""
    try:
        return fn()
    except InputError as exc:
        if exc.source is None:
            raise InputError(path, exc.field, exc.problem) from None
        raise


def _plain_json(value: Any, name: str) -> Any:
    try:
        return json.loads(json.dumps(value, sort_keys=True, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise InputError(None, name, f"not JSON-serialisable: {exc}") from None


def _write_json(doc: Any, path: Path) -> None:
    text = _format(doc, 0) + "\n"
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def _is_flat(value: Any) -> bool:
    scalar = (str, int, float, bool, type(None))
    if isinstance(value, list):
        return all(isinstance(x, scalar) for x in value)
    if isinstance(value, dict):
        return all(isinstance(v, scalar) or (isinstance(v, list) and _is_flat(v)) for v in value.values())
    return True


def _format(value: Any, indent: int) -> str:
    """JSON with containers of scalars on one line: one line per expert / row / device."""
    if _is_flat(value) or not value:
        return json.dumps(value, separators=(", ", ": "), allow_nan=False)
    pad, inner = "  " * indent, "  " * (indent + 1)
    if isinstance(value, list):
        items = [inner + _format(x, indent + 1) for x in value]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    items = [f"{inner}{json.dumps(k)}: {_format(v, indent + 1)}" for k, v in value.items()]
    return "{\n" + ",\n".join(items) + "\n" + pad + "}"


def _is_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(
        value, bool | np.bool_
    )


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    for kind, label in names.items():
        if isinstance(value, kind):
            return label
    return "a number" if _is_number(value) else type(value).__name__
