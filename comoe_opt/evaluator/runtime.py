"""Two-time-scale runtime: slow loop per window, fast loop per micro-batch and layer.

`simulate(instance, batches, strategy)` serves a routed trace: window after
window the slow loop plans residency from the statistics it has seen (the
rolling horizon of `comoe_opt.planning`, the same plans `solve --rolling`
makes; the first window profiles itself), the directory copies the new
replicas in the background (prepare → publish → reclaim), and every
micro-batch goes through the layers one after another. At each layer:

1. prefetches aimed at this layer that the routing does not use are
   cancelled (their bytes so far are wasted);
2. each chosen expert's tokens are mapped to a chiplet that holds a published
   replica, a prefetched page, or loads the page on demand (the strategy's
   fast loop);
3. the layer's latency comes from `layer.py` (dispatch, page waits, roofline
   execution, reduction); on-demand loads share the die-to-die link;
4. prefetches for the next layer are issued from the transition graph's
   confidence tiers, most confident first, on the preemptible prefetch
   channel: a page is issued only while the channel's credit lets it land
   before the next layer is routed (its backlog and its share of the link
   decide), so the less confident pages give up first.

The die-to-die link carries three virtual channels (`_Link`): token/result,
weight load (on-demand loads first, re-plan copies in the background) and
prefetch. Without credits and priorities (the ablation) they collapse into
one FIFO: tokens and on-demand loads wait behind the page bytes queued
ahead of them (head-of-line blocking).

Every number is recorded per (micro-batch, layer) in a `SampleLog`.
Formulations and constants: formulations/latency.md.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from comoe_opt.evaluator.directory import PREPARING, ExpertDirectory
from comoe_opt.evaluator.fastmap import map_tokens
from comoe_opt.evaluator.layer import ChipletSpeeds, chiplet_finish, exec_ms, page_loads
from comoe_opt.evaluator.strategies import Strategy
from comoe_opt.instance import Instance
from comoe_opt.planning.rolling import WindowPlan, reproducible_limit, rolling_horizon
from comoe_opt.residency.placement import Placement
from comoe_opt.stats.prefetch import prefetch_targets
from comoe_opt.trace.batching import MicroBatches, windows

BITS = 8.0
POPULAR_PREFETCH = 4  # pages a popularity prefetch asks for when credits do not limit it


@dataclass
class SampleLog:
    """Per (micro-batch, layer) measurements, [N, L] arrays."""

    latency_ms: np.ndarray
    expert_ms: np.ndarray  # slowest chiplet, from routing to its last expert
    balance: np.ndarray  # mean / max chiplet busy time
    imbalance_tokens: np.ndarray  # max / mean expert-token load over chiplets
    token_bytes: np.ndarray  # dispatch + return
    load_bytes: np.ndarray  # on-demand + prefetch page bytes moved over the die-to-die link
    demand_load_bytes: np.ndarray  # on-demand only
    energy_mj: np.ndarray
    prefetch_issued: int = 0
    prefetch_denied: int = 0  # candidates refused: no credit left to land before the next layer
    prefetch_used: int = 0
    prefetch_wasted_bytes: float = 0.0
    pages_migrated: int = 0  # re-plan copies that landed
    copies_cancelled: int = 0  # re-plan copies a newer plan dropped while in flight
    copies_in_flight: int = 0  # re-plan copies still on their way when the trace ends
    copies_rolled_back: int = 0
    placements: list[tuple[int, Placement]] = field(default_factory=list)  # (window, placement) as planned
    windows: list[dict] = field(default_factory=list)  # per plan used: when, and its copies (placements_out)
    resident_pages: list[int] = field(default_factory=list)
    distinct_experts: list[int] = field(default_factory=list)
    # per micro-batch: pages of the plan in use, its distinct experts, and buffered pages tokens read
    batch_pages: np.ndarray = field(default_factory=lambda: np.zeros(0))
    batch_distinct: np.ndarray = field(default_factory=lambda: np.zeros(0))
    buffered_in_use: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @classmethod
    def empty(cls, batches: int, layers: int) -> SampleLog:
        def z() -> np.ndarray:
            return np.zeros((batches, layers))

        log = cls(z(), z(), z(), z(), z(), z(), z(), z())
        log.batch_pages, log.batch_distinct, log.buffered_in_use = (np.zeros(batches) for _ in range(3))
        return log


@dataclass
class _Prefetch:
    expert: int
    chiplet: int
    start: float
    end: float


class _Buffers:
    """Per-chiplet prefetch buffers: LRU page caches that are not replicas. `arrival[l, e, c]`
    mirrors the caches (inf where chiplet c buffers no page of expert e of layer l)."""

    def __init__(self, pages: np.ndarray, layers: int, experts: int):
        self.capacity = pages
        self.pages: list[OrderedDict[tuple[int, int], float]] = [OrderedDict() for _ in pages]
        self.arrival = np.full((layers, experts, len(pages)), np.inf)

    def held(self, layer: int, expert: int) -> bool:
        return bool(np.isfinite(self.arrival[layer, expert]).any())

    def put(self, layer: int, chiplet: int, expert: int, arrival: float) -> None:
        if self.capacity[chiplet] <= 0:
            return
        cache = self.pages[chiplet]
        cache[(layer, expert)] = arrival
        cache.move_to_end((layer, expert))
        self.arrival[layer, expert, chiplet] = arrival
        while len(cache) > self.capacity[chiplet]:
            (l, e), _ = cache.popitem(last=False)
            self.arrival[l, e, chiplet] = np.inf

    def drop(self, layer: int, chiplet: int, expert: int) -> None:
        self.pages[chiplet].pop((layer, expert), None)
        self.arrival[layer, expert, chiplet] = np.inf


@dataclass
class _Link:
    """The die-to-die link's channels, each as the time (ms) until which it is busy.

    With virtual channels (`vcs`): token/result traffic has a channel of its own and never waits
    for pages; on-demand loads preempt all other page traffic (`demand`); re-plan copies queue in
    the background (`background`) and prefetches on the preemptible prefetch channel
    (`prefetch`); those two share the link by equal-weight round robin (assumed), so a prefetch
    gets half of it while copies are queued and all of it otherwise. Without virtual channels one
    FIFO carries everything: `background` is its backlog.
    """

    vcs: bool
    page_ms: float
    background: float = 0.0
    prefetch: float = 0.0
    demand: float = 0.0

    def ahead(self, t: float) -> float:
        """What a token or an on-demand load entering the link at `t` waits behind."""
        return 0.0 if self.vcs else max(0.0, self.background - t)

    def load(self, start: float, busy: float) -> None:
        """On-demand loads from `start` (after `ahead(start)`) until `start + busy`."""
        if not self.vcs:  # one channel: the loads went after what was queued
            self.background = max(self.background, start + busy)
            return
        self.demand = start + busy
        if self.background > start:  # preempted: the copies resume after the loads
            self.background += busy
        if self.prefetch > start:
            self.prefetch += busy

    def prefetch_start(self, at: float) -> float:
        if not self.vcs:
            return max(at, self.background)
        return max(at, self.prefetch, self.demand)

    def issue_prefetch(self, start: float, deadline: float) -> float | None:
        """End of one page prefetched from `start`, committed only if it lands by `deadline`."""
        if not self.vcs:
            self.background = start + self.page_ms
            return self.background
        # at half rate beside the copies, then at full rate: both finish `beside` later than alone
        beside = min(self.page_ms, max(0.0, self.background - start))
        end = start + self.page_ms + beside
        if end > deadline:
            return None  # no credit: the page cannot land before the layer that needs it
        self.background += beside
        self.prefetch = end
        return end

    def cancel(self, remaining: float, at: float) -> None:
        """A prefetch cancelled at `at` with `remaining` ms to go returns its credit."""
        if self.vcs:
            self.prefetch = max(at, self.prefetch - remaining)
        else:
            self.background = max(at, self.background - remaining)


@dataclass
class _DeviceLinks:
    """Each device's copy link (copy_topology = "devices"): when it is free, its node, page times."""

    free: np.ndarray  # [C] ms
    node: np.ndarray  # [C]
    intra_ms: float  # one page from a device of the same node
    inter_ms: float  # one page from another node (or host memory)

    @classmethod
    def of(cls, instance: Instance) -> _DeviceLinks:
        hw, costs = instance.hardware, instance.costs
        per_node = hw.chiplets // hw.nodes
        return cls(
            free=np.zeros(hw.chiplets),
            node=np.arange(hw.chiplets) // per_node,
            intra_ms=costs.copy_intra_ms,
            inter_ms=costs.copy_inter_ms,
        )


def simulate(
    instance: Instance,
    batches: MicroBatches,
    strategy: Strategy,
    *,
    copy_failure_rate: float = 0.0,
    seed: int = 0,
) -> SampleLog:
    return _Runtime(instance, batches, strategy, copy_failure_rate, seed).run()


class _Runtime:
    def __init__(
        self, instance: Instance, batches: MicroBatches, strategy: Strategy, failure_rate: float, seed: int
    ):
        self.instance, self.batches, self.strategy = instance, batches, strategy
        hw, rt = instance.hardware, instance.runtime
        self.L, self.E, self.C = batches.layers, batches.num_experts, hw.chiplets
        costs = instance.costs
        self.page_ms = costs.page_load_ms
        self.speeds = ChipletSpeeds(read_ms=costs.read_ms, flop_ms=costs.flop_ms, hop_ms=costs.hop_ms)
        self.token_ms = costs.token_link_ms  # one token over the link
        self.fixed_ms = rt.attention_ms + rt.route_ms
        self.derate = rt.d2d_concurrency_derate
        self.credits = rt.prefetch_credit_pages if strategy.credits else None
        buffer_pages = costs.buffer_pages
        self.buffers = _Buffers(
            buffer_pages if strategy.prefetch != "none" else np.zeros(self.C, int), self.L, self.E
        )
        self.directory = ExpertDirectory(self.L, self.E, self.C)
        self.rng = np.random.default_rng(seed)
        self.failure_rate = failure_rate
        self.home = np.zeros((self.L, self.E), dtype=np.int64)
        self.targets: np.ndarray | None = None  # [L-1, E, E] prefetch targets
        self.confidence: np.ndarray | None = None
        self.popular: np.ndarray | None = None  # [L, E] expert order by frequency (popularity prefetch)
        self.pending: list[list[_Prefetch]] = [[] for _ in range(self.L)]
        self.to_retire: list[tuple[int, int, int]] = []
        self.retire_at = 0.0
        self.plan = np.zeros((self.L, self.E, self.C), dtype=bool)
        self.clock = 0.0
        self.link = _Link(vcs=strategy.credits, page_ms=self.page_ms)
        self.plan_pages, self.plan_distinct = 0, 0
        self.copies = _DeviceLinks.of(instance) if hw.copy_topology == "devices" else None
        self.started_copies: list[list] = []  # [layer, expert, device, lands at ms] of the current plan
        self.dropped_copies: list[list[int]] = []  # [layer, expert, device] dropped in flight by it
        self.log = SampleLog.empty(batches.batches, self.L)

    # ------------------------------------------------------------ driver

    def run(self) -> SampleLog:
        strategy = self.strategy
        instance = strategy.planning_instance(self.instance)
        spans = windows(self.batches.batches, instance.policy.window_batches)
        plans = rolling_horizon(
            instance,
            self.batches,
            strategy.residency,
            terms=strategy.terms,
            time_limit_s=reproducible_limit(strategy.residency),
            foresight=strategy.oracle,
        )
        placement: Placement | None = None
        for w, (start, stop) in enumerate(spans):
            if w == 0 or strategy.replan:
                placement = self._use(next(plans), placement)
            for b in range(start, stop):
                self.directory.publish_due(self.clock)
                if self.to_retire and self.clock >= self.retire_at:
                    self._retire_pending()
                for layer in range(self.L):
                    self._layer(b, layer)
                self.log.batch_pages[b], self.log.batch_distinct[b] = self.plan_pages, self.plan_distinct
        self.log.copies_rolled_back = self.directory.rolled_back
        self.log.pages_migrated = self.directory.landed
        self.log.copies_cancelled = self.directory.cancelled
        self.log.copies_in_flight = int((self.directory.state == PREPARING).sum())
        return self.log

    # --------------------------------------------------------- slow loop

    def _use(self, planned: WindowPlan, previous: Placement | None) -> Placement:
        """Put a window's plan in place: directory copies, homes and prefetch tables."""
        placement, plan = planned.placement, planned.plan
        self.started_copies, self.dropped_copies = [], []
        if self.strategy.oracle:  # the limit: every plan in place at once, no copy counted
            self.directory = ExpertDirectory(self.L, self.E, self.C)
            self.directory.install(placement.resident)
        else:
            self._apply(placement, previous)
        self._set_homes(placement, plan.problem.work_ms.min(axis=2))
        if self.strategy.prefetch == "transitions":
            assert plan.graph is not None  # a plan from micro-batches learns its window's graph
            self.targets = prefetch_targets(plan.graph, self.instance.policy)
            self.confidence = plan.graph.confidence()
        elif self.strategy.prefetch == "popularity":
            self.popular = np.argsort(-plan.demand.tokens, axis=1, kind="stable")
        self.log.placements.append((planned.window, placement))
        self.log.windows.append(
            {
                "window": planned.window,
                "first_micro_batch": planned.start,
                "planned_on": list(planned.planned_on),
                "in_use_from_ms": self.clock,
                "copies": self.started_copies,
                "cancelled": self.dropped_copies,
            }
        )
        self.log.resident_pages.append(placement.pages)
        self.log.distinct_experts.append(placement.distinct)
        self.plan_pages, self.plan_distinct = placement.pages, placement.distinct
        return placement

    def _apply(self, placement: Placement, previous: Placement | None) -> None:
        """Directory update: retire what left the plan, copy in what joined it."""
        if previous is None:
            self.directory.install(placement.resident)
            return
        self._retire_pending()  # the previous plan's leftovers go now
        leaving = self.directory.held() & ~placement.resident
        for key in zip(*np.nonzero(leaving & ~self.directory.published()), strict=True):
            if self.directory.state[key] == PREPARING:
                self.dropped_copies.append([int(k) for k in key])
            self.directory.retire(_cell(key))  # cancel copies still in flight
        # make before break: published replicas leave only once the new copies have landed
        self.to_retire = [_cell(key) for key in zip(*np.nonzero(leaving), strict=True)]
        self.plan = placement.resident
        new = placement.resident & ~self.directory.held()
        if self.copies is not None:
            self._copy_between_devices(new)
            return
        start = max(self.clock, self.link.background)
        for i, key in enumerate(zip(*np.nonzero(new), strict=True)):
            arrival = start + (i + 1) * self.page_ms
            verified = self.rng.random() >= self.failure_rate
            self.directory.prepare(_cell(key), arrival, verified)
            self.started_copies.append([*(int(k) for k in key), arrival])
        self.link.background = start + int(new.sum()) * self.page_ms
        self.retire_at = self.link.background

    def _copy_between_devices(self, new: np.ndarray) -> None:
        """Copies over each device's own link: from a device of the same node holding the expert at
        the intra-node rate, else at the inter-node rate; copies into one device queue, copies into
        different devices run in parallel, and none of them uses the die-to-die link of loads."""
        links = self.copies
        assert links is not None  # only with per-device copy links
        published = self.directory.published()
        for key in zip(*np.nonzero(new), strict=True):
            layer, expert, device = (int(k) for k in key)
            holders = np.flatnonzero(published[layer, expert])
            near = holders.size and (links.node[holders] == links.node[device]).any()
            start = max(self.clock, links.free[device])
            links.free[device] = start + (links.intra_ms if near else links.inter_ms)
            verified = self.rng.random() >= self.failure_rate
            self.directory.prepare((layer, expert, device), float(links.free[device]), verified)
            self.started_copies.append([layer, expert, device, float(links.free[device])])
        self.retire_at = max(self.clock, float(links.free.max()))

    def _retire_pending(self) -> None:
        """Retire the replicas the plan dropped, except the last copy of an expert whose new copy failed."""
        published = self.directory.published()
        for key in self.to_retire:
            l, e, _ = key
            if not published[key]:
                continue
            still_planned = self.plan[l, e].any()
            if still_planned and (published[l, e] & self.plan[l, e]).sum() == 0:
                continue  # its replacement was rolled back: keep serving from the old copy
            self.directory.retire(key)
            published[key] = False
        self.to_retire = []

    def _set_homes(self, placement: Placement, work: np.ndarray) -> None:
        """Home chiplet of every expert: its first replica; an expert without one goes to the
        chiplet whose buffer is home to the fewest such experts over all layers (its pages are
        loaded and cached there, so the buffers share them out), the least loaded among those."""
        homed = np.zeros(self.C, dtype=np.int64)
        for layer in range(self.L):
            resident = placement.resident[layer]
            load = (work[layer][:, None] * resident / np.maximum(resident.sum(axis=1, keepdims=True), 1)).sum(
                axis=0
            )
            homes = np.argmax(resident, axis=1)
            if self.strategy.mapping == "home":  # the static layout: contiguous blocks of expert ids
                blocks = np.arange(self.E) * self.C // self.E
                self.home[layer] = np.where(resident.any(axis=1), homes, blocks)
                continue
            for e in np.argsort(-work[layer], kind="stable"):
                if not resident[e].any():
                    c = int(np.lexsort((load, homed))[0])
                    homes[e] = c
                    load[c] += work[layer, e]
                    homed[c] += 1
            self.home[layer] = homes

    # --------------------------------------------------------- fast loop

    def _layer(self, b: int, layer: int) -> None:
        experts = self.batches.experts[b, :, layer, :].astype(np.int64)
        routed = self.clock + self.fixed_ms
        used = np.zeros(self.E, dtype=bool)
        used[experts.ravel()] = True
        self._cancel_unused(layer, used, routed)
        published = self.directory.published(layer)
        buffered = self._buffered_ready(layer, used, routed)
        low_priority_ahead = self.link.ahead(routed)  # 0 with virtual channels
        assignment = map_tokens(self, layer, experts, published, buffered, low_priority_ahead)
        pairs = experts.ravel() * self.C + assignment.ravel()
        tokens = np.bincount(pairs, minlength=self.E * self.C).reshape(self.E, self.C)
        if assignment.shape != experts.shape or not np.array_equal(
            tokens.sum(axis=1), np.bincount(experts.ravel(), minlength=self.E)
        ):  # the router's choices are never changed, only where they run
            raise RuntimeError(f"mapping changed the routed experts at layer {layer}")
        ready, loads = self._ready(layer, tokens, published, buffered, routed, low_priority_ahead)
        reads = (tokens > 0) & published
        self.directory.read(layer, reads)
        from_buffer = (tokens > 0) & ~published & np.isfinite(self.buffers.arrival[layer])
        self.log.buffered_in_use[b] += int(from_buffer.sum())  # the paper's replica accounting
        exec_ = exec_ms(tokens, self.speeds)
        sent = self._tokens_per_chiplet(assignment)
        dispatch = sent.sum() * self.token_ms
        arrive = self.speeds.hop_ms + low_priority_ahead + dispatch  # one FIFO: tokens wait behind pages
        finish = chiplet_finish(exec_, ready, arrive)
        expert_ms = float(finish.max())
        back = sent.sum() if self.strategy.multicast else experts.size
        issue_at = routed + loads * self.page_ms
        prefetch = self.strategy.prefetch != "none" and layer + 1 < self.L
        if prefetch and not self.link.vcs:  # issued as the loads end, the results queue behind them
            self._prefetch(b, layer, used, issue_at, np.inf)
        results_wait = self.link.ahead(routed + expert_ms)
        reduce_ms = float(self.speeds.hop_ms.max()) + results_wait + back * self.token_ms
        latency = self.fixed_ms + expert_ms + reduce_ms
        self.directory.release(layer, reads)
        self._record(b, layer, latency, expert_ms, exec_, tokens, sent.sum() + back, loads)
        self.clock += latency
        if prefetch and self.link.vcs:  # credit: land before the next layer is routed
            self._prefetch(b, layer, used, issue_at, self.clock + self.fixed_ms)

    def _buffered_ready(self, layer: int, used: np.ndarray, routed: float) -> np.ndarray:
        """[E, C] ms after routing when a buffered page is usable (inf where none)."""
        ready = np.maximum(self.buffers.arrival[layer] - routed, 0.0)
        ready[~used] = np.inf
        return ready

    def _ready(
        self,
        layer: int,
        tokens: np.ndarray,
        published: np.ndarray,
        buffered: np.ndarray,
        routed: float,
        ahead: float,
    ) -> tuple[np.ndarray, int]:
        """Readiness [E, C] of every used (expert, chiplet) and the number of on-demand loads."""
        active = tokens > 0
        ready = np.where(published, 0.0, buffered)
        missing = active & ~np.isfinite(ready)
        if not missing.any():  # every used page is resident or buffered
            return np.where(active, ready, 0.0), 0
        pairs = np.argwhere(missing)
        done = page_loads(tokens[missing], self.page_ms, self.derate, ahead)
        ready[missing] = done
        for (e, c), t in zip(pairs, done, strict=True):
            self.buffers.put(layer, int(c), int(e), routed + t)  # on-demand pages are cached too
        if pairs.size:
            self.link.load(routed, float(done.max()))
        return np.where(active, ready, 0.0), len(pairs)

    def _tokens_per_chiplet(self, assignment: np.ndarray) -> np.ndarray:
        """Token copies sent to each chiplet: one per (token, chiplet) with multicast, else one per pair."""
        if self.strategy.multicast:
            sent = np.zeros(self.C, dtype=np.int64)
            for r in range(assignment.shape[1]):
                first = (assignment[:, :r] != assignment[:, r : r + 1]).all(axis=1)
                sent += np.bincount(assignment[first, r], minlength=self.C)
            return sent
        return np.bincount(assignment.ravel(), minlength=self.C)

    # ----------------------------------------------------------- prefetch

    def _cancel_unused(self, layer: int, used: np.ndarray, routed: float) -> None:
        for p in self.pending[layer]:
            if used[p.expert]:
                self.log.prefetch_used += 1
                continue
            done = min(1.0, max(0.0, (routed - p.start) / max(p.end - p.start, 1e-12)))
            self.log.prefetch_wasted_bytes += done * self.instance.model.page_gb * 1e9
            if done < 1.0:  # preempted in flight: the page never lands, its credit returns
                self.buffers.drop(layer, p.chiplet, p.expert)
                self.link.cancel(p.end - max(p.start, routed), routed)
        self.pending[layer] = []

    def _prefetch(self, b: int, layer: int, used: np.ndarray, issue_at: float, deadline: float) -> None:
        """Issue next-layer prefetches, most confident first, while the channel has credit: a buffer
        slot (`prefetch_credit_pages` in flight) and the bandwidth to land by `deadline`. The
        first page refused ends the round, so the less confident pages give up first."""
        nxt = layer + 1
        wanted = self._prefetch_candidates(layer, used)
        published = np.asarray(self.directory.published(nxt).any(axis=1))
        issued = 0
        start = self.link.prefetch_start(issue_at)
        for e in wanted:
            if published[e] or self.buffers.held(nxt, e):
                continue
            if self.credits is not None and issued >= self.credits:
                break  # every buffer credit is taken
            end = self.link.issue_prefetch(start, deadline)
            if end is None:
                self.log.prefetch_denied += 1
                break
            c = int(self.home[nxt, e])
            self.buffers.put(nxt, c, int(e), end)
            self.pending[nxt].append(_Prefetch(int(e), c, start, end))
            self.log.load_bytes[b, layer] += self.instance.model.page_gb * 1e9
            start = end
            issued += 1
        self.log.prefetch_issued += issued

    def _prefetch_candidates(self, layer: int, used: np.ndarray) -> list[int]:
        """Next-layer experts to prefetch, most confident first."""
        if self.strategy.prefetch == "popularity":  # the next layer's hottest experts
            assert self.popular is not None  # set with every plan of a popularity strategy
            return [int(e) for e in self.popular[layer + 1][: self.credits or POPULAR_PREFETCH]]
        assert self.targets is not None and self.confidence is not None  # ... and of a transitions one
        targets = self.targets[layer][used]  # [used, E]
        conf = self.confidence[layer][used]
        score = (targets * conf[:, None]).max(axis=0)
        order = np.argsort(-score, kind="stable")
        return order[score[order] > 0].tolist()

    # ------------------------------------------------------------ metrics

    def _record(
        self,
        b: int,
        layer: int,
        latency: float,
        expert_ms: float,
        exec_: np.ndarray,
        tokens: np.ndarray,
        token_copies: int,
        loads: int,
    ) -> None:
        log, model, rt = self.log, self.instance.model, self.instance.runtime
        busy = exec_.sum(axis=0)
        log.latency_ms[b, layer] = latency
        log.expert_ms[b, layer] = expert_ms
        slowest = busy.max()
        log.balance[b, layer] = busy.mean() / slowest if slowest > 0 else 1.0
        per_chiplet = tokens.sum(axis=0)
        total = int(per_chiplet.sum())
        log.imbalance_tokens[b, layer] = per_chiplet.max() / (total / self.C) if total else 1.0
        log.token_bytes[b, layer] = token_copies * model.token_bytes
        page_bytes = model.page_gb * 1e9
        log.demand_load_bytes[b, layer] = loads * page_bytes
        log.load_bytes[b, layer] += loads * page_bytes
        reads = int(np.count_nonzero(tokens)) * page_bytes
        flops = total * model.gflop_per_token * 1e9
        moved = (token_copies * model.token_bytes + loads * page_bytes) * BITS
        log.energy_mj[b, layer] = 1e-9 * (
            moved * rt.d2d_pj_per_bit
            + reads * BITS * rt.hbm_pj_per_bit
            + token_copies * model.token_bytes * BITS * rt.sram_pj_per_bit
            + flops * rt.pj_per_flop
        )


def _cell(key: tuple) -> tuple[int, int, int]:
    """A (layer, expert, device) cell of numpy indices as ints."""
    layer, expert, device = (int(k) for k in key)
    return layer, expert, device
