"""The balancers serving engines ship today, ported from their published sources.

Each port is a plain function in EPLB's style, `(weight_or_steps, num_replicas, num_groups,
num_nodes, num_gpus, ...) -> (phy2log, log2phy, logcnt)` (`ENGINE_BALANCERS`), under a name that
says whose it is (`ENGINES`, the one list of them: the slow loop's heuristics of the same names
(residency/heuristics/engines.py), the evaluator's strategies, `compare`'s peers and the CLI's
choices all read it):

* `sglang-vec`, `sglang-vec-hier` — SGLang's `deepseek_vec` and `deepseek_vec_hierarchical`, on the
  window's per-step counts (sglang_vec.py);
* `vllm-default` — vLLM's default policy: DeepSeek's EPLB, keeping experts that stay on a GPU in
  their slots (vllm_default.py);
* `ascend-swift` — vLLM-Ascend's SwiftBalancer, which re-deals the redundant slots of the map in
  service and swaps experts between GPUs (ascend_swift.py);
* `ascend-flashlb` — vLLM-Ascend's FlashLB, a tree search over replica numbers on stages of
  per-step counts with risk-aware placement (ascend_flashlb.py).

As upstream, all plan every layer on the same slots per device, may put two replicas of one
expert on one device (SGLang, vLLM), and keep no leases; the incremental planners (vLLM,
vLLM-Ascend) start from the map in service.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from comoe_opt.balancers.engines.ascend_flashlb import ascend_flashlb
from comoe_opt.balancers.engines.ascend_swift import ascend_swift
from comoe_opt.balancers.engines.sglang_vec import sglang_vec, sglang_vec_hierarchical
from comoe_opt.balancers.engines.vllm_default import vllm_default

Maps = tuple[np.ndarray, np.ndarray, np.ndarray]


@dataclass(frozen=True)
class Engine:
    """One engine's balancer: the port, and the words every table and `--help` use for it."""

    plan: Callable[..., Maps]
    label: str  # its row in tables
    whose: str  # whose policy, in descriptions
    description: str  # what it does, for `--method`'s help
    incremental: bool  # starts from the map in service
    per_step: bool  # plans on per-step counts, not the window's sum


# the one list of engines: strategies, `compare`'s peers and the CLI's choices read it
ENGINES: dict[str, Engine] = {
    "sglang-vec": Engine(
        sglang_vec,
        "SGLang deepseek_vec",
        "SGLang's deepseek_vec",
        "SGLang's deepseek_vec: replicas by the sum over steps of each step's peak",
        incremental=False,
        per_step=True,
    ),
    "sglang-vec-hier": Engine(
        sglang_vec_hierarchical,
        "SGLang deepseek_vec_hierarchical",
        "SGLang's deepseek_vec_hierarchical",
        "SGLang's deepseek_vec_hierarchical: groups onto nodes, then deepseek_vec",
        incremental=False,
        per_step=True,
    ),
    "vllm-default": Engine(
        vllm_default,
        "vLLM default",
        "vLLM's default policy",
        "vLLM's default policy: EPLB keeping experts in place within a GPU",
        incremental=True,
        per_step=False,
    ),
    "ascend-swift": Engine(
        ascend_swift,
        "vLLM-Ascend SwiftBalancer",
        "vLLM-Ascend's SwiftBalancer",
        "vLLM-Ascend's SwiftBalancer: redundant slots re-dealt, then swaps",
        incremental=True,
        per_step=False,
    ),
    "ascend-flashlb": Engine(
        ascend_flashlb,
        "vLLM-Ascend FlashLB",
        "vLLM-Ascend's FlashLB",
        "vLLM-Ascend's FlashLB: tree search over replicas on per-step stages",
        incremental=True,
        per_step=True,
    ),
}
ENGINE_BALANCERS: dict[str, Callable[..., Maps]] = {name: e.plan for name, e in ENGINES.items()}
INCREMENTAL = frozenset(name for name, e in ENGINES.items() if e.incremental)
PER_STEP = frozenset(name for name, e in ENGINES.items() if e.per_step)

__all__ = [
    "ENGINES",
    "ENGINE_BALANCERS",
    "Engine",
    "ascend_flashlb",
    "ascend_swift",
    "sglang_vec",
    "sglang_vec_hierarchical",
    "vllm_default",
]
