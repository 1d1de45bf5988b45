"""The trace and micro-batches an instance describes, or of a trace file given for it.

Layer ids: an instance's layers carry model layer ids (`model.layer_ids`, or
`first_moe_layer` on). A trace file may log any subset of a model's layers
(loggers often sample a few); an instance that names no ids takes the trace's,
and `load_trace` returns the instance with them, so exports and load-count
dumps address the right model layers.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from comoe_opt.errors import InputError
from comoe_opt.instance import CountsTrace, FileTrace, Instance, SyntheticTrace, check_layer_ids
from comoe_opt.trace.batching import MicroBatches, make_batches, step_counts
from comoe_opt.trace.counts import read_step_counts
from comoe_opt.trace.from_counts import tokens_of_counts
from comoe_opt.trace.io import read_trace
from comoe_opt.trace.model import Trace
from comoe_opt.trace.synthetic import generate


def load_trace(instance: Instance, path: str | Path | None = None) -> tuple[Instance, Trace]:
    """The instance's per-token trace (generated, or read from its file or from `path`; a load
    dump's steps replayed as tokens), checked against its model; the instance comes back with the
    trace's layer ids if it named none."""
    spec = instance.trace
    if path is None and isinstance(spec, SyntheticTrace):
        return instance, generate(instance.model, spec)
    if path is None and isinstance(spec, CountsTrace):
        counts = instance_step_counts(instance)
        model = instance.model
        topk = tokens_of_counts(counts, spec.tokens_per_batch, model.top_k)
        layer_ids = np.asarray(model.moe_layer_ids, dtype=np.int64)
        return instance, Trace(topk=topk, num_experts=model.experts_per_layer, layer_ids=layer_ids)
    path = Path(path) if path is not None else instance.resolve(spec.path)  # type: ignore[union-attr]
    model = instance.model
    trace = read_trace(path, num_experts=model.experts_per_layer)
    if not isinstance(trace, Trace):
        raise InputError(
            path, "topk", "the instance needs a per-token trace, this file holds aggregates only"
        )
    if trace.layers != model.layers:
        raise InputError(path, "topk", f"has {trace.layers} layers, the instance's model {model.layers}")
    if trace.top_k != model.top_k:
        raise InputError(
            path, "topk", f"has top-{trace.top_k} routing, the instance's model top-{model.top_k}"
        )
    return with_trace_layer_ids(instance, trace, path), trace


def with_trace_layer_ids(instance: Instance, trace: Trace, path: str | Path | None) -> Instance:
    """The instance whose layers carry the trace's layer ids.

    A trace numbered 0..L-1 (MoE ordinals) fits any instance. Otherwise its ids
    are the model layers it logged: an instance that names ids must name the
    same ones; one that names none takes them.
    """
    ids = [int(x) for x in trace.layer_ids]
    model = instance.model
    if ids == list(range(trace.layers)) or ids == model.moe_layer_ids:
        return instance
    if model.names_layer_ids:
        raise InputError(
            path,
            "layers",
            f"the trace logs model layers {_id_list(ids)}, the instance's layers are"
            f" {_id_list(model.moe_layer_ids)}"
            " (model.layer_ids / model.first_moe_layer; leave both unset to take the trace's)",
        )
    resolved = dataclasses.replace(model, layer_ids=tuple(ids))
    check_layer_ids(resolved, f"{path} (its layer ids)")
    return dataclasses.replace(instance, model=resolved)


def _id_list(ids: list[int]) -> str:
    """Ids as written in a message: a range when consecutive, else the list (shortened)."""
    if len(ids) > 2 and ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}..{ids[-1]}"
    return str(ids) if len(ids) <= 12 else f"[{', '.join(map(str, ids[:10]))}, ... {ids[-1]}] ({len(ids)})"


def instance_step_counts(instance: Instance) -> np.ndarray:
    """Per-step expert counts [steps, layers, experts] of the instance's trace: a load dump's as
    recorded (at most `micro_batches` steps), any other trace's micro-batches counted."""
    spec = instance.trace
    if not isinstance(spec, CountsTrace):
        return step_counts(instance_batches(instance))
    model = instance.model
    counts = read_step_counts(
        instance.resolve(spec.path),
        model.layers,
        model.experts_per_layer,
        model_layer_ids=model.moe_layer_ids,
        model_layers=model.hidden_layers,
    )
    return counts[: spec.micro_batches] if spec.micro_batches else counts


def instance_trace(instance: Instance) -> Trace:
    """Generate (synthetic) or read (file) the instance's per-token trace."""
    return load_trace(instance)[1]


def file_batches(instance: Instance, path: str | Path) -> MicroBatches:
    """Micro-batches of any per-token trace file, batched as the instance batches its trace; its
    own layers, experts and top-k (the fast loop's gap needs the routing only)."""
    trace = read_trace(path)
    if not isinstance(trace, Trace):
        raise InputError(path, "topk", "needs per-token routing; this file holds aggregates only")
    return instance_batches(instance, trace)


def load_batches(instance: Instance, path: str | Path | None = None) -> tuple[Instance, MicroBatches]:
    """`load_trace`, then its micro-batches."""
    instance, trace = load_trace(instance, path)
    return instance, instance_batches(instance, trace)


def instance_batches(instance: Instance, trace: Trace | None = None) -> MicroBatches:
    """The instance's micro-batches: a file trace as the instance's `[trace]` batches it (decode
    steps by default, at most `micro_batches`), any other as decode steps."""
    trace = trace if trace is not None else instance_trace(instance)
    spec = instance.trace
    if isinstance(spec, FileTrace):
        return make_batches(trace, spec.tokens_per_batch, spec.batching, spec.micro_batches)
    if isinstance(spec, CountsTrace):  # a dump's steps, each its `tokens_per_batch` tokens in order
        return make_batches(trace, spec.tokens_per_batch, "token-order")
    if trace.meta.get("generator") == "zipf-markov":  # the instance's own generated trace
        # without requests its decode steps are consecutive tokens; with them, as `batching` says
        return make_batches(trace, spec.tokens_per_batch, spec.batching, spec.micro_batches)
    # a file given to a synthetic instance runs as decode steps of its sequences
    return make_batches(trace, spec.tokens_per_batch, "decode")


def batched_part(trace: Trace, batches: MicroBatches) -> Trace:
    """The trace's tokens that `batches` hold, in trace order (a generated trace with requests has a
    tail its batching drops; statistics describe what runs)."""
    used = np.sort(batches.token_index.ravel())
    if used.size == trace.tokens:
        return trace
    part = (None if value is None else value[used] for value in (trace.seq_id, trace.pos))
    seq_id, pos = part
    return Trace(
        topk=trace.topk[used],
        num_experts=trace.num_experts,
        seq_id=seq_id,
        pos=pos,
        layer_ids=trace.layer_ids,
    )
