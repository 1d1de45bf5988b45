"""Hardware rates turned into the times and page counts the loops use (formulations/latency.md).

`Costs.of(model, hardware)` is computed once per instance (`Instance.costs`) and
checked there: every derived time must be finite and within `TIME_RANGE_MS`
(or exactly 0), every page count within `MAX_PAGES`, or the instance is refused
naming the key that made it so. Values that pass each key's own range can still
combine into nonsense (a 1e308 GB page over a 1e-308 GB/s link); the solvers would
meet that as an infinite coefficient.

This module reads the instance's model and hardware through their attribute
names only, so that `instance.py` can validate with it without an import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from comoe_opt.errors import InputError

# A derived time outside this range (other than 0) is a typo, not a machine: 1e-12 ms is a
# femtosecond, 1e12 ms 30 years; solvers also lose precision on coefficients spanning more.
TIME_RANGE_MS = (1e-12, 1e12)
TICK_S = 1e-9  # the fast loop's time quantum (s): its flows take integer costs, every time in ticks
MAX_PAGES = 2**31  # pages of one device's memory or buffer: far past any memory, still exact in int64
# bytes per element of the combine (the experts' outputs sent back): BF16, as DeepEP's combine and
# the engines' all-to-all send them whatever the dispatch's type (DeepEP README: FP8 dispatch,
# BF16 combine)
COMBINE_BYTES = 2.0
# steps between an engine's re-plans, where the user gives none: vLLM's default EPLB step interval
# (`eplb_step_interval`, vLLM's EPLB config)
REPLAN_EVERY = 3000


@dataclass(frozen=True, eq=False)
class Costs:
    """Times (ms) and page counts derived from the instance's rates; arrays are per device [C]."""

    page_load_ms: float  # one on-demand page over the shared die-to-die link
    read_ms: np.ndarray  # one page read at each device's local bandwidth
    flop_ms: np.ndarray  # one token through one expert at each device's peak compute
    hops: np.ndarray  # NoP hops to each device
    hop_ms: np.ndarray  # dispatch latency to each device: hops x per-hop latency
    token_link_ms: float  # one token activation over the die-to-die link
    copy_intra_ms: float  # copy_topology = "devices": one page from a device of the same node
    copy_inter_ms: float  # ... from another node or host memory
    replan_copy_ms: float  # one re-plan copy as the slow loop prices it (`replan_copy_ms`)
    capacity_pages: np.ndarray  # resident-page slots of each device
    buffer_pages: np.ndarray  # prefetch-buffer pages of each device

    @property
    def nop_ms_per_token(self) -> np.ndarray:
        """Link time one token occupies to device c and back: 2 · hops · token time."""
        return 2.0 * self.hops * self.token_link_ms

    @classmethod
    def of(cls, model: Any, hardware: Any, source: str | Path | None = None) -> Costs:
        """The costs of a `ModelShape` and a `Hardware`; `InputError` naming the key when a derived
        value is out of range."""
        page_gb, hw = np.float64(model.page_gb), hardware  # numpy: overflow gives inf, not an exception
        with np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore"):
            costs = cls._derive(model, hw, page_gb)
        costs.check(source)
        return costs

    @classmethod
    def _derive(cls, model: Any, hw: Any, page_gb: float) -> Costs:
        return cls(
            page_load_ms=page_gb / hw.d2d_bandwidth_gb_s * 1e3,
            read_ms=page_gb / _per_device(hw.local_bandwidth_gb_s) * 1e3,
            flop_ms=model.gflop_per_token / (_per_device(hw.peak_tflops) * 1e3) * 1e3,
            hops=_per_device(hw.nop_hops),
            hop_ms=_per_device(hw.nop_hops) * hw.hop_latency_ns * 1e-6,
            token_link_ms=np.float64(model.token_bytes) / (hw.d2d_bandwidth_gb_s * 1e9) * 1e3,
            copy_intra_ms=page_gb / hw.copy_intra_node_gb_s * 1e3,
            copy_inter_ms=page_gb / hw.copy_inter_node_gb_s * 1e3,
            replan_copy_ms=replan_copy_ms(hw, page_gb),
            capacity_pages=pages(hw.capacity_gb, page_gb),
            buffer_pages=pages(hw.prefetch_buffer_gb, page_gb),
        )

    def check(self, source: str | Path | None) -> None:
        """Refuse derived values past their range, naming the keys they come from."""
        times = (
            (self.page_load_ms, "model.page_gb / hardware.d2d_bandwidth_gb_s", "one page load"),
            (self.read_ms, "model.page_gb / hardware.local_bandwidth_gb_s", "one page read"),
            (self.flop_ms, "model.expert_gflop_per_token / hardware.peak_tflops", "one token's expert work"),
            (self.hop_ms, "hardware.nop_hops x hardware.hop_latency_ns", "dispatch latency"),
            (self.token_link_ms, "model.hidden_size / hardware.d2d_bandwidth_gb_s", "one token's transfer"),
            (self.copy_intra_ms, "model.page_gb / hardware.copy_intra_node_gb_s", "one page copy"),
            (self.copy_inter_ms, "model.page_gb / hardware.copy_inter_node_gb_s", "one page copy"),
        )
        lo, hi = TIME_RANGE_MS
        for value, keys, what in times:
            arr = np.asarray(value, dtype=np.float64)
            bad = ~np.isfinite(arr) | (arr > hi) | ((arr > 0) & (arr < lo))
            if bad.any():
                worst = float(arr[bad].flat[0])
                raise InputError(
                    source, keys, f"gives {what} of {worst:.3g} ms, outside {lo:g}..{hi:g} ms (or 0)"
                )
        for value, key in ((self.capacity_pages, "capacity_gb"), (self.buffer_pages, "prefetch_buffer_gb")):
            if (value > MAX_PAGES).any() or (value < 0).any():
                raise InputError(
                    source,
                    f"hardware.{key} / model.page_gb",
                    f"gives {int(value.max()):,} pages per device, more than {MAX_PAGES:,}",
                )


def replan_copy_ms(hw: Any, page_gb: float) -> float:
    """What one re-plan copy costs, on the link the evaluator moves it over: the shared die-to-die
    link (`copy_topology = "chiplet"`), or the receiving device's own link (`"devices"`): the
    intra-node rate when every device is in one node, else the inter-node rate, the slower link a
    copy may need (the slow loop prices every copy alike; the evaluator picks per copy)."""
    if hw.copy_topology != "devices":
        return float(page_gb / hw.d2d_bandwidth_gb_s * 1e3)
    rate = hw.copy_intra_node_gb_s if hw.nodes == 1 else hw.copy_inter_node_gb_s
    return float(page_gb / rate * 1e3)


def pages(gb: Any, page_gb: float) -> np.ndarray:
    """Whole pages (int64) that fit in `gb` GB, per device or scalar; huge ratios saturate above
    `MAX_PAGES` (so that the check can name them) instead of overflowing."""
    ratio = np.floor(np.asarray(gb, dtype=np.float64) / page_gb + 1e-9)
    return np.minimum(np.nan_to_num(ratio, nan=0.0, posinf=2.0 * MAX_PAGES), 2.0 * MAX_PAGES).astype(np.int64)


def _per_device(value: Any) -> np.ndarray:
    return np.asarray(value, dtype=np.float64)


@dataclass(frozen=True, eq=False)
class LayerTime:
    """The MoE layer's modelled time on serving devices (formulations/serving-time.md).

    Per step and device g, with A_g the expert slots that take at least one token (whose weights
    the grouped GEMM reads) and T_g the token selections it serves:

        t_g = max(A_g · read_ms, T_g · flop_ms) + T_g · link_ms

    the grouped GEMM bound by its weight reads or by its FLOPs (a roofline: the two overlap), then
    the tokens' dispatch and combine over the links into g. The layer takes the slowest device's
    time: every device waits for the all-to-all's last token."""

    read_ms: np.ndarray  # [C] one expert slot's weights read from HBM (page / local bandwidth)
    flop_ms: np.ndarray  # [C] one token through one expert at the device's peak
    link_ms: np.ndarray  # [C] one token's dispatch and combine into the device
    replan_copy_ms: float  # one expert copied by a re-plan, over the link it takes

    @classmethod
    def of(cls, model: Any, hardware: Any, costs: Costs) -> LayerTime:
        """The layer-time rates of an instance's model and hardware (its `Costs` already checked)."""
        return cls(
            read_ms=np.broadcast_to(costs.read_ms, (hardware.chiplets,)).astype(np.float64),
            flop_ms=np.broadcast_to(costs.flop_ms, (hardware.chiplets,)).astype(np.float64),
            link_ms=token_link_in_ms(model, hardware, costs),
            replan_copy_ms=costs.replan_copy_ms,
        )

    def device_ms(self, tokens: np.ndarray, active: np.ndarray) -> np.ndarray:
        """[..., C] each device's time from its tokens and active slots [..., C]."""
        return device_time(tokens, active, self.read_ms, self.flop_ms, self.link_ms)

    def layer_ms(self, tokens: np.ndarray, active: np.ndarray) -> np.ndarray:
        """[...] the layer's time: the slowest device's."""
        return self.device_ms(tokens, active).max(axis=-1)

    def uniform(self) -> tuple[float, float, float] | None:
        """(read_ms, flop_ms, link_ms) when every device has the same rates, else None."""
        rates = (self.read_ms, self.flop_ms, self.link_ms)
        if any(np.ptp(np.asarray(r, dtype=np.float64)) > 0 for r in rates):
            return None
        return tuple(float(np.asarray(r).flat[0]) for r in rates)  # type: ignore[return-value]

    @classmethod
    def of_gpus(cls, read_ms: float, flop_ms: float, link_ms: float, gpus: int) -> LayerTime:
        """Alike GPUs' rates (an engine's EP group), no re-plan copy priced."""
        return cls(np.full(gpus, read_ms), np.full(gpus, flop_ms), np.full(gpus, link_ms), 0.0)


def device_time(tokens: Any, active: Any, read: Any, flop: Any, link: Any) -> Any:
    """A device's time in a step, t = max(A · read, T · flop) + T · link, for `tokens` T and
    active slots A (LayerTime's rule; the drop-in's search by steps scores swaps with it)."""
    return np.maximum(active * read, tokens * flop) + tokens * link


def token_link_in_ms(model: Any, hardware: Any, costs: Costs) -> np.ndarray:
    """[C] one token selection's dispatch (activation bytes) and combine (`COMBINE_BYTES` per
    element) into a device. Serving GPUs (`copy_topology = "devices"`): of the tokens a GPU takes,
    the senders spread evenly over the G GPUs, (n − 1)/G come over its node's fabric and (G − n)/G
    over the network (n GPUs a node; its own are local), both links at once, so the slower share
    sets the time. The chiplet accelerator: its NoP time to the device and back."""
    if hardware.copy_topology != "devices":
        return np.broadcast_to(costs.nop_ms_per_token, (hardware.chiplets,)).astype(np.float64)
    gpus = hardware.chiplets
    per_node = gpus // hardware.nodes
    gb = model.hidden_size * (model.bytes_per_element + COMBINE_BYTES) / 1e9
    intra = (per_node - 1) / gpus * gb / hardware.copy_intra_node_gb_s * 1e3
    inter = (gpus - per_node) / gpus * gb / hardware.copy_inter_node_gb_s * 1e3
    return np.full(gpus, max(intra, inter))
