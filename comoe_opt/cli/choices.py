"""The names `--help` lists, with what each does: building the parser imports no solver
(`comoe-opt --help` must not wait for Pyomo and OR-Tools); heuristics come from their registry,
which loads none.

tests/test_cli.py checks that these names are exactly the library's.
"""

from __future__ import annotations

from comoe_opt.formats.engines import ENGINE_FORMATS
from comoe_opt.residency.heuristics import HEURISTICS

# the models; the heuristics declare themselves (residency/heuristics.py, imported without Pyomo)
MODEL_METHODS: dict[str, str] = {
    "milp": "replica-count MILP (HiGHS) from the best heuristic, placed and refined: proven bound",
    "exact": "milp, then the exact scenario model by row generation: a proven gap on the scenario objective",
    "full": "plain MILP over every (layer, expert, chiplet): exact, for small instances",
    "lp": "LP relaxation bound of the replica-count model only (no placement)",
}
RESIDENCY_METHODS: dict[str, str] = {
    **MODEL_METHODS,
    **{name: f"heuristic: {h.description}" for name, h in HEURISTICS.items()},
}

STRATEGIES: dict[str, str] = {
    "static": "planned once, no replicas, home routing (paper Table 4)",
    "hot": "hot-expert replication in spare pages, even split (paper Table 4)",
    "hot-evict": "hot replication that evicts the coldest experts for its replicas",
    "transition": "static placement + confidence-gated transition prefetch (paper Table 4)",
    "comoe": "CoMoE-Chip: both loops, prefetch, credits, min-cost-flow routing",
    "eplb": "EPLB re-planned every window, the engines' even split",
    "eplb-flow": "EPLB's placement with min-cost-flow routing (the strongest EPLB)",
    "oracle": "EPLB planned on each micro-batch itself, installed at once (the limit)",
    "comoe-exact": "CoMoE planning with the exact scenario model (time-limited)",
    "no-transitions": "Table 5 ablation: popularity prefetch instead of the transition graph",
    "no-replicas": "Table 5 ablation: one replica per expert",
    "no-congestion": "Table 5 ablation: even split instead of congestion-aware mapping",
    "no-credits": "Table 5 ablation: prefetch without credits or priorities",
    "single-scale": "Table 5 ablation: one time scale (re-plan 10x per window)",
    "sglang-vec": "SGLang's deepseek_vec re-planned every window, even split",
    "sglang-vec-flow": "SGLang's deepseek_vec with min-cost-flow routing",
    "sglang-vec-hier": "SGLang's deepseek_vec_hierarchical re-planned every window, even split",
    "sglang-vec-hier-flow": "SGLang's deepseek_vec_hierarchical with min-cost-flow routing",
    "vllm-default": "vLLM's default policy re-planned every window, even split",
    "vllm-default-flow": "vLLM's default policy with min-cost-flow routing",
    "ascend-swift": "vLLM-Ascend's SwiftBalancer re-planned every window, even split",
    "ascend-swift-flow": "vLLM-Ascend's SwiftBalancer with min-cost-flow routing",
    "ascend-flashlb": "vLLM-Ascend's FlashLB re-planned every window, even split",
    "ascend-flashlb-flow": "vLLM-Ascend's FlashLB with min-cost-flow routing",
}

ENGINES = tuple(ENGINE_FORMATS)  # `solve --export` formats: formats/engines.py's registry

# `comoe-opt compare` (comoe_opt.evaluator.compare.PEERS): EPLB, the engines' balancers, CoMoE
COMPARE_PEERS = (
    "eplb",
    "sglang-vec",
    "sglang-vec-hier",
    "vllm-default",
    "ascend-swift",
    "ascend-flashlb",
    "comoe",
)

DEFAULT_STRATEGIES = ("static", "hot", "transition", "comoe", "eplb")  # paper Table 4 and EPLB

DEFAULT_PAPER_INSTANCE = "instances/paper-baseline.toml"  # in a checkout; else the packaged copy
DEFAULT_REGIME_INSTANCE = "instances/paper-regime.toml"  # where most of the paper's claims hold

# `comoe-opt paper` defaults (comoe_opt.evaluator.paper.PaperSettings)
PAPER_TABLE5_BATCHES = 200
PAPER_SWEEP_BATCHES = 200


def described(names: dict[str, str]) -> str:
    """Help text listing every name with what it does."""
    return "; ".join(f"{name}: {text}" for name, text in names.items())
