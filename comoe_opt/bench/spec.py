"""One benchmark run, fully described: what to solve, how, and where its id comes from.

A `RunSpec` is immutable and self-contained (the instance is carried as its
canonical JSON table), so a run is a pure function of its spec and can be
shipped to any worker. Its id is a hash of its content, not of its position in
the suite: reordering or extending a suite keeps the ids of unchanged runs, so
`--resume` finds them.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

from comoe_opt.instance import Instance, instance_from_table

SPEC_VERSION = 1  # bump when the meaning of a spec field changes: every run id changes with it


@dataclass(frozen=True)
class RunSpec:
    suite: str
    group: str
    kind: str  # a key of RUN_KINDS
    method: str  # slow-loop method, or strategy for evaluation kinds
    seed: int  # written into the trace seed of synthetic instances
    window: int  # slow-loop window index (windows of policy.window_batches micro-batches)
    instance_name: str
    instance_json: str  # canonical JSON of the instance table, every default filled in
    instance_file: str  # the base instance file: relative trace paths resolve against it (not hashed)
    point: tuple[tuple[str, Any], ...] = ()  # the swept scalar values of this run, (dotted key, value)
    point_label: str = "-"  # the swept values for people, e.g. "trace.zipf_alpha=0.5"
    work_limits: bool = False  # planned on work limits, not policy.time_limit_s

    @functools.cached_property
    def run_id(self) -> str:  # cached: hashing the instance table is the costly part
        return run_id(self)

    def table(self) -> dict[str, Any]:
        return json.loads(self.instance_json)

    def instance(self) -> Instance:
        return instance_from_table(self.table(), self.instance_file)

    @property
    def time_limit_s(self) -> float:
        """The run's time limit: the policy's, or none (inf) on work limits."""
        return math.inf if self.work_limits else float(self.table()["policy"]["time_limit_s"])

    @property
    def mip_gap(self) -> float:
        return float(self.table()["policy"]["mip_gap"])


def canonical_json(value: Any) -> str:
    """Sorted, compact JSON: the same content gives the same text on every machine."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def run_id(spec: RunSpec) -> str:
    """16 hex digits of the SHA-256 of the spec's content (everything but the instance file's location)."""
    payload = {
        "v": SPEC_VERSION,
        "suite": spec.suite,
        "group": spec.group,
        "kind": spec.kind,
        "method": spec.method,
        "seed": spec.seed,
        "window": spec.window,
        "instance": json.loads(spec.instance_json),
    }
    if spec.work_limits:  # in the id only when set: runs stored before the key keep theirs
        payload["work_limits"] = True
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()[:16]
