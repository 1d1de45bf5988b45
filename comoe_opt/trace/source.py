"""The trace and micro-batches an instance describes."""

from __future__ import annotations

from pathlib import Path

from comoe_opt.errors import InputError
from comoe_opt.instance import FileTrace, Instance, ModelShape
from comoe_opt.trace.batching import MicroBatches, make_batches
from comoe_opt.trace.io import read_trace
from comoe_opt.trace.model import Trace
from comoe_opt.trace.synthetic import generate


def instance_trace(instance: Instance) -> Trace:
    """Generate (synthetic) or read (file) the instance's per-token trace."""
    spec = instance.trace
    if not isinstance(spec, FileTrace):
        return generate(instance.model, spec)
    path = instance.resolve(spec.path)
    trace = read_trace(path, num_experts=instance.model.experts_per_layer)
    if not isinstance(trace, Trace):
        raise InputError(
            path, "topk", "the instance needs a per-token trace, this file holds aggregates only"
        )
    model = instance.model
    if trace.layers != model.layers:
        raise InputError(path, "topk", f"has {trace.layers} layers, the instance's model {model.layers}")
    if trace.top_k != model.top_k:
        raise InputError(
            path, "topk", f"has top-{trace.top_k} routing, the instance's model top-{model.top_k}"
        )
    check_layer_numbering(trace, model, path)
    return trace


def check_layer_numbering(trace: Trace, model: ModelShape, path: str | Path | None) -> None:
    """A trace's layer ids are MoE ordinals (0..L-1) or the model's layer ids of its MoE layers
    (`model.first_moe_layer` on): anything else is another model's trace, or a missing setting."""
    ids = [int(x) for x in trace.layer_ids]
    if ids != list(range(trace.layers)) and ids != model.moe_layer_ids:
        raise InputError(
            path,
            "layers",
            f"the trace's layer ids are {ids[0]}..{ids[-1]}, the instance's MoE layers"
            f" {model.moe_layer_ids[0]}..{model.moe_layer_ids[-1]} (set model.first_moe_layer)",
        )


def instance_batches(instance: Instance, trace: Trace | None = None) -> MicroBatches:
    """The instance's micro-batches (decode steps by default for file traces)."""
    trace = trace if trace is not None else instance_trace(instance)
    spec = instance.trace
    if isinstance(spec, FileTrace):
        return make_batches(trace, spec.tokens_per_batch, spec.batching, spec.micro_batches)
    return make_batches(trace, spec.tokens_per_batch, "token-order")
