"""Serving-engine expert maps: SGLang `--init-expert-location`, vLLM-Ascend `expert_map_path` and
TensorRT-LLM's `moe_config.load_balancer` file.

* SGLang (`write_sglang` / `read_sglang`): `physical_to_logical_map[layer][physical slot]`,
  device `d` owning slots `d*S .. d*S+S-1`.
* vLLM-Ascend (`write_vllm_ascend` / `read_vllm_ascend`):
  `layer_list[l].device_list[d].device_expert`.
* TensorRT-LLM (`write_trtllm` / `read_trtllm`): `MoeLoadBalancerConfig` YAML,
  `initial_global_assignments[model layer][slot]`, rank `r` owning slots `r*S .. r*S+S-1`.

Engines need the same number of physical slots on every device; devices that
hold fewer replicas are padded (`device_slots`). Formats: docs/placement-format.md."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from comoe_opt.best_split.even import slot_replicas
from comoe_opt.errors import InputError
from comoe_opt.instance import ModelShape
from comoe_opt.jsonio import (
    expect_list,
    int_table,
    is_int,
    json_type,
    load_json,
    load_yaml,
    num_logical,
    with_source,
    write_json,
    write_text,
)
from comoe_opt.residency.placement import Placement

SGLANG_KEY = "physical_to_logical_map"


def device_slots(
    placement: Placement, load: np.ndarray | None = None, *, engine: str = "the engine", repeats: bool = False
) -> np.ndarray:
    """Physical slots per device: int array [layers, devices, S] of logical expert ids.

    Every device gets the same number of slots S per layer, the largest
    replica count of any device in any layer. A device's own replicas come
    first (ascending expert id); a device with fewer is padded with extra
    replicas of experts of that layer it does not hold yet: with `load`
    ([layers, experts]), the expert with the largest load per replica
    (counting the padding already added in that layer), ties to the lowest
    id; without it, the lowest id. A device never holds one expert twice,
    except with `repeats` (the engine accepts it) when the placement carries
    the map its method planned (`Placement.slot_map`, EPLB's): that map as is.
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
    if repeats and placement.slot_map is not None:
        return placement.slot_map.copy()
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


def redundant_experts(placement: Placement, *, repeats: bool = False) -> int:
    """Physical slots per layer beyond the logical experts, as the engines count them: every
    device gets the largest per-device replica count, or the planned map's slots (`device_slots`)."""
    planned = placement.slot_map if repeats else None
    slots = int(placement.resident.sum(axis=1).max()) if planned is None else planned.shape[2]
    return placement.chiplets * slots - placement.experts


@dataclass(frozen=True)
class ModelLayers:
    """Where a placement's layers sit in the model: the model layer id of each (`ids`), the
    model's decoder layers (`total`, dense ones included) and its first MoE layer. Engines
    address whole models; a placement may cover a subset of the MoE layers (a sampled log)."""

    ids: tuple[int, ...]
    total: int
    first_moe: int = 0

    @classmethod
    def of(cls, model: ModelShape) -> ModelLayers:
        return cls(tuple(model.moe_layer_ids), model.hidden_layers, model.first_moe_layer)


@dataclass(frozen=True)
class EngineFormat:
    """A serving engine's expert-map file: how to write it, read it, and launch the engine on it."""

    name: str
    write: Callable[[Placement, Path, np.ndarray | None, ModelLayers | None], Path]
    read: Callable[[Path, int, int | None, ModelLayers | None], Placement]
    flags: Callable[[Path, int], str]


def engine_format(engine: str) -> EngineFormat:
    """The registered format of `engine` (`ENGINE_FORMATS`); unknown names are a user error."""
    try:
        return ENGINE_FORMATS[engine]
    except KeyError:
        known = ", ".join(ENGINE_FORMATS)
        raise InputError(None, "engine", f"unknown engine {engine!r} (known: {known})") from None


def export_placement(
    engine: str,
    placement: Placement,
    path: str | Path,
    *,
    load: np.ndarray | None = None,
    layers: ModelLayers | None = None,
) -> Path:
    """Write `placement` as `engine` loads it, its layers at the model layers `layers` names."""
    return engine_format(engine).write(placement, Path(path), load, layers)


def launch_flags(engine: str, path: Path, placement: Placement) -> str:
    """The launch options that make the engine load the written map (checked against SGLang 0.5.23
    and vLLM-Ascend at 182b75ea84; docs/placement-format.md)."""
    return engine_format(engine).flags(path, redundant_experts(placement, repeats=engine == "sglang"))


def _sglang_flags(path: Path, extra: int) -> str:
    return f"--init-expert-location {path} --ep-num-redundant-experts {extra}"


def _vllm_ascend_flags(path: Path, extra: int) -> str:
    config = {"eplb_config": {"expert_map_path": str(path), "num_redundant_experts": extra}}
    return f"--additional-config '{json.dumps(config)}'"


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
    slots = with_source(path, lambda: device_slots(placement, load, engine="SGLang", repeats=True))
    rows = slots.reshape(placement.layers, -1)  # device d owns slots d*S .. d*S+S-1
    model_rows, total = _sglang_model_layers(placement.layers, layer_ids, num_model_layers)
    physical = rows.shape[1]
    table = np.tile(np.arange(physical) % placement.experts, (total, 1))
    table[model_rows] = rows
    write_json({SGLANG_KEY: table.tolist()}, path)
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
    if not is_int(chiplets) or chiplets < 1:
        raise InputError(None, "chiplets", f"must be a positive integer, got {chiplets!r}")
    doc = load_json(path, "SGLang expert-location file")
    if not isinstance(doc, dict):
        raise InputError(path, None, f"must be a JSON object, got {json_type(doc)}")
    if SGLANG_KEY not in doc:
        raise InputError(path, SGLANG_KEY, "missing (the only key SGLang's init_by_mapping accepts)")
    extra = sorted(set(doc) - {SGLANG_KEY})
    if extra:
        raise InputError(path, extra[0], "unexpected key: SGLang passes every key to init_by_mapping(**...)")
    table = int_table(doc[SGLANG_KEY], SGLANG_KEY, path)
    num_rows, physical = table.shape
    if physical % chiplets:
        raise InputError(
            path, SGLANG_KEY, f"{physical} physical slots per layer do not split over {chiplets} devices"
        )
    if layer_ids is None:
        rows = list(range(num_rows))
    else:
        rows, _ = with_source(path, lambda: _sglang_model_layers(len(layer_ids), layer_ids, num_rows))
    n = num_logical(table[rows], experts, SGLANG_KEY, path)
    # device d owns slots d*S .. d*S+S-1
    return Placement(slot_replicas(np.asarray(table)[rows], n, chiplets) > 0)


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
    if len(ids) != layers or not all(is_int(x) for x in ids):
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


def write_vllm_ascend(
    placement: Placement,
    path: str | Path,
    *,
    load: np.ndarray | None = None,
    layers: ModelLayers | None = None,
) -> Path:
    """Write vLLM-Ascend's `expert_map_path` JSON (`moe_layer_count`, `layer_list`).

    Layers are MoE layers in order (vLLM-Ascend counts MoE layers, not model layers): with
    `layers`, placement layer i is MoE layer `ids[i] - first_moe` of the model's
    `total - first_moe`, and MoE layers the placement does not cover get the trivial map
    (slot % experts, as SGLang's rows of dense layers). Devices are the placement's chiplets;
    padding follows `device_slots`. The name must end in `.json` (vLLM-Ascend refuses any other).
    """
    path = Path(path)
    if not path.name.endswith(".json"):
        raise InputError(path, None, "vLLM-Ascend accepts expert_map_path only when its name ends in '.json'")
    slots = with_source(path, lambda: device_slots(placement, load, engine="vLLM-Ascend"))
    rows, count = _vllm_ascend_moe_layers(placement.layers, layers)
    per_device = slots.shape[2]
    table = (np.arange(placement.chiplets * per_device) % placement.experts).reshape(placement.chiplets, -1)
    tables = np.repeat(table[None], count, axis=0)
    tables[rows] = slots
    doc = {
        "moe_layer_count": count,
        "layer_list": [
            {
                "layer_id": li,
                "device_count": placement.chiplets,
                "device_list": [
                    {"device_id": d, "device_expert": tables[li, d].tolist()}
                    for d in range(placement.chiplets)
                ],
            }
            for li in range(count)
        ],
    }
    write_json(doc, path)
    return path


def _vllm_ascend_moe_layers(layers: int, where: ModelLayers | None) -> tuple[list[int], int]:
    """MoE layer index of each placement layer, and the model's MoE layer count."""
    if where is None:
        return list(range(layers)), layers
    ids, total = _sglang_model_layers(layers, where.ids, where.total)
    if ids and ids[0] < where.first_moe:
        raise InputError(None, "layer_ids", f"layer {ids[0]} is before the first MoE layer {where.first_moe}")
    return [i - where.first_moe for i in ids], total - where.first_moe


def read_vllm_ascend(
    path: str | Path, *, experts: int | None = None, layers: ModelLayers | None = None
) -> Placement:
    """Read a vLLM-Ascend expert map back into a Placement (`experts` defaults to largest id + 1);
    with `layers`, only the MoE layers it names, and the map must cover the model's MoE layers."""
    path = Path(path)
    doc = load_json(path, "vLLM-Ascend expert map")
    if not isinstance(doc, dict):
        raise InputError(path, None, f"must be a JSON object, got {json_type(doc)}")
    count = doc.get("moe_layer_count")
    if not is_int(count) or count < 1:
        raise InputError(path, "moe_layer_count", f"must be a positive integer, got {count!r}")
    layer_list = expect_list(doc.get("layer_list"), count, "layer_list", path, "layers (moe_layer_count)")
    shape = _AscendShape()
    table = np.array(
        [_ascend_layer(layer, li, path, shape) for li, layer in enumerate(layer_list)], dtype=np.int64
    )
    if layers is not None:
        rows, total = with_source(path, lambda: _vllm_ascend_moe_layers(len(layers.ids), layers))
        if total != count:
            raise InputError(path, "moe_layer_count", f"is {count}, the model has {total} MoE layers")
        table = table[rows]
    n = num_logical(table, experts, "layer_list[*].device_list[*].device_expert", path)
    resident = np.zeros((table.shape[0], n, table.shape[1]), dtype=bool)
    l_idx, d_idx, _ = np.indices(table.shape)
    resident[l_idx, table, d_idx] = True
    return Placement(resident)


@dataclass
class _AscendShape:
    """The devices per layer and slots per device the first layer and device set, which every
    other must repeat (vLLM-Ascend needs equal counts)."""

    devices: int | None = None
    slots: int | None = None


def _ascend_layer(layer: Any, li: int, path: Path, shape: _AscendShape) -> list[list[int]]:
    """Layer `li` of the map's `layer_list`, checked: its id by position, its device count."""
    where = f"layer_list[{li}]"
    if not isinstance(layer, dict):
        raise InputError(path, where, f"must be a JSON object, got {json_type(layer)}")
    for key in ("layer_id", "device_count", "device_list"):
        if key not in layer:
            raise InputError(path, f"{where}.{key}", "missing")
    if not is_int(layer["layer_id"]) or layer["layer_id"] != li:
        raise InputError(
            path,
            f"{where}.layer_id",
            f"is {layer['layer_id']!r}; vLLM-Ascend reads layers by position, so it must be {li}",
        )
    n_dev = layer["device_count"]
    if not is_int(n_dev) or n_dev < 1:
        raise InputError(path, f"{where}.device_count", f"must be a positive integer, got {n_dev!r}")
    if shape.devices is not None and n_dev != shape.devices:
        raise InputError(path, f"{where}.device_count", f"is {n_dev}, layer 0 has {shape.devices}")
    shape.devices = n_dev
    expect_list(layer["device_list"], n_dev, f"{where}.device_list", path, "devices (device_count)")
    return [
        _ascend_device(dev, f"{where}.device_list[{d}]", d, path, shape)
        for d, dev in enumerate(layer["device_list"])
    ]


def _ascend_device(dev: Any, where: str, d: int, path: Path, shape: _AscendShape) -> list[int]:
    """Device `d`'s expert ids, checked: its id by position, distinct non-negative ids, as many
    slots as every other device."""
    if not isinstance(dev, dict):
        raise InputError(path, where, f"must be a JSON object, got {json_type(dev)}")
    if not is_int(dev.get("device_id")) or dev["device_id"] != d:
        raise InputError(
            path,
            f"{where}.device_id",
            f"is {dev.get('device_id')!r}; devices are read by position, so it must be {d}",
        )
    ids = dev.get("device_expert")
    if not isinstance(ids, list) or not ids:
        raise InputError(path, f"{where}.device_expert", "must be a non-empty list of expert ids")
    for i, e in enumerate(ids):
        if not is_int(e) or e < 0:
            raise InputError(
                path, f"{where}.device_expert[{i}]", f"must be a non-negative integer, got {e!r}"
            )
    if len(set(ids)) != len(ids):
        dup = next(e for e in ids if ids.count(e) > 1)
        raise InputError(path, f"{where}.device_expert", f"expert {dup} listed twice on one device")
    if shape.slots is not None and len(ids) != shape.slots:
        raise InputError(
            path,
            f"{where}.device_expert",
            f"has {len(ids)} slots, others {shape.slots}: vLLM-Ascend needs equal counts",
        )
    shape.slots = len(ids)
    return ids


# ========================================================= TensorRT-LLM


TRTLLM_KEYS = ("num_slots", "initial_global_assignments", "layer_updates_per_iter")


def write_trtllm(
    placement: Placement,
    path: str | Path,
    *,
    load: np.ndarray | None = None,
    layers: ModelLayers | None = None,
) -> Path:
    """Write TensorRT-LLM's `MoeLoadBalancerConfig` YAML (`moe_config.load_balancer`): `num_slots`,
    `initial_global_assignments` (model layer index -> the expert id of each of the layer's
    `num_slots` slots, rank r owning slots r·S .. r·S + S − 1) and `layer_updates_per_iter: 0`
    (the map stays as planned: TensorRT-LLM's offline balancer).

    TensorRT-LLM looks every MoE layer of the model up by its model layer index: with `layers`,
    placement layer i is model layer `ids[i]`, and the model's other MoE layers (from
    `first_moe` on) get the trivial map (slot % experts); without, layers are numbered from 0.
    Devices are the placement's chiplets (EP ranks); padding follows `device_slots`, one replica
    of an expert per rank. The name must end in `.yaml` or `.yml`."""
    path = Path(path)
    if path.suffix not in (".yaml", ".yml"):
        raise InputError(path, None, "TensorRT-LLM's load_balancer file is YAML: name it *.yaml")
    slots = with_source(path, lambda: device_slots(placement, load, engine="TensorRT-LLM"))
    rows = slots.reshape(placement.layers, -1)
    model_ids, first, total = _trtllm_layers(placement.layers, layers)
    trivial = (np.arange(rows.shape[1]) % placement.experts).tolist()
    planned = dict(zip(model_ids, rows.tolist(), strict=True))
    assignments = {li: planned.get(li, trivial) for li in range(first, total)}
    lines = [f"num_slots: {rows.shape[1]}", "layer_updates_per_iter: 0", "initial_global_assignments:"]
    lines += [f"  {li}: [{', '.join(str(e) for e in ids)}]" for li, ids in assignments.items()]
    write_text("\n".join(lines) + "\n", path)
    return path


def _trtllm_layers(layers: int, where: ModelLayers | None) -> tuple[list[int], int, int]:
    """(model layer index of each placement layer, the model's first MoE layer, its layer count)."""
    first = 0 if where is None else where.first_moe
    moe, count = _vllm_ascend_moe_layers(layers, where)  # MoE layer indices, counted from `first`
    return [first + i for i in moe], first, first + count


def read_trtllm(
    path: str | Path, chiplets: int, *, experts: int | None = None, layers: ModelLayers | None = None
) -> Placement:
    """Read a `MoeLoadBalancerConfig` YAML back into a Placement, checked as TensorRT-LLM checks
    it: only its three keys, `num_slots` a multiple of the `chiplets` EP ranks, every layer's list
    `num_slots` long; with `layers`, the layers it names (every one must be there)."""
    path = Path(path)
    if not is_int(chiplets) or chiplets < 1:
        raise InputError(None, "chiplets", f"must be a positive integer, got {chiplets!r}")
    doc = load_yaml(path, "TensorRT-LLM load_balancer file")
    if not isinstance(doc, dict):
        raise InputError(path, None, f"must be a YAML mapping, got {json_type(doc)}")
    extra = sorted(str(k) for k in set(doc) - set(TRTLLM_KEYS))
    if extra:
        raise InputError(path, extra[0], "unexpected key: MoeLoadBalancerConfig forbids extra keys")
    slots = doc.get("num_slots")
    if not is_int(slots) or slots < 1 or slots % chiplets:
        raise InputError(
            path, "num_slots", f"must be a positive multiple of {chiplets} EP ranks, got {slots!r}"
        )
    table = doc.get("initial_global_assignments")
    if not isinstance(table, dict) or not table or not all(is_int(k) for k in table):
        raise InputError(path, "initial_global_assignments", "must map integer layer indices to expert lists")
    wanted = sorted(table) if layers is None else list(layers.ids)
    missing = [li for li in wanted if li not in table]
    if missing:
        raise InputError(path, "initial_global_assignments", f"has no layer {missing[0]}")
    rows = np.array([int_table([table[li]], f"initial_global_assignments.{li}", path)[0] for li in wanted])
    if rows.shape[1] != slots:
        raise InputError(
            path, "initial_global_assignments", f"lists {rows.shape[1]} experts a layer, num_slots is {slots}"
        )
    n = num_logical(rows, experts, "initial_global_assignments", path)
    return Placement(slot_replicas(rows, n, chiplets) > 0)


def _trtllm_flags(path: Path, extra: int) -> str:
    return f"--extra_llm_api_options FILE.yaml, FILE.yaml holding: moe_config: {{load_balancer: {path}}}"


# ============================================================== registry
# A new engine format is a writer, a reader and its launch flags above, and an entry here.

ENGINE_FORMATS: dict[str, EngineFormat] = {
    "sglang": EngineFormat(
        "sglang",
        write=lambda placement, path, load, layers: write_sglang(
            placement,
            path,
            load=load,
            layer_ids=None if layers is None else layers.ids,
            num_model_layers=None if layers is None else layers.total,
        ),
        read=lambda path, chiplets, experts, layers: read_sglang(
            path, chiplets, experts=experts, layer_ids=None if layers is None else layers.ids
        ),
        flags=_sglang_flags,
    ),
    "vllm-ascend": EngineFormat(
        "vllm-ascend",
        write=lambda placement, path, load, layers: write_vllm_ascend(
            placement, path, load=load, layers=layers
        ),
        read=lambda path, chiplets, experts, layers: read_vllm_ascend(path, experts=experts, layers=layers),
        flags=_vllm_ascend_flags,
    ),
    "trtllm": EngineFormat(
        "trtllm",
        write=lambda placement, path, load, layers: write_trtllm(placement, path, load=load, layers=layers),
        read=lambda path, chiplets, experts, layers: read_trtllm(
            path, chiplets, experts=experts, layers=layers
        ),
        flags=_trtllm_flags,
    ),
}
