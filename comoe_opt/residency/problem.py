"""The slow-loop problem of one window: costs in milliseconds, limits in pages.

Built from an instance, the demand of a trace window and the previous
placement (`residency_problem`). Every model and heuristic of the slow loop
reads this one immutable object, and every placement is scored by the same
objective (`comoe_opt.residency.objective`). See `formulations/residency.md`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from comoe_opt.errors import ComoeError
from comoe_opt.instance import Instance, Policy
from comoe_opt.residency.placement import Placement
from comoe_opt.stats.demand import WindowDemand

TERMS = frozenset({"miss", "prefetch", "balance", "migration", "nop", "quota"})


@dataclass(frozen=True, eq=False)
class Tenant:
    """A tenant (security domain) owns some logical experts and may keep at most `max_pages` resident."""

    name: str
    owns: np.ndarray  # [L, E] bool
    max_pages: int


@dataclass(frozen=True, eq=False)
class ResidencyProblem:
    miss_ms: np.ndarray  # [L, E] per micro-batch, paid when (l, e) has no replica
    work_ms: np.ndarray  # [L, E, C] expected expert work per micro-batch if all of it ran on c
    tokens: np.ndarray  # [L, E] λ, selections per micro-batch
    peak_tokens: np.ndarray  # [L, E] most selections of (l, e) in one micro-batch of the window
    nop_ms_per_token: np.ndarray  # [C] NoP pressure of sending one token to c and back
    capacity_pages: np.ndarray  # [C] int
    budget_pages: int
    max_replicas: int
    copy_ms: float  # per page copied (already weighted by policy.migration_weight)
    batches: int  # micro-batches the per-batch terms are multiplied by
    previous: Placement | None = None
    leased: np.ndarray | None = None  # [L, E, C] bool: replicas that must stay
    tenants: tuple[Tenant, ...] = ()
    terms: frozenset[str] = field(default=TERMS)
    all_resident: bool = False  # every logical expert must keep a replica
    scenario_work_ms: np.ndarray | None = None  # [S, L, E, C] sampled micro-batches' work (cut_condition.py)
    search_moves: int = 0  # local-search moves per layer on the scenarios (refine.py)
    anneal_proposals: int = 0  # annealing proposals per layer after the search (anneal.py)
    expert_groups: int = 1  # model's expert groups (EPLB's hierarchical mode, eplb.py)
    nodes: int = 1  # nodes the chiplets (devices) form (EPLB's hierarchical mode)
    load_counts: np.ndarray | None = None  # [L, E] the unscaled selections `tokens` comes from (EPLB's)
    step_counts: np.ndarray | None = None  # [T, L, E] the same per step (the engines' per-step planners)
    layer_slots: int = 0  # most replicas of one layer per chiplet (0 = any): solve() lays plans out within it
    # the dispatch the plan is scored for: "best" (the fast loop's best split) or "even" (each
    # expert's tokens shared evenly by its replicas: residency/even_split.py)
    split: str = "best"
    scenario_tokens: np.ndarray | None = None  # [S, L, E] the scenarios' selections (the even split's shares)
    work_rates: tuple[np.ndarray, np.ndarray] = (np.zeros(1), np.zeros(1))  # [C] ms per use, per token

    def __post_init__(self) -> None:
        check_feasibility(self)

    @property
    def page_limit(self) -> int:
        """Pages any placement may hold: capacity and budget permitting."""
        return int(min(self.capacity_pages.sum(), self.budget_pages))

    @property
    def layers(self) -> int:
        return self.miss_ms.shape[0]

    @property
    def experts(self) -> int:
        return self.miss_ms.shape[1]

    @property
    def chiplets(self) -> int:
        return self.work_ms.shape[2]

    @property
    def scenario_work(self) -> np.ndarray:
        """[S, L, E, C] the balance scenarios' work, where there are scenarios (`scenarios > 0`)."""
        if self.scenario_work_ms is None:
            raise ValueError("the problem has no balance scenarios")
        return self.scenario_work_ms

    @property
    def scenarios(self) -> int:
        """Balance scenarios (0: balance is scored on the mean load)."""
        return 0 if self.scenario_work_ms is None else self.scenario_work_ms.shape[0]

    @property
    def constant_ms(self) -> float:
        """The part of the window objective no placement changes: every token's least NoP."""
        return float(
            self.batches
            * self.tokens.sum()
            * (self.nop_ms_per_token.min() if self.nop_ms_per_token.size else 0.0)
        )

    def has(self, term: str) -> bool:
        return term in self.terms

    def previous_replicas(self) -> np.ndarray:
        if self.previous is None:
            return np.zeros((self.layers, self.experts), dtype=np.int64)
        return self.previous.replicas()

    def leased_replicas(self) -> np.ndarray:
        if self.leased is None:
            return np.zeros((self.layers, self.experts), dtype=np.int64)
        return self.leased.sum(axis=2)


def layers_of(problem: ResidencyProblem, layers: np.ndarray) -> ResidencyProblem:
    """The same problem on the given layers only: every per-layer array sliced, the limits (each
    chiplet's capacity, the budget, the quotas) as they are. Callers set the limits the layers get."""
    layers = np.asarray(layers)
    tokens, steps, loads = problem.scenario_tokens, problem.step_counts, problem.load_counts
    return dataclasses.replace(
        problem,
        miss_ms=problem.miss_ms[layers],
        work_ms=problem.work_ms[layers],
        tokens=problem.tokens[layers],
        peak_tokens=problem.peak_tokens[layers],
        previous=None if problem.previous is None else Placement(problem.previous.resident[layers]),
        leased=None if problem.leased is None else problem.leased[layers],
        tenants=tuple(Tenant(t.name, t.owns[layers], t.max_pages) for t in problem.tenants),
        scenario_work_ms=None if problem.scenario_work_ms is None else problem.scenario_work_ms[:, layers],
        scenario_tokens=None if tokens is None else tokens[:, layers],
        load_counts=None if loads is None else loads[layers],
        step_counts=None if steps is None else steps[:, layers],
    )


def reduced_problem(problem: ResidencyProblem, layers: np.ndarray, scenarios: np.ndarray) -> ResidencyProblem:
    """A smaller problem of the same kind: the given layers on the given balance scenarios, each
    chiplet's capacity, the budget and each tenant's quota cut to the layers' share (rounded
    down), the mean load the scenarios' mean (so that its bound holds for them). For evidence on
    where a gap lies: instances a complete method can close (formulations/residency.md, "Known
    limits")."""
    layers, scenarios = np.asarray(layers), np.asarray(scenarios)
    share = len(layers) / problem.layers

    def cut(limit: float) -> int:
        return int(np.floor(limit * share + 1e-9))

    sub = layers_of(problem, layers)
    work = sub.scenario_work[scenarios]
    tokens = sub.scenario_tokens
    return dataclasses.replace(
        sub,
        work_ms=work.mean(axis=0),
        capacity_pages=np.array([cut(c) for c in problem.capacity_pages], dtype=np.int64),
        budget_pages=cut(problem.budget_pages),
        tenants=tuple(Tenant(t.name, t.owns, cut(t.max_pages)) for t in sub.tenants),
        scenario_work_ms=work,
        scenario_tokens=None if tokens is None else tokens[scenarios],
        load_counts=None,
        step_counts=None,
    )


def check_feasibility(problem: ResidencyProblem) -> None:
    """Raise a `ComoeError` naming the shortfall when no placement can satisfy the limits."""
    limit = problem.page_limit
    what = "capacity" if limit == int(problem.capacity_pages.sum()) else "replica budget"
    if problem.all_resident:
        need = problem.layers * problem.experts
        if need > limit:
            raise ComoeError(
                f"every expert resident needs {need} pages but the {what} allows {limit}: "
                f"short by {need - limit} pages"
            )
    slots = problem.layer_slots
    if slots and problem.all_resident and slots * problem.chiplets < problem.experts:
        raise ComoeError(
            f"every expert resident needs {problem.experts} slots per layer but {problem.chiplets} chiplets"
            f" x policy.layer_slots {slots} hold {slots * problem.chiplets}"
        )
    if slots and problem.leased is not None and problem.leased.sum(axis=1).max(initial=0) > slots:
        raise ComoeError(
            f"a chiplet must keep more leased replicas of one layer than policy.layer_slots {slots}"
        )
    if problem.leased is not None:
        leased = problem.leased.sum(axis=(0, 1))
        over = np.flatnonzero(leased > problem.capacity_pages)
        if over.size:
            c = int(over[0])
            room = int(problem.capacity_pages[c])
            raise ComoeError(
                f"chiplet {c} must keep {int(leased[c])} leased pages but has room for {room}: "
                f"short by {int(leased[c]) - room} pages"
            )
        if int(problem.leased.sum()) > limit:
            raise ComoeError(f"{int(problem.leased.sum())} leased pages exceed the {what} of {limit} pages")
    for tenant in problem.tenants:
        floor = int(problem.leased[tenant.owns].sum()) if problem.leased is not None else 0
        if problem.all_resident:
            floor = max(floor, int(tenant.owns.sum()))
        if floor > tenant.max_pages:
            raise ComoeError(
                f"tenant {tenant.name} needs {floor} pages but its quota is {tenant.max_pages}: "
                f"short by {floor - tenant.max_pages} pages"
            )


def load_ms(instance: Instance) -> float:
    """Time to load one page over the effective die-to-die bandwidth, ms."""
    return instance.costs.page_load_ms


def residency_problem(
    instance: Instance,
    demand: WindowDemand,
    previous: Placement | None = None,
    *,
    leased: np.ndarray | None = None,
    tenants: tuple[Tenant, ...] = (),
    terms: frozenset[str] = TERMS,
    batches: int | None = None,
) -> ResidencyProblem:
    """The window's problem; `batches` (default: the window length) scales per-batch terms."""
    unknown = set(terms) - TERMS
    if unknown:
        raise ComoeError(f"unknown objective terms {sorted(unknown)} (known: {sorted(TERMS)})")
    model, hw, policy = instance.model, instance.hardware, instance.policy
    if demand.layers != model.layers or demand.experts != model.experts_per_layer:
        raise ComoeError(
            f"demand is {demand.layers} x {demand.experts}, the instance "
            f"{model.layers} x {model.experts_per_layer}"
        )
    per_use, per_token = _work_rates(instance, demand)
    work = demand.used[:, :, None] * per_use + demand.tokens[:, :, None] * per_token
    scenario_work = None
    if demand.scenario_tokens is not None and "balance" in terms:
        s = demand.scenario_tokens[..., None]
        # one micro-batch's expert time on a chiplet is the roofline: its page read or its tokens'
        # FLOPs, whichever is longer (with balance = "tokens", per_use is 0: tokens alone)
        scenario_work = np.maximum((s > 0) * per_use, s * per_token)
        # the mean load is the scenarios' mean, so that its bound holds for them (Jensen)
        work = scenario_work.mean(axis=0)
    capacity = instance.capacity_pages
    budget = policy.replica_budget_pages or int(capacity.sum())
    max_replicas = min(policy.max_replicas or hw.chiplets, hw.chiplets)
    # the first placement is the initial load, not a migration: copies cost only against a previous one
    migrating = "migration" in terms and previous is not None
    steps = int(batches if batches is not None else max(demand.batches, 1))
    copy = 0.0
    if migrating:
        copy = instance.costs.replan_copy_ms * policy.migration_weight * served_share(policy, steps)
    miss = _miss_ms(instance, demand, terms, int(min(capacity.sum(), budget)))
    nop = _nop_ms_per_token(instance) if "nop" in terms else np.zeros(hw.chiplets)
    if "balance" not in terms:
        work = np.zeros_like(work)
    return ResidencyProblem(
        miss_ms=miss,
        work_ms=work,
        tokens=demand.tokens,
        peak_tokens=demand.peak,
        nop_ms_per_token=nop,
        capacity_pages=capacity,
        budget_pages=int(budget),
        max_replicas=int(max_replicas),
        copy_ms=copy,
        batches=steps,
        previous=previous,
        leased=leased,
        tenants=tenants if "quota" in terms else (),
        terms=frozenset(terms),
        all_resident=policy.all_resident,
        scenario_work_ms=scenario_work,
        search_moves=policy.search_moves,
        anneal_proposals=policy.anneal_proposals,
        expert_groups=model.expert_groups,
        nodes=hw.nodes,
        load_counts=demand.load_counts,
        step_counts=demand.step_counts,
        layer_slots=policy.layer_slots,
        split=policy.split,
        scenario_tokens=demand.scenario_tokens if scenario_work is not None else None,
        work_rates=(np.broadcast_to(per_use, (hw.chiplets,)), np.broadcast_to(per_token, (hw.chiplets,))),
    )


def _miss_ms(instance: Instance, demand: WindowDemand, terms: frozenset[str], page_limit: int) -> np.ndarray:
    """Expected on-demand load time per micro-batch of a non-resident expert.

    A use that prefetch covers still pays `prefetch_exposed` of the load
    (it shares the die-to-die link); without the prefetch term every use pays
    the whole load, and with it only the uses the prefetch channel can land
    in time count as covered (`prefetch_hidden`).
    """
    if "miss" not in terms:
        return np.zeros_like(demand.used)
    exposed: float | np.ndarray = 1.0
    if "prefetch" in terms:
        hidden = prefetch_hidden(instance, demand, page_limit)
        exposed = 1.0 - (1.0 - instance.policy.prefetch_exposed) * hidden
    return load_ms(instance) * demand.used * exposed


def prefetch_hidden(instance: Instance, demand: WindowDemand, page_limit: int) -> np.ndarray:
    """[L, E] share of (l, e)'s uses that a prefetch can hide if (l, e) is left remote.

    The evaluator's credit lands a prefetch for layer l only before l is routed
    (formulations/latency.md §3), so the channel carries `prefetch_pages(l)` pages
    per micro-batch into layer l. Those pages are handed out coldest expert first
    (the experts a plan leaves remote first, its miss cost being proportional to
    use): an expert's predictable uses `q · h` count as hidden while the layer's
    pages last, the rest pay the whole load. Layer 0 has no layer before it."""
    used, hidden = demand.used, demand.hidden
    layers, experts = used.shape
    pages = prefetch_pages(instance, demand, page_limit)
    order = np.argsort(used, axis=1, kind="stable")
    occupancy = np.take_along_axis(used * hidden, order, axis=1)  # pages per micro-batch, coldest first
    before = np.cumsum(occupancy, axis=1) - occupancy  # taken by colder experts
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(occupancy > 0, np.clip((pages[:, None] - before) / occupancy, 0.0, 1.0), 0.0)
    out = np.zeros((layers, experts))
    np.put_along_axis(out, order, share, axis=1)
    return hidden * out


def prefetch_pages(instance: Instance, demand: WindowDemand, page_limit: int) -> np.ndarray:
    """[L] expected pages the prefetch channel lands per micro-batch before layer l is routed.

    A prefetch for layer l is issued once layer l-1 is routed and its `n`
    on-demand loads are done (`n · t_page`), and must land before l is routed:
    it has l-1's expert phase after those loads (the expected distinct experts'
    page reads spread over the chiplets, at least one read), attention and
    routing, and lands the whole pages that fit, at most the credit's
    `prefetch_credit_pages`. `n` is random: with `page_limit` pages for L·E
    experts at least `L·E − page_limit` are remote, taken as each layer's
    coldest (evenly over the layers), each loaded in a micro-batch that uses it
    (independently, with its use probability q). The expectation over `n` is
    the layer's pages; layer 0 has no layer before it (0)."""
    rt, chiplets = instance.runtime, instance.hardware.chiplets
    page = load_ms(instance)
    used = demand.used
    layers, experts = used.shape
    read = float(np.median(instance.costs.read_ms))
    reads = used.sum(axis=1) / chiplets * read
    loads = _remote_loads(used, max(0, layers * experts - page_limit) / layers)  # [L, n + 1]
    n = np.arange(loads.shape[1])
    window = np.maximum(reads[:, None] - n[None, :] * page, read) + rt.attention_ms + rt.route_ms
    fits = np.floor(window / page + 1e-9) if page > 0 else np.full(window.shape, np.inf)
    pages = (loads * np.minimum(fits, float(rt.prefetch_credit_pages))).sum(axis=1)
    return np.concatenate([[0.0], pages[:-1]])  # layer l's window is layer l-1's


def _remote_loads(used: np.ndarray, remote: float) -> np.ndarray:
    """[L, n + 1] probability of n on-demand loads in a micro-batch when each layer's `remote`
    coldest experts are remote (a fractional last one with its share of its use), each used
    independently with its q (Poisson binomial)."""
    layers, experts = used.shape
    whole = min(int(remote), experts)
    coldest = np.sort(used, axis=1)
    probs = [coldest[:, i] for i in range(whole)]
    if whole < experts and remote > whole:
        probs.append((remote - whole) * coldest[:, whole])
    dist = np.zeros((layers, len(probs) + 1))
    dist[:, 0] = 1.0
    for k, q in enumerate(probs, start=1):
        dist[:, 1 : k + 1] = dist[:, 1 : k + 1] * (1.0 - q[:, None]) + dist[:, :k] * q[:, None]
        dist[:, 0] *= 1.0 - q
    return dist


def _work_rates(instance: Instance, demand: WindowDemand) -> tuple[np.ndarray, np.ndarray]:
    """Expert work per use and per token on each chiplet, ms ([C] each).

    Each micro-batch that uses an expert reads its page once at local
    bandwidth and runs its tokens at peak compute, so the expected work is
    `q · t_read + λ · t_flop`. With `balance = "tokens"` (or `"auto"`, which the rolling horizon
    resolves before a problem is built) the work is
    proportional to tokens instead, `λ · τ`, with τ chosen so that the total
    is the same and the two settings have the same scale.
    """
    read_ms, flop_ms = np.broadcast_arrays(instance.costs.read_ms, instance.costs.flop_ms)
    if instance.policy.balance == "work":  # "auto" outside a rolling horizon: tokens, its prior
        return read_ms, flop_ms
    total = demand.used.sum() * read_ms + demand.tokens.sum() * flop_ms
    tokens = demand.tokens.sum()
    tau = np.where(tokens > 0, total / max(tokens, 1e-12), 0.0)
    return np.zeros_like(read_ms), tau


def _nop_ms_per_token(instance: Instance) -> np.ndarray:
    """Link time one token occupies on its way to chiplet c and back: 2 · hops · bytes / bandwidth.

    Hop latency is paid once per dispatch, in parallel for all tokens, so it
    does not depend on the placement and is left to the latency model.
    """
    return instance.costs.nop_ms_per_token


def served_share(policy: Policy, steps: int) -> float:
    """The planned steps' share of the steps a plan serves (`policy.replan_every`; 0: the window's
    own): the objective weighs `steps` steps of balance against copies made once per re-plan, so a
    copy is priced at this share of its time."""
    return steps / policy.replan_every if policy.replan_every else 1.0
