"""Our own placement file, `comoe-placement` JSON (docs/placement-format.md): for every logical
expert, the chiplets holding a replica. Versioned, one line per expert, so a diff between two
plans shows which experts moved."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from comoe_opt.errors import InputError
from comoe_opt.jsonio import (
    expect_list,
    is_int,
    is_number,
    json_type,
    load_json,
    plain_json,
    write_json,
)
from comoe_opt.residency.placement import Placement

FORMAT = "comoe-placement"
FORMAT_VERSION = 1
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
    if page_gb is not None and not (is_number(page_gb) and math.isfinite(page_gb) and page_gb > 0):
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
        doc["meta"] = plain_json(meta, "meta")
    doc["placement"] = [
        [np.flatnonzero(placement.resident[li, e]).tolist() for e in range(placement.experts)]
        for li in range(placement.layers)
    ]
    write_json(doc, path)
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
    doc = load_json(path, "placement file")
    if not isinstance(doc, dict):
        raise InputError(path, None, f"must be a JSON object, got {json_type(doc)}")
    unknown = sorted(set(doc) - _ALLOWED_KEYS)
    if unknown:
        raise InputError(path, unknown[0], f"unknown key (allowed: {', '.join(sorted(_ALLOWED_KEYS))})")
    fmt = doc.get("format")
    if fmt != FORMAT:
        raise InputError(path, "format", f"must be {FORMAT!r}, got {fmt!r}")
    version = doc.get("version")
    if not is_int(version):
        raise InputError(path, "version", f"must be an integer, got {version!r}")
    if version != FORMAT_VERSION:
        raise InputError(
            path, "version", f"unsupported version {version} (this comoe-opt reads {FORMAT_VERSION})"
        )
    shape: list[int] = []
    for key, expected in (("layers", layers), ("experts_per_layer", experts), ("chiplets", chiplets)):
        value = doc.get(key)
        if not is_int(value) or value < 1:
            raise InputError(path, key, f"must be a positive integer, got {value!r}")
        if expected is not None and value != expected:
            raise InputError(path, key, f"file has {value}, expected {expected}")
        shape.append(value)
    page_gb = doc.get("page_gb")
    if page_gb is not None and not (is_number(page_gb) and math.isfinite(page_gb) and page_gb > 0):
        raise InputError(path, "page_gb", f"must be a positive number, got {page_gb!r}")
    instance = doc.get("instance")
    if instance is not None and not isinstance(instance, str):
        raise InputError(path, "instance", f"must be a string, got {json_type(instance)}")
    meta = doc.get("meta", {})
    if not isinstance(meta, dict):
        raise InputError(path, "meta", f"must be a JSON object, got {json_type(meta)}")
    if "placement" not in doc:
        raise InputError(path, "placement", "missing")
    layers, experts, chiplets = shape
    resident = _parse_replica_sets(doc["placement"], layers, experts, chiplets, path)
    return PlacementFile(
        Placement(resident),
        page_gb=None if page_gb is None else float(page_gb),
        instance=instance,
        meta=meta,
    )


def _parse_replica_sets(raw: Any, layers: int, experts: int, chiplets: int, path: Path) -> np.ndarray:
    resident = np.zeros((layers, experts, chiplets), dtype=bool)
    expect_list(raw, layers, "placement", path, "layers")
    for li, layer in enumerate(raw):
        expect_list(layer, experts, f"placement[{li}]", path, "experts")
        for e, ids in enumerate(layer):
            where = f"placement[{li}][{e}]"
            if not isinstance(ids, list):
                raise InputError(path, where, f"must be a list of chiplet ids, got {json_type(ids)}")
            for i, c in enumerate(ids):
                if not is_int(c):
                    raise InputError(path, f"{where}[{i}]", f"chiplet id must be an integer, got {c!r}")
                if not 0 <= c < chiplets:
                    raise InputError(path, f"{where}[{i}]", f"chiplet id {c} out of range 0..{chiplets - 1}")
                if resident[li, e, c]:
                    raise InputError(path, where, f"chiplet {c} listed twice for one expert")
                resident[li, e, c] = True
    return resident


# ================================================================ padding
