"""An instance of serving GPUs from a load dump alone (`--counts DUMP --gpus G`).

A serving engineer has a recorder dump (SGLang's `[steps, layers, experts]` counts) and a GPU
count, not the chiplet accelerator's rates an instance file describes. This module builds the
instance they would have written: the model's shape from the dump (and `--model`'s preset, or
`--expert-mb`), the devices as serving GPUs one hop apart that copy experts over their intra-
and inter-node links, and the policy serving engines follow (every expert resident, token
counts balanced). `instance new --from-counts` writes the same table as TOML, each default with
its unit and source as a comment: `serving_table` is the one definition of both.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tomli_w

from comoe_opt.errors import ComoeError
from comoe_opt.gpus import DEFAULT_GPU, GPUS, GpuKind
from comoe_opt.instance import Instance, instance_from_table
from comoe_opt.presets import ModelPreset, preset
from comoe_opt.schema import plain_number

HOST_LINK_GB_S = 64.0  # PCIe Gen5 x16, one direction: loads from host memory
UNKNOWN_EXPERT_GB = 1.0  # without --model or --expert-mb: sizes are counted in experts
UNKNOWN_HIDDEN = 4096  # without --model: activation width (token traffic only; compare does not report it)
SCENARIOS = 8  # steps of each planning window the slow loop scores balance on (keeps the MILP small)
MAX_TOKENS = 2**20  # tokens per step the instance allows (instance.WHY_TOKENS); counts scale to it
REPLANS = 8  # the dump's steps are cut into this many re-plan windows


@dataclass(frozen=True)
class ServingSetup:
    """The command line's description of the deployment."""

    gpus: int
    nodes: int = 1
    slots: int | None = None  # per layer, over all GPUs
    redundant: int | None = None  # slots beyond one per expert
    model: str | None = None
    expert_mb: float | None = None
    gpu: GpuKind = GPUS[DEFAULT_GPU]  # `--gpu` and its overrides (comoe_opt/gpus.py)

    @property
    def preset(self) -> ModelPreset | None:
        return None if self.model is None else preset(self.model)


@dataclass(frozen=True)
class DumpShape:
    """What the dump says of the model: its MoE layers' rows and experts, steps, selections."""

    layer_ids: tuple[int, ...]  # rows of the dump that are the model's MoE layers
    rows: int  # the dump's layer rows (SGLang: one per model layer, dense ones included)
    experts: int
    steps: int
    selections_per_step: float  # mean over steps and layers of the experts' counts summed


def dump_shape(steps: np.ndarray, setup: ServingSetup) -> DumpShape:
    """The dump's MoE layers: the preset's (the dump holds every model layer, or only the MoE
    ones), or, without one, every row with any count (a dense layer's row is all zero)."""
    if steps.ndim != 3:
        raise ComoeError(f"--counts: need [steps, layers, experts] counts, got shape {list(steps.shape)}")
    count, rows, experts = steps.shape
    model = setup.preset
    if model is None:
        ids = tuple(int(i) for i in np.flatnonzero(steps.sum(axis=(0, 2)) > 0))
    elif experts != model.experts:
        raise ComoeError(
            f"--counts: the dump has {experts} experts per layer; {model.name} has {model.experts} experts"
        )
    elif rows == model.model_layers:
        ids = model.moe_layer_ids
    elif rows == len(model.moe_layer_ids):
        ids = tuple(range(rows))
    else:
        raise ComoeError(
            f"--counts: the dump has {rows} layer rows; {model.name} has {model.model_layers} layers"
            f" ({len(model.moe_layer_ids)} MoE)"
        )
    picked = steps[:, list(ids)]
    return DumpShape(ids, rows, experts, count, float(picked.sum(axis=2).mean()))


def slots_per_layer(setup: ServingSetup, experts: int, redundant: Sequence[int] = ()) -> tuple[int, str]:
    """(slots per layer, the flag that set them): `--slots`, or the experts plus `--redundant` (the
    smallest of a sweep's), or one per expert; a multiple of the GPUs, at most one replica of
    each expert per GPU."""
    if setup.slots is not None:
        slots, flag = setup.slots, f"--slots {setup.slots}"
    elif setup.redundant is not None or redundant:
        extra = setup.redundant if setup.redundant is not None else min(redundant)
        slots, flag = experts + extra, f"--redundant {extra}"
    else:  # the default the user did not write: name what they did write, and what to add
        slots, flag = (
            experts,
            f"--gpus {setup.gpus} (one slot per expert: {experts}; give --slots or --redundant)",
        )
    check_serving_slots(slots, experts, setup.gpus, flag)
    return slots, flag


def check_serving_slots(slots: int, experts: int, gpus: int, flag: str) -> None:
    """One line when `slots` per layer cannot be placed on `gpus` GPUs."""
    if slots < experts:
        raise ComoeError(f"{flag}: {slots} slots per layer cannot hold the {experts} experts once each")
    if slots > experts * gpus:
        raise ComoeError(
            f"{flag}: {slots:,} slots per layer exceed {gpus} GPUs x {experts} experts (one replica of"
            " each expert per GPU)"
        )
    if slots % gpus:
        raise ComoeError(f"{flag}: {slots} slots per layer must split evenly over {gpus} GPUs")


def check_memory(slots: int, gpus: int, layers: int, expert_gb: float, flag: str, gpu: GpuKind) -> None:
    """One line when the slots' experts do not fit in one `gpu`'s memory."""
    need = slots // gpus * layers * expert_gb
    if need > gpu.memory_gb:
        raise ComoeError(
            f"{flag}: {slots // gpus} slots per GPU x {layers} layers x {expert_gb:.4g} GB = {need:.1f} GB of"
            f" experts per GPU, more than one {gpu.name}'s {gpu.memory_gb:g} GB (--gpu, --gpu-memory-gb)"
        )


def serving_table(
    shape: DumpShape, setup: ServingSetup, dump: Path, redundant: Sequence[int] = (), home: Path | None = None
) -> tuple[dict[str, Any], dict[str, str]]:
    """(instance table, comment per dotted key): the instance of serving GPUs for the dump, its
    trace the dump itself (`trace.kind = "counts"`), named relative to the folder `home` the
    instance is written to (the dump's own folder when None)."""
    model = setup.preset
    if setup.nodes < 1 or setup.gpus % setup.nodes:
        raise ComoeError(f"--nodes {setup.nodes}: must divide --gpus {setup.gpus}")
    if setup.expert_mb is not None and not (np.isfinite(setup.expert_mb) and 0 < setup.expert_mb <= 1e6):
        raise ComoeError(f"--expert-mb must be in (0, 1000000] MB, got {plain_number(setup.expert_mb)}")
    slots, flag = slots_per_layer(setup, shape.experts, redundant)
    layers = len(shape.layer_ids)
    if layers == 0:
        raise ComoeError("--counts: every layer's counts are zero: no load to plan on")
    expert_gb, size_note = _expert_size(setup, model)
    if model is not None or setup.expert_mb is not None:
        check_memory(slots, setup.gpus, layers, expert_gb, flag, setup.gpu)
    top_k = model.top_k if model else 1
    per_gpu = slots // setup.gpus
    table: dict[str, Any] = {"name": model.name if model else dump.stem, "model": {}, "hardware": {}}
    notes: dict[str, str] = {}

    def put(key: str, value: Any, note: str) -> None:
        section, name = key.split(".")
        table.setdefault(section, {})[name] = value
        notes[key] = note

    put(
        "model.layers",
        layers,
        f"MoE layers: rows of {dump.name} with load" + (f" ({model.name})" if model else ""),
    )
    put("model.experts_per_layer", shape.experts, "routed experts per layer: the dump's last axis")
    put(
        "model.top_k",
        top_k,
        f"{model.name} num_experts_per_tok"
        if model
        else "unknown from counts alone: each selection counted as a token",
    )
    put("model.page_gb", expert_gb, size_note)
    put(
        "model.hidden_size",
        model.hidden_size if model else UNKNOWN_HIDDEN,
        f"elements; {model.name} hidden_size"
        if model
        else "elements; assumed (token traffic only, not reported by compare)",
    )
    if model is not None:
        put(
            "model.expert_gflop_per_token",
            model.expert_gflop_per_token,
            f"GFLOP; 2 x 3 x hidden {model.hidden_size} x intermediate {model.expert_intermediate_size}"
            " (one token through one expert's three projections)",
        )
    put(
        "model.bytes_per_element",
        model.activation_bytes if model else 2.0,
        "B per activation element" + (f" ({model.name} dispatch)" if model else "; bf16 assumed"),
    )
    put(
        "model.expert_groups",
        model.expert_groups if model else 1,
        f"{model.name} n_group (EPLB's hierarchical packing)" if model else "no group-limited routing known",
    )
    put(
        "model.first_moe_layer",
        shape.layer_ids[0],
        "model layer id of the first MoE layer (the dump's first row with load)",
    )
    put("model.model_layers", shape.rows, "decoder layers: the dump's layer rows")
    put("model.layer_ids", list(shape.layer_ids), "model layer id of each MoE layer: the dump's rows")
    put("hardware.chiplets", setup.gpus, "serving GPUs (--gpus)")
    put(
        "hardware.capacity_gb",
        per_gpu * layers * expert_gb * (1 + 1e-9),
        f"GB per GPU for experts: {per_gpu} slots x {layers} layers x page_gb ({slots} slots per layer)",
    )
    gpu, weight_bytes = setup.gpu, model.weight_bytes if model else 2.0
    put(
        "hardware.local_bandwidth_gb_s",
        gpu.hbm_gb_s,
        f"GB/s; {gpu.name} HBM ({gpu.source}): reads each active expert's weights (the time model)",
    )
    put(
        "hardware.peak_tflops",
        gpu.tflops_for(weight_bytes),
        f"TFLOP/s; {gpu.name} dense {'FP8' if weight_bytes <= 1 else 'BF16'} peak ({gpu.source})",
    )
    put(
        "hardware.d2d_bandwidth_gb_s",
        HOST_LINK_GB_S,
        "GB/s; PCIe Gen5 x16 from host memory (loads of non-resident experts; none, all are resident)",
    )
    put("hardware.nop_hops", 1, "hops; every GPU one hop from every token (the all-to-all): no GPU is nearer")
    put("hardware.hop_latency_ns", 0.0, "ns; the same for every placement, so not modelled")
    put("hardware.prefetch_buffer_gb", 0.0, "GB; engines do not prefetch experts")
    put("hardware.copy_topology", "devices", "each GPU receives re-plan copies over its own links")
    put(
        "hardware.copy_intra_node_gb_s",
        gpu.scale_up_gb_s,
        f"GB/s into a GPU from its node, per direction ({gpu.name} scale-up, {gpu.source})",
    )
    put(
        "hardware.copy_inter_node_gb_s",
        gpu.scale_out_gb_s,
        f"GB/s into a GPU from another node, per direction ({gpu.name} network card, {gpu.source})",
    )
    put(
        "hardware.devices_per_node",
        setup.gpus // setup.nodes,
        f"GPUs per node: --gpus / --nodes ({setup.nodes})",
    )
    put(
        "trace.kind",
        "counts",
        "the load dump is the trace: compare and solve plan from its counts; evaluate and gap replay"
        " each step as tokens_per_batch tokens (trace/from_counts.py)",
    )
    home = dump.resolve().parent if home is None else home.resolve()
    put("trace.path", os.path.relpath(dump.resolve(), home), "the load dump, relative to this file")
    put(
        "trace.tokens_per_batch",
        min(MAX_TOKENS, max(1, round(shape.selections_per_step / top_k))),
        "tokens per step: the dump's mean selections per step and layer / top_k",
    )
    window = max(2, shape.steps // REPLANS)
    put(
        "policy.window_batches",
        window,
        f"steps between re-plans: 1/{REPLANS} of the dump's {shape.steps} steps",
    )
    put("policy.replica_budget_pages", slots * layers, "expert slots over all GPUs and layers")
    put("policy.all_resident", True, "every expert keeps a replica (SGLang and vLLM require it)")
    put(
        "policy.layer_slots",
        per_gpu,
        "slots per layer on each GPU: SGLang, vLLM and TensorRT-LLM give every GPU the same in every layer",
    )
    sized = model is not None or setup.expert_mb is not None
    put(
        "policy.balance",
        "auto" if sized else "tokens",
        "CoMoE balances tokens or the experts' roofline work, chosen per call by a backtest on modelled"
        " time (planning/balance_backtest.py)"
        if sized
        else "CoMoE balances token counts per GPU, as the engines do (no expert size: no time to model)",
    )
    put(
        "policy.migration_weight",
        -1.0,
        "CoMoE's copy price, chosen per window by backtest on windows already served (planning/backtest.py)",
    )
    put(
        "policy.backtest_copy_share",
        0.0,
        "copies counted, not timed (a dump gives no copy link time): fewest copies within a standard error",
    )
    put(
        "policy.balance_scenarios",
        min(SCENARIOS, window),
        "steps per planning window scored for balance (small MILP)",
    )
    return table, notes


def _expert_size(setup: ServingSetup, model: ModelPreset | None) -> tuple[float, str]:
    """(GB per expert, its note): `--expert-mb`, the preset's, or 1 (sizes in experts)."""
    if setup.expert_mb is not None:
        return setup.expert_mb / 1000.0, "GB per expert (--expert-mb)"
    if model is not None:
        return model.expert_gb, (
            f"GB per expert: 3 x hidden {model.hidden_size} x intermediate {model.expert_intermediate_size}"
            f" x {model.weight_bytes:g} B ({model.name} config.json, comoe_opt/presets.py)"
        )
    return UNKNOWN_EXPERT_GB, "expert size unknown (give --model or --expert-mb): GB are counted in experts"


def read_dump(dump: Path) -> np.ndarray:
    """Every row of the dump, [steps, rows, experts] (recorder rows with no load dropped)."""
    from comoe_opt.trace.counts import read_step_counts

    return read_step_counts(dump)


def counts_instance(
    dump: Path, setup: ServingSetup, redundant: Sequence[int] = ()
) -> tuple[Instance, np.ndarray]:
    """(the serving instance, the dump's steps at its MoE layers [steps, layers, experts])."""
    steps = read_dump(dump)
    shape = dump_shape(steps, setup)
    table, _ = serving_table(shape, setup, dump, redundant)
    instance = instance_from_table(table, dump)
    return instance, steps[:, list(shape.layer_ids)]


def instance_toml(dump: Path, setup: ServingSetup, output: Path) -> str:
    """The serving instance as TOML for the file `output`, each key with its unit and source as a
    comment."""
    if setup.gpus is None:
        raise ComoeError("--gpus: needed with --from-counts (the expert-parallel GPUs to plan for)")
    table, notes = serving_table(dump_shape(read_dump(dump), setup), setup, dump, home=output.parent)
    instance_from_table(table, output)  # what is written loads
    lines = [
        f"# Serving GPUs for the load dump {dump.name}: written by `comoe-opt instance new --from-counts`.",
        "# Every value is a default chosen from the dump and the command line; its unit and source",
        "# follow it.",
        tomli_w.dumps({"name": table["name"]}).strip(),
    ]
    for section in ("model", "hardware", "trace", "policy"):
        lines += ["", f"[{section}]"]
        for key, value in table[section].items():
            text = tomli_w.dumps({key: value}).strip()
            if isinstance(value, list):  # on one line, its comment beside it
                text = f"{key} = [{', '.join(str(v) for v in value)}]"
            lines.append(f"{text}  # {notes[f'{section}.{key}']}")
    return "\n".join(lines) + "\n"
