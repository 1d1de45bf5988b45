"""The instance a verb runs on: an instance file, or serving GPUs built from `--counts DUMP
--gpus G` (comoe_opt/serving.py); and the checks of sizes and output paths made before any work."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from comoe_opt.errors import ComoeError
from comoe_opt.files import writable_folder
from comoe_opt.gpus import OVERRIDES, GpuKind, gpu_kind
from comoe_opt.instance import Instance, load_instance
from comoe_opt.serving import ServingSetup, check_memory, check_serving_slots, counts_instance

SERVING_FLAGS = ("gpus", "slots", "model", "expert_mb", "gpu", *OVERRIDES)


def setup_of(args: argparse.Namespace) -> ServingSetup:
    redundant = getattr(args, "redundant", None)
    return ServingSetup(
        gpus=args.gpus,
        nodes=args.nodes,
        slots=args.slots,
        redundant=redundant if isinstance(redundant, int) else None,
        model=args.model,
        expert_mb=args.expert_mb,
        gpu=gpu_of(args),
    )


def gpu_of(args: argparse.Namespace) -> GpuKind:
    """`--gpu` (H100 when not given) with the overrides given."""
    return gpu_kind(getattr(args, "gpu", None), **{flag: getattr(args, flag, None) for flag in OVERRIDES})


def instance_and_steps(
    args: argparse.Namespace, redundant: Sequence[int] = ()
) -> tuple[Instance, np.ndarray | None]:
    """(the instance, the dump's steps at its layers when the instance was built from the dump)."""
    if args.instance is None:
        if args.counts is None or args.gpus is None:
            raise ComoeError(
                "give an instance file, or --counts DUMP with --gpus G for serving GPUs (see --help)"
            )
        return counts_instance(args.counts, setup_of(args), redundant)
    given = [f"--{name.replace('_', '-')}" for name in SERVING_FLAGS if getattr(args, name, None) is not None]
    if given:
        raise ComoeError(f"{', '.join(given)}: for --counts without an instance file; the instance sets them")
    return load_instance(args.instance), None


def check_redundant(
    instance: Instance, redundant: Sequence[int], built: bool, sized: bool, gpu: GpuKind
) -> None:
    """Every point of a `--redundant` sweep placeable, and (for serving GPUs of known expert size)
    within a GPU's memory: refused in one line before any point runs."""
    model, gpus = instance.model, instance.hardware.chiplets
    for extra in redundant:
        slots = model.experts_per_layer + extra
        check_serving_slots(slots, model.experts_per_layer, gpus, f"--redundant {extra}")
        if built and sized:
            check_memory(slots, gpus, model.layers, model.page_gb, f"--redundant {extra}", gpu)


def ready_output(path: Path | None, flag: str) -> None:
    """An output file's folder exists (created when missing) and takes files; the file is not a
    folder: checked before any work, so a long run does not end in a failed write."""
    if path is None:
        return
    if path.is_dir():
        raise ComoeError(f"{flag} {path}: is a folder, not a file")
    writable_folder(path.parent, flag)


FIGURE_FORMATS = ("png", "pdf", "svg")  # what the figures are written as (matplotlib, Agg backend)


def ready_figure(path: Path | None, flag: str) -> None:
    """`ready_output` for a figure, whose suffix must name a format it can be written in."""
    if path is None:
        return
    suffix = path.suffix.lower().lstrip(".")
    if suffix not in FIGURE_FORMATS:
        raise ComoeError(
            f"{flag} {path}: a figure is written as {', '.join('.' + f for f in FIGURE_FORMATS)}"
        )
    ready_output(path, flag)
