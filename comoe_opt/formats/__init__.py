"""Placement files: our own JSON, serving-engine expert maps, and expert-load counts.

Every reader validates and raises `InputError` naming the file, the JSON
field path and the problem; every writer is atomic (temporary file + rename)
and deterministic. Formats are documented in docs/placement-format.md. A new
file format is a module here.
"""

from comoe_opt.formats.engines import (
    ENGINE_FORMATS,
    EngineFormat,
    ModelLayers,
    device_slots,
    engine_format,
    export_placement,
    launch_flags,
    read_sglang,
    read_trtllm,
    read_vllm_ascend,
    write_sglang,
    write_trtllm,
    write_vllm_ascend,
)
from comoe_opt.formats.placement_file import (
    PlacementFile,
    read_placement,
    read_placement_file,
    write_placement,
)
from comoe_opt.trace.counts import read_load_counts, read_step_counts

__all__ = [
    "ENGINE_FORMATS",
    "EngineFormat",
    "ModelLayers",
    "PlacementFile",
    "device_slots",
    "engine_format",
    "export_placement",
    "launch_flags",
    "read_load_counts",
    "read_placement",
    "read_placement_file",
    "read_sglang",
    "read_step_counts",
    "read_trtllm",
    "read_vllm_ascend",
    "write_placement",
    "write_sglang",
    "write_trtllm",
    "write_vllm_ascend",
]
