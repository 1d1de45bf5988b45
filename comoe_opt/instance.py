"""Instance files: model shape, hardware, trace source and policy knobs.

An instance is one TOML file with four tables, `[model]`, `[hardware]`,
`[trace]` and `[policy]`. It loads into frozen dataclasses; every field's unit
and meaning is in its `param` metadata (and in `docs/instances.md`, generated
from it). Anything wrong raises `InputError` naming the file and the key.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import tomli_w

from comoe_opt.costs import Costs, LayerTime, pages
from comoe_opt.errors import InputError
from comoe_opt.schema import build, param

# Why sizes have upper limits: every size below allocates arrays, so a slip of a digit would
# otherwise try to allocate terabytes or run for days before failing. Each limit is far beyond
# the largest real deployment (the reasons are printed in docs/instances.md).
WHY_LAYERS = "the largest open MoE models have under 100 layers (DeepSeek-V3: 61)"
WHY_EXPERTS = "the largest open MoE models route over at most a few hundred experts per layer"
WHY_TOP_K = "real routers pick 1-16 experts per token"
WHY_CHIPLETS = "the largest expert-parallel deployments use a few hundred devices"
WHY_TOKENS = "a micro-batch of 2^20 tokens is far past any accelerator's batch"
WHY_BATCHES = "caps what one run replays or plans on; split longer runs"
WHY_HARDWARE = "far past any real device or link: a slip of a digit is an error, not a result"
WHY_PRICE = "a weight beyond this makes every other term round off against it"
WHY_ENERGY = "far past any real memory, link or compute energy"
WHY_SEED = "seeds are 64-bit"
MAX_TRACE_ROUTES = 2**31  # micro_batches x tokens_per_batch x layers x top_k of a generated trace
MAX_PLACEMENT_CELLS = 2**26  # layers x experts x chiplets: the slow loop's per-cell arrays


@dataclass(frozen=True)
class ModelShape:
    """The MoE model: how many layers and experts, and how big they are."""

    layers: int = param("MoE layers", ge=1, le=1024, why=WHY_LAYERS)
    experts_per_layer: int = param("routed experts per MoE layer", ge=2, le=4096, why=WHY_EXPERTS)
    top_k: int = param("experts each token selects per layer", ge=1, le=64, why=WHY_TOP_K)
    page_gb: float = param("weights of one logical expert (one page)", "GB", gt=0, le=1e4, why=WHY_HARDWARE)
    hidden_size: int = param(
        "token activation width (for token traffic)", "elements", ge=1, le=2**20, why=WHY_HARDWARE
    )
    bytes_per_element: float = param("activation bytes per element", "B", gt=0, le=64, why=WHY_HARDWARE)
    expert_gflop_per_token: float = param(
        "expert FLOPs per token (0 = 2 FLOP per weight: 2 * page_gb / bytes_per_element)",
        "GFLOP",
        ge=0,
        default=0.0,
        le=1e6,
        why=WHY_HARDWARE,
    )
    expert_groups: int = param(
        "expert groups of group-limited routing (DeepSeek-V3: n_group = 8); EPLB's hierarchical "
        "mode packs whole groups onto nodes",
        ge=1,
        le=4096,
        why=WHY_EXPERTS,
        default=1,
    )

    first_moe_layer: int = param(
        "model layer id of the first MoE layer: the dense layers before it (DeepSeek-V3: "
        "first_k_dense_replace = 3); MoE layers are numbered on from it",
        ge=0,
        le=1024,
        default=0,
        why=WHY_LAYERS,
    )
    model_layers: int = param(
        "decoder layers of the whole model, dense ones included (DeepSeek-V3: num_hidden_layers = 61); "
        "0 = the instance's last layer id + 1. SGLang's expert maps and load dumps have one row per model "
        "layer",
        ge=0,
        le=2048,
        default=0,
        why=WHY_LAYERS,
    )

    layer_ids: tuple[int, ...] = param(
        "model layer id of each of the instance's layers, strictly increasing (a trace that logs a "
        "subset of the MoE layers, e.g. [0, 8, 12, 18, 23]); [] = first_moe_layer, first_moe_layer + 1, "
        "..., or the ids of the instance's trace file when first_moe_layer is 0",
        ge=0,
        le=2047,
        default=(),
        why=WHY_LAYERS,
    )

    @property
    def logical_experts(self) -> int:
        return self.layers * self.experts_per_layer

    @property
    def moe_layer_ids(self) -> list[int]:
        """The model layer id of each of the instance's (MoE) layers."""
        if self.layer_ids:
            return list(self.layer_ids)
        return list(range(self.first_moe_layer, self.first_moe_layer + self.layers))

    @property
    def names_layer_ids(self) -> bool:
        """Whether the instance fixes its layers' model ids (else a trace file's ids are taken)."""
        return bool(self.layer_ids) or self.first_moe_layer > 0

    @property
    def hidden_layers(self) -> int:
        """Decoder layers of the model, dense ones included."""
        return self.model_layers or self.moe_layer_ids[-1] + 1

    @property
    def model_moe_layers(self) -> int:
        """MoE layers of the whole model (every layer from `first_moe_layer` on), logged or not:
        the layer count of vLLM-Ascend's expert map, which numbers MoE layers from 0."""
        return self.hidden_layers - self.first_moe_layer

    @property
    def token_bytes(self) -> float:
        """Bytes of one token's activation vector."""
        return self.hidden_size * self.bytes_per_element

    @property
    def gflop_per_token(self) -> float:
        """Expert GFLOPs per token: given, or 2 FLOPs per weight of the page."""
        if self.expert_gflop_per_token > 0:
            return self.expert_gflop_per_token
        return 2.0 * self.page_gb / self.bytes_per_element


@dataclass(frozen=True)
class Hardware:
    """Expert chiplets (or expert-parallel devices) and their interconnect."""

    chiplets: int = param("expert chiplets (or expert-parallel devices)", ge=1, le=1024, why=WHY_CHIPLETS)
    capacity_gb: tuple[float, ...] = param(
        "local memory for resident expert pages, per chiplet",
        "GB",
        ge=0,
        per_chiplet=True,
        le=1e6,
        why=WHY_HARDWARE,
    )
    local_bandwidth_gb_s: tuple[float, ...] = param(
        "effective local memory bandwidth, per chiplet",
        "GB/s",
        gt=0,
        per_chiplet=True,
        le=1e7,
        why=WHY_HARDWARE,
    )
    peak_tflops: tuple[float, ...] = param(
        "peak dense compute, per chiplet", "TFLOP/s", gt=0, per_chiplet=True, le=1e7, why=WHY_HARDWARE
    )
    d2d_bandwidth_gb_s: float = param(
        "effective die-to-die bandwidth shared by weight loads", "GB/s", gt=0, le=1e7, why=WHY_HARDWARE
    )
    nop_hops: tuple[int, ...] = param(
        "network-on-package hops from the attention chiplet, per chiplet",
        "hops",
        ge=0,
        per_chiplet=True,
        le=1024,
        why=WHY_HARDWARE,
    )
    hop_latency_ns: float = param("latency of one NoP hop", "ns", ge=0, le=1e9, why=WHY_HARDWARE)
    prefetch_buffer_gb: tuple[float, ...] = param(
        "prefetch buffer (not counted as residency), per chiplet",
        "GB",
        ge=0,
        per_chiplet=True,
        le=1e6,
        why=WHY_HARDWARE,
    )
    copy_topology: Literal["chiplet", "devices"] = param(
        "how re-plan copies travel: chiplet = one shared die-to-die link (the paper); devices = each "
        "device receives over its own link, copies to different devices run in parallel",
        default="chiplet",
    )
    copy_intra_node_gb_s: float = param(
        "devices: copy bandwidth into a device from another in its node (NVLink-class; assumed)",
        "GB/s",
        gt=0,
        default=300.0,
        le=1e7,
        why=WHY_HARDWARE,
    )
    copy_inter_node_gb_s: float = param(
        "devices: copy bandwidth into a device from another node or host memory (InfiniBand-/PCIe-"
        "class, 400 Gb/s; assumed)",
        "GB/s",
        gt=0,
        default=40.0,
        le=1e7,
        why=WHY_HARDWARE,
    )
    devices_per_node: int = param(
        "expert-parallel devices per node (0 = all in one node); EPLB's hierarchical mode packs "
        "expert groups onto nodes",
        ge=0,
        le=1024,
        default=0,
        why=WHY_CHIPLETS,
    )

    @property
    def nodes(self) -> int:
        """Nodes of `devices_per_node` devices (1 when unset or when it does not divide the devices)."""
        per_node = self.devices_per_node or self.chiplets
        return self.chiplets // per_node if self.chiplets % per_node == 0 else 1


@dataclass(frozen=True)
class SyntheticTrace:
    """Zipf–Markov routing generator with phase drift (formulations/traces.md)."""

    kind: Literal["synthetic"] = param("trace source kind")
    zipf_alpha: float = param("Zipf exponent of expert popularity (router first choice)", ge=0, le=5)
    rho: float = param("probability a token follows its current expert's successors", ge=0, le=1)
    drift_every: int = param(
        "micro-batches between phase changes (hot set, successors)", ge=1, le=10**7, why=WHY_BATCHES
    )
    tokens_per_batch: int = param("tokens per micro-batch", "tokens", ge=1, le=2**20, why=WHY_TOKENS)
    micro_batches: int = param("micro-batches to generate", ge=1, le=10**6, why=WHY_BATCHES)
    seed: int = param(
        "random seed; the same seed gives the same trace bit for bit", ge=0, le=2**63 - 1, why=WHY_SEED
    )
    successor_weight: float = param(
        "share of an expert's successor distribution on its preferred successor",
        ge=0,
        le=1,
        default=0.75,
    )
    zipf_alpha_max: float = param(
        "0: every layer's rank-1 popularity is Zipf(zipf_alpha); else the layers' exponents are spread "
        "evenly over zipf_alpha..zipf_alpha_max, dealt to the layers in a seeded random order",
        ge=0,
        le=5,
        default=0.0,
    )
    lower_ranks_alpha: float = param(
        "-1: ranks 2..k are drawn like rank 1; else from Zipf(lower_ranks_alpha) over the layer's "
        "popularity order, without the successors (a router whose first choice is skewed and the rest "
        "near flat)",
        ge=-1,
        le=5,
        default=-1.0,
    )
    degenerate_layer: int = param(
        "-1: none; else this layer sends degenerate_share of its rank-1 choices to its most popular expert",
        ge=-1,
        le=1023,
        default=-1,
        why=WHY_LAYERS,
    )
    degenerate_share: float = param(
        "share of the degenerate layer's rank-1 choices on its one expert", ge=0, le=1, default=0.999
    )
    sequence_tokens: int = param(
        "0: tokens without requests; else mean tokens per request (lengths geometric, at least 1)",
        "tokens",
        ge=0,
        le=2**20,
        default=0,
        why=WHY_TOKENS,
    )
    topics: int = param(
        "request topics; each has its own popularity and successors (needs sequence_tokens > 0)",
        ge=1,
        le=4096,
        default=1,
        why="each topic holds its own successor matrices per layer",
    )
    topic_order: Literal["turns", "random"] = param(
        "turns: requests_per_topic requests of one topic, then the next, in turn; random: each request "
        "draws its topic",
        default="turns",
    )
    requests_per_topic: int = param(
        "consecutive requests of one topic (topic_order = turns)", ge=1, le=10**6, default=1, why=WHY_BATCHES
    )
    topic_shift: float = param(
        "share of a topic's popularity that is its own; the rest is the phase's common popularity",
        ge=0,
        le=1,
        default=1.0,
    )
    batching: Literal["decode", "token-order"] = param(
        "with requests: decode = continuous-batching steps of tokens_per_batch requests in flight; "
        "token-order = consecutive tokens, a prompt's tokens together (prefill)",
        default="decode",
    )

    def generated_tokens(self) -> int:
        """Tokens the generator draws: the steps' own, and for decode batching whole requests for
        about two mean lengths beyond them (trace/synthetic.py's `_requests` says why)."""
        extra = 1
        if self.sequence_tokens and self.batching == "decode":
            extra = int(self.sequence_tokens * (np.log(self.tokens_per_batch) + 2))
        return (self.micro_batches + extra) * self.tokens_per_batch


@dataclass(frozen=True)
class FileTrace:
    """A routing trace read from a file (npz or Parquet, see docs/trace-format.md)."""

    kind: Literal["file"] = param("trace source kind")
    path: str = param("trace file, relative to the instance file")
    tokens_per_batch: int = param(
        "tokens (decode: sequences in flight) per micro-batch", ge=1, le=2**20, why=WHY_TOKENS
    )
    batching: Literal["decode", "token-order"] = param(
        "decode: continuous-batching steps over sequences; token-order: consecutive tokens",
        default="decode",
    )
    micro_batches: int = param(
        "use at most this many micro-batches (0 = all)", ge=0, le=10**6, default=0, why=WHY_BATCHES
    )


@dataclass(frozen=True)
class CountsTrace:
    """An expert-load dump (per-step counts [steps, layers, experts]: SGLang's recorder, .npz,
    JSON; docs/trace-format.md) standing for the trace: `compare` and `solve` plan from its
    counts as they are; verbs that replay tokens (`evaluate`, `gap`) replay each step as
    `tokens_per_batch` tokens whose per-layer selections are the step's counts
    (trace/from_counts.py)."""

    kind: Literal["counts"] = param("trace source kind")
    path: str = param("load dump, relative to the instance file")
    tokens_per_batch: int = param(
        "tokens per step when a step is replayed as tokens", ge=1, le=2**20, why=WHY_TOKENS
    )
    micro_batches: int = param(
        "use at most this many steps (0 = all)", ge=0, le=10**6, default=0, why=WHY_BATCHES
    )


TraceSource = SyntheticTrace | FileTrace | CountsTrace
DUMPED = (FileTrace, CountsTrace)  # the trace kinds read from a file (`path`)


@dataclass(frozen=True)
class Policy:
    """Knobs of the slow loop, the fast loop and prefetch."""

    window_batches: int = param(
        "micro-batches per slow-loop window", ge=1, le=10**6, default=100, why=WHY_BATCHES
    )
    history_windows: int = param(
        "past windows the slow loop plans on (rolling horizon)", ge=1, le=10**4, default=1, why=WHY_BATCHES
    )
    transition_eps: float = param(
        "transition-graph smoothing ε added to every count", "count", gt=0, default=0.05, le=1
    )
    transition_top_s: int = param(
        "successors kept per transition-graph node", ge=1, le=4096, default=8, why=WHY_EXPERTS
    )
    theta_high: float = param(
        "prefetch the top successor when its probability is at least this", ge=0, le=1, default=0.5
    )
    entropy_high_bits: float = param(
        "... and the node's successor entropy is at most this", "bit", ge=0, default=2.5, le=64
    )
    theta_low: float = param(
        "middle band: top successor probability at least this (prefetch two candidates)",
        ge=0,
        le=1,
        default=0.2,
    )
    replica_budget_pages: int = param(
        "most resident pages over all chiplets (0 = total capacity)",
        "pages",
        ge=0,
        default=0,
        le=MAX_PLACEMENT_CELLS,
        why="a placement holds at most MAX_PLACEMENT_CELLS pages",
    )
    layer_slots: int = param(
        "most replicas of one layer a chiplet may hold (0 = any: the accelerator's layers share its"
        " memory; serving engines give every GPU the same slots in every layer)",
        "pages",
        ge=0,
        default=0,
        le=MAX_PLACEMENT_CELLS,
        why="a placement holds at most MAX_PLACEMENT_CELLS pages",
    )
    max_replicas: int = param(
        "most replicas of one logical expert (0 = one per chiplet)",
        ge=0,
        default=0,
        le=1024,
        why=WHY_CHIPLETS,
    )
    prefetch_exposed: float = param(
        "share of a prefetched page's load time still paid (bandwidth contention)", ge=0, le=1, default=0.2
    )
    migration_weight: float = param(
        "weight of page-copy time against per-batch latency in the slow-loop objective (-1 = chosen per "
        "window by a rolling-origin backtest on the windows already served, planning/backtest.py; "
        "the rolling horizon reports the choice)",
        ge=-1,
        default=1.0,
        le=1e6,
        why=WHY_PRICE,
    )
    replan_every: int = param(
        "steps a plan serves before the next re-plan: its copies' time is spread over them against the "
        "per-step balance (0 = the planning window's own steps; compare sets its --replan-every)",
        ge=0,
        default=0,
        le=10**9,
        why=WHY_BATCHES,
    )
    backtest_copy_share: float = param(
        "migration_weight = -1: share of a re-plan copy's link time (costs.replan_copy_ms) the backtest "
        "charges against held-out balance (1 = all of it, the planning objective at weight 1; 0 = copies "
        "counted, not timed: the backtest then keeps the fewest copies whose held-out balance is within "
        "one standard error of the best)",
        ge=0,
        le=1,
        default=1.0,
    )
    lease_windows: int = param(
        "windows a newly copied replica stays before it may be evicted (hysteresis)",
        ge=0,
        default=1,
        le=10**4,
        why=WHY_BATCHES,
    )
    all_resident: bool = param(
        "every logical expert keeps at least one replica (serving engines such as SGLang require it)",
        default=False,
    )
    balance: Literal["work", "tokens", "auto"] = param(
        "what the three loops balance: work = expert time (per balance scenario the roofline, max of the "
        "page read and the tokens' FLOPs, as the evaluator charges it; on the mean load their sum), the fast "
        "loop routing each expert's whole load to one replica; tokens = token counts, the engines' proxy; "
        "auto = the rolling horizon chooses work or tokens by a backtest on modelled time "
        "(planning/balance_backtest.py), tokens elsewhere",
        default="work",
    )
    split: Literal["best", "even"] = param(
        "the dispatch the slow loop plans for: best = the fast loop's best split (our flow, SGLang's lp); "
        "even = each expert's tokens shared evenly by its replicas, every busy replica reading its page "
        "(vLLM, SGLang's static and dynamic dispatch; residency/even_split.py)",
        default="best",
    )
    balance_scenarios: int = param(
        "micro-batches of the planning window kept as balance scenarios: the slow loop scores balance as "
        "each one's makespan under the best routing (0 = on the window's mean load)",
        ge=0,
        le=4096,
        default=0,
        why="each scenario adds a copy of the balance rows to the MILP; 4096 is far past where more help",
    )
    balance_scenario_model: Literal["steps", "smoothed"] = param(
        "where the balance scenarios come from: steps = the planning window's own micro-batches; smoothed = "
        "multinomial draws at each expert's share of its layer, shrunk toward the layer's mean by "
        "scenario_pseudo_steps (for sparse steps, where an expert sees under one selection per step)",
        default="steps",
    )
    scenario_pseudo_steps: float = param(
        "smoothed scenarios: pseudo-steps of the layer's mean added to each expert's count "
        "(-1 = chosen per call by a rolling-origin backtest on the history, stats/sparse.py)",
        "steps",
        ge=-1,
        le=1e6,
        default=-1.0,
    )
    search_moves: int = param(
        "local-search moves per layer that refine the slow loop's placement on the scenarios",
        ge=0,
        le=10**7,
        default=200,
        why="a search of more moves runs for hours; use the exact method instead",
    )
    anneal_proposals: int = param(
        "annealing proposals per layer after the local search, on the balance scenarios: they escape the "
        "local optima where the search stops (`milp` and `exact`; 0 = none)",
        ge=0,
        le=10**7,
        default=2000,
        why="each proposal scores a layer's scenarios once; 10^7 per layer runs for hours",
    )
    time_limit_s: float = param(
        "solver time limit", "s", gt=0, le=7 * 86400, default=10.0, why="one week: anything longer is a typo"
    )
    mip_gap: float = param("relative MIP gap at which a solve stops", ge=0, le=1, default=1e-3)


@dataclass(frozen=True)
class Runtime:
    """Constants of the analytic latency and energy model (formulations/latency.md)."""

    attention_ms: float = param(
        "attention chiplet time per layer and micro-batch (norm, projections, attention, gate); "
        "calibrated once on the static strategy",
        "ms",
        ge=0,
        default=0.6,
        le=1e6,
        why=WHY_HARDWARE,
    )
    route_ms: float = param(
        "top-k selection and directory lookup per layer", "ms", ge=0, default=0.01, le=1e6, why=WHY_HARDWARE
    )
    attention_share: float = param(
        "0, or the share of static's mean per-layer latency that is attention: the evaluator then "
        "sets attention_ms from a static replay of the same micro-batches before every run "
        "(calibration on static, for regime maps); attention_ms is ignored",
        ge=0,
        lt=0.95,
        default=0.0,
    )
    d2d_concurrency_derate: float = param(
        "share of die-to-die bandwidth lost when many page streams run at once", ge=0, lt=1, default=0.15
    )
    prefetch_credit_pages: int = param(
        "prefetch pages that may be in flight at once (bandwidth credits of the prefetch channel)",
        "pages",
        ge=0,
        le=10**6,
        default=4,
        why=WHY_BATCHES,
    )
    d2d_pj_per_bit: float = param(
        "die-to-die transfer energy (UCIe-class links)", "pJ/bit", ge=0, default=0.5, le=1e6, why=WHY_ENERGY
    )
    hbm_pj_per_bit: float = param(
        "local HBM read energy", "pJ/bit", ge=0, default=3.9, le=1e6, why=WHY_ENERGY
    )
    sram_pj_per_bit: float = param(
        "on-chip SRAM access energy (token buffers)", "pJ/bit", ge=0, default=0.1, le=1e6, why=WHY_ENERGY
    )
    pj_per_flop: float = param("expert compute energy", "pJ/FLOP", ge=0, default=0.4, le=1e6, why=WHY_ENERGY)


@dataclass(frozen=True)
class Instance:
    """Everything one run needs: model, hardware, trace source and policy."""

    name: str
    model: ModelShape
    hardware: Hardware
    trace: TraceSource
    policy: Policy
    runtime: Runtime = Runtime()
    source: Path | None = None

    def resolve(self, relative: str) -> Path:
        """A path from the instance file, resolved against the file's folder."""
        path = Path(relative)
        if path.is_absolute() or self.source is None:
            return path
        return (self.source.parent / path).resolve()

    def to_toml(self) -> str:
        return tomli_w.dumps(to_table(self))

    def pages(self, gb: Any) -> np.ndarray:
        """Whole pages (int64) that fit in `gb` GB, per chiplet or scalar."""
        return pages(gb, self.model.page_gb)

    @property
    def capacity_pages(self) -> np.ndarray:
        """[C] page slots of each chiplet's memory for resident experts."""
        return self.costs.capacity_pages

    @functools.cached_property
    def costs(self) -> Costs:
        """Times and page counts derived from the hardware rates (the one place they are derived)."""
        return Costs.of(self.model, self.hardware, self.source)

    @functools.cached_property
    def layer_time(self) -> LayerTime:
        """The MoE layer's modelled time per step from the same rates (costs.py `LayerTime`)."""
        return LayerTime.of(self.model, self.hardware, self.costs)


_SECTIONS = ("model", "hardware", "trace", "policy", "runtime")


def packaged_instance(name: str) -> Path:
    """An instance file shipped with the package (`comoe_opt/instances/`): works after
    `pip install`, without a checkout."""
    from importlib.resources import files

    return Path(str(files("comoe_opt") / "instances" / name))


def load_instance(path: str | Path) -> Instance:
    """Read and validate an instance TOML file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(path, None, "no such instance file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(path, None, f"cannot read: {exc}") from None
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(path, None, f"not valid TOML: {exc}") from None
    return instance_from_table(table, path)


def instance_from_table(table: dict[str, Any], source: str | Path) -> Instance:
    """Validate a parsed TOML document into an `Instance`."""
    allowed = {"name", *_SECTIONS}
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise InputError(source, unknown[0], f"unknown key (valid keys: {', '.join(sorted(allowed))})")
    for section in ("model", "hardware", "trace"):
        if section not in table:
            raise InputError(source, f"[{section}]", "missing required table")
    name = table.get("name", Path(source).stem)
    if not isinstance(name, str):
        raise InputError(source, "name", "must be a string")
    model = build(ModelShape, table["model"], source, "model")
    if model.top_k > model.experts_per_layer:
        raise InputError(source, "model.top_k", f"must be <= experts_per_layer ({model.experts_per_layer})")
    check_layer_ids(model, source)
    hardware = _build_hardware(table["hardware"], source)
    trace = _build_trace(table["trace"], source)
    policy = build(Policy, table.get("policy", {}), source, "policy")
    runtime = build(Runtime, table.get("runtime", {}), source, "runtime")
    if policy.theta_low > policy.theta_high:
        raise InputError(source, "policy.theta_low", f"must be <= theta_high ({policy.theta_high})")
    if -1 < policy.migration_weight < 0:
        raise InputError(source, "policy.migration_weight", "must be >= 0, or -1 (chosen by backtest)")
    _check_sizes(model, hardware, trace, source)
    Costs.of(model, hardware, source)  # derived times and pages in range, or the keys named
    path = Path(os.path.abspath(source))  # relative paths inside resolve against its folder (as typed:
    # a link to a shipped instance file is named as the user named it)
    return Instance(name, model, hardware, trace, policy, runtime, path)


def check_layer_ids(model: ModelShape, source: str | Path | None) -> None:
    """`model.layer_ids` lists one increasing id per layer, from `first_moe_layer` on, and every
    id is a layer of the model (`model_layers`)."""
    ids = list(model.layer_ids)
    if ids:
        if len(ids) != model.layers:
            raise InputError(
                source, "model.layer_ids", f"lists {len(ids)} ids, the model has {model.layers} layers"
            )
        if any(b <= a for a, b in itertools.pairwise(ids)):
            raise InputError(source, "model.layer_ids", f"must be strictly increasing, got {ids}")
        if ids[0] < model.first_moe_layer:
            raise InputError(
                source,
                "model.layer_ids",
                f"layer {ids[0]} is before model.first_moe_layer ({model.first_moe_layer}), a dense layer",
            )
    last = model.moe_layer_ids[-1]
    if model.model_layers and model.model_layers <= last:
        raise InputError(
            source,
            "model.model_layers",
            f"is {model.model_layers}, but the instance's last layer is model layer {last}",
        )


def _check_sizes(model: ModelShape, hardware: Hardware, trace: TraceSource, source: str | Path) -> None:
    """Limits on products of sizes: what the run would allocate, not what each key allows."""
    cells = model.layers * model.experts_per_layer * hardware.chiplets
    if cells > MAX_PLACEMENT_CELLS:
        raise InputError(
            source,
            "hardware.chiplets",
            f"layers x experts_per_layer x chiplets = {cells:,} exceeds {MAX_PLACEMENT_CELLS:,}"
            " (the slow loop keeps arrays of that size)",
        )
    if isinstance(trace, SyntheticTrace):
        routes = trace.generated_tokens() * model.layers * model.top_k
        if routes > MAX_TRACE_ROUTES:
            drawn = "micro_batches x tokens_per_batch"
            if trace.generated_tokens() > (trace.micro_batches + 1) * trace.tokens_per_batch:
                drawn = "tokens drawn (decode batching: whole requests, ~2 mean lengths past the steps)"
            raise InputError(
                source,
                "trace.micro_batches",
                f"{drawn} x layers x top_k = {routes:,} routes exceeds"
                f" {MAX_TRACE_ROUTES:,} (the generated trace would not fit in memory)",
            )
        check_synthetic(model, trace, source)


def check_synthetic(model: ModelShape, spec: SyntheticTrace, source: str | Path | None) -> None:
    """The generator's keys that depend on each other or on the model."""
    if model.top_k > model.experts_per_layer:
        raise InputError(source, "model.top_k", "exceeds experts_per_layer")
    if spec.zipf_alpha_max and spec.zipf_alpha_max < spec.zipf_alpha:
        raise InputError(
            source,
            "trace.zipf_alpha_max",
            f"must be 0 or >= zipf_alpha ({spec.zipf_alpha}), got {spec.zipf_alpha_max}",
        )
    if spec.degenerate_layer >= model.layers:
        raise InputError(
            source,
            "trace.degenerate_layer",
            f"must be -1 or below the {model.layers} layers, got {spec.degenerate_layer}",
        )
    if spec.topics > 1 and spec.sequence_tokens == 0:
        raise InputError(source, "trace.topics", "topics belong to requests: set trace.sequence_tokens > 0")


def _build_hardware(table: Any, source: str | Path) -> Hardware:
    chiplets = table.get("chiplets") if isinstance(table, dict) else None
    if not isinstance(chiplets, int) or isinstance(chiplets, bool) or not 1 <= chiplets <= 1024:
        # let `build` produce the precise message for a missing or bad count
        return build(Hardware, table, source, "hardware")
    return build(Hardware, table, source, "hardware", chiplets=chiplets)


def _build_trace(table: Any, source: str | Path) -> TraceSource:
    kinds: dict[str, type] = {"synthetic": SyntheticTrace, "file": FileTrace, "counts": CountsTrace}
    kind = table.get("kind") if isinstance(table, dict) else None
    known = "'synthetic', 'file' or 'counts'"
    if not isinstance(kind, str) or kind not in kinds:
        if isinstance(table, dict) and "kind" not in table:
            raise InputError(source, "trace.kind", f"missing required key ({known})")
        raise InputError(source, "trace.kind", f"must be {known}, got {kind!r}")
    return build(kinds[kind], table, source, "trace")


def to_table(instance: Instance) -> dict[str, Any]:
    """The TOML document of an instance (per-chiplet tuples written as lists)."""

    def plain(obj: Any) -> dict[str, Any]:
        out = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    return {
        "name": instance.name,
        "model": plain(instance.model),
        "hardware": plain(instance.hardware),
        "trace": plain(instance.trace),
        "policy": plain(instance.policy),
        "runtime": plain(instance.runtime),
    }


# ------------------------------------------------------------ overrides
# The one override engine: `--set`, the paper's sweeps and benchmark suites all apply
# dotted keys through `with_overrides` / `apply_overrides`.


def with_overrides(
    instance: Instance, overrides: dict[str, Any], source: str | Path | None = None
) -> Instance:
    """The instance with dotted keys replaced (`{"trace.zipf_alpha": 0.5}`), validated again.

    `source` names where the overrides come from in errors (default: the instance file).
    """
    origin = instance.source or instance.name
    table = apply_overrides(overridable_table(instance), overrides, source or origin)
    return instance_from_table(table, origin)


def overridable_table(instance: Instance) -> dict[str, Any]:
    """The instance table with uniform per-chiplet lists written as one number, so that an
    override of `hardware.chiplets` alone stays valid."""
    table = to_table(instance)
    for f in dataclasses.fields(instance.hardware):
        value = table["hardware"][f.name]
        if f.metadata.get("per_chiplet") and len(set(value)) == 1:
            table["hardware"][f.name] = value[0]
    return table


def apply_overrides(base: dict[str, Any], overrides: dict[str, Any], source: str | Path) -> dict[str, Any]:
    """A deep copy of an instance table with dotted-key overrides written in.

    A key is `section.key` (e.g. `trace.zipf_alpha`) or a top-level key (`name`);
    values are validated when the table becomes an `Instance`.
    """
    table = copy.deepcopy(base)
    for key, value in overrides.items():
        parts = key.split(".")
        if len(parts) > 2 or not all(parts):
            raise InputError(
                source, key, "an override key is `section.key` (e.g. trace.zipf_alpha) or `name`"
            )
        if len(parts) == 1:
            table[key] = value
            continue
        section = table.setdefault(parts[0], {})
        if not isinstance(section, dict):
            raise InputError(source, key, f"{parts[0]} is not a table of the instance")
        section[parts[1]] = copy.deepcopy(value)
    return table
