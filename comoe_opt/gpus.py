"""Serving GPU kinds (`--gpu NAME`): memory, HBM bandwidth, dense peak compute and links.

Each preset is its vendor's published figure for one GPU of the usual 8-GPU server, cited per
kind. Peaks are dense (without structured sparsity, which MoE experts do not use). Links are per
direction, per GPU: scale-up is the GPU's share of the node's fabric (NVLink, Infinity Fabric,
HCCS: the datasheet's bidirectional total halved), scale-out its network card. Any number can be
overridden (`--gpu-memory-gb`, `--gpu-hbm-gb-s`, `--gpu-tflops`, `--scale-up-gb-s`,
`--scale-out-gb-s`): a machine's measured rates beat a datasheet's.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from comoe_opt.errors import ComoeError


@dataclass(frozen=True)
class GpuKind:
    name: str
    memory_gb: float  # device memory (HBM), GB
    hbm_gb_s: float  # HBM bandwidth, GB/s
    bf16_tflops: float  # dense BF16 tensor peak, TFLOP/s
    fp8_tflops: float  # dense FP8 tensor peak, TFLOP/s (the BF16 peak where there is no FP8 path)
    scale_up_gb_s: float  # into one GPU from its node, per direction, GB/s
    scale_out_gb_s: float  # into one GPU from another node, per direction, GB/s
    source: str

    def tflops_for(self, weight_bytes: float) -> float:
        """The peak an expert's GEMM runs at: FP8 for weights of at most one byte, else BF16."""
        return self.fp8_tflops if weight_bytes <= 1.0 else self.bf16_tflops


GPUS: dict[str, GpuKind] = {
    # NVIDIA A100 Tensor Core GPU datasheet (SXM4 80 GB): HBM2e 2,039 GB/s, BF16 312 TFLOPS dense,
    # no FP8; NVLink 600 GB/s bidirectional; HDR InfiniBand 200 Gb/s per GPU (DGX A100)
    "a100": GpuKind("A100 SXM 80 GB", 80.0, 2039.0, 312.0, 312.0, 300.0, 25.0, "NVIDIA A100 datasheet"),
    # NVIDIA H100 Tensor Core GPU datasheet (SXM5): 80 GB HBM3 at 3.35 TB/s, BF16 989 and FP8 1,979
    # TFLOPS dense (1,979 / 3,958 with sparsity); NVLink 900 GB/s bidirectional; ConnectX-7
    # 400 Gb/s per GPU (DGX H100)
    "h100": GpuKind("H100 SXM", 80.0, 3350.0, 989.0, 1979.0, 450.0, 50.0, "NVIDIA H100 datasheet"),
    # NVIDIA H200 datasheet (SXM): 141 GB HBM3e at 4.8 TB/s; compute and NVLink as H100 SXM
    "h200": GpuKind("H200 SXM", 141.0, 4800.0, 989.0, 1979.0, 450.0, 50.0, "NVIDIA H200 datasheet"),
    # NVIDIA HGX B200 datasheet: 180 GB HBM3e at 7.7 TB/s per GPU, FP8 9 and BF16 4.5 PFLOPS with
    # sparsity (4.5 / 2.25 dense); NVLink 5 1.8 TB/s bidirectional; ConnectX-7 400 Gb/s (DGX B200)
    "b200": GpuKind("B200 (HGX)", 180.0, 7700.0, 2250.0, 4500.0, 900.0, 50.0, "NVIDIA HGX B200 datasheet"),
    # AMD Instinct MI300X datasheet: 192 GB HBM3 at 5.3 TB/s, BF16 1,307.4 and FP8 2,614.9 TFLOPS
    # dense; Infinity Fabric 896 GB/s aggregate bidirectional (7 links x 128 GB/s); 400 Gb/s NICs
    "mi300x": GpuKind("MI300X", 192.0, 5300.0, 1307.4, 2614.9, 448.0, 50.0, "AMD Instinct MI300X datasheet"),
    # Huawei Ascend 910B (Atlas 800T A2 server): 64 GB HBM2e at 1.6 TB/s, 313 TFLOPS FP16 dense (the
    # 910B3 bin), no FP8; HCCS 392 GB/s bidirectional in the node; 200 Gb/s RoCE per NPU. Huawei
    # publishes no full datasheet: these are public figures of the 910B3, assumed; override them
    "ascend-910b": GpuKind(
        "Ascend 910B", 64.0, 1600.0, 313.0, 313.0, 196.0, 25.0, "public figures of the 910B3 (assumed)"
    ),
}
DEFAULT_GPU = "h100"

# flag -> GpuKind field each override replaces (the flags' names in the CLI)
OVERRIDES = {
    "gpu_memory_gb": "memory_gb",
    "gpu_hbm_gb_s": "hbm_gb_s",
    "gpu_tflops": "tflops",  # both peaks: the user's measured peak for their weights' type
    "scale_up_gb_s": "scale_up_gb_s",
    "scale_out_gb_s": "scale_out_gb_s",
}
MAX_RATE = 1e9  # GB, GB/s or TFLOP/s: past any machine, still a finite time


def gpu_kind(name: str | None, **overrides: float | None) -> GpuKind:
    """The preset `name` (case and `_`/`-` insensitive; `h100` when None) with the overrides that
    are given (keys of `OVERRIDES`), or one line naming the known kinds or the bad value."""
    key = (name or DEFAULT_GPU).strip().lower().replace("_", "-")
    if key not in GPUS:
        raise ComoeError(f"--gpu: unknown GPU {name!r} (known: {', '.join(GPUS)})")
    kind = GPUS[key]
    changes: dict[str, Any] = {}
    for flag, value in overrides.items():
        if flag not in OVERRIDES:
            raise ValueError(f"unknown GPU override {flag}")
        if value is None:
            continue
        if not (math.isfinite(value) and 0 < value <= MAX_RATE):
            raise ComoeError(f"--{flag.replace('_', '-')} must be in (0, {MAX_RATE:g}], got {value:g}")
        field = OVERRIDES[flag]
        if field == "tflops":
            changes |= {"bf16_tflops": value, "fp8_tflops": value}
        else:
            changes[field] = value
    if not changes:
        return kind
    return dataclasses.replace(kind, name=f"{kind.name} (overridden)", **changes)
