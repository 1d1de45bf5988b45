"""The drop-in search's knobs (`SearchConfig`, one frozen value a call carries) and its work
budget (`Work`).

Each knob says what it bounds or what set it: the GPT-OSS windows of benchmarks/results/dropin.md
chose `half_life`, `guided` and `cross_block`; the rest are sizes that bound memory or cost, or
the costs (`ns_*`) that turn counts of scored moves into a budget.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SearchConfig:
    # steps this far back weigh half as much as the newest (None: all alike); the plan serves the
    # steps after its history, which resemble the recent ones most (chosen on GPT-OSS windows 1-32
    # among None, 128, 64 and 32; the drop-in's backtest may choose a call's own: backtest.py)
    half_life: float | None = 64.0
    # lp: moves drawn per layer and iteration
    candidates: int = 96
    # lp: standard errors of its per-step change a move's gain must exceed
    significance: float = 1.0
    # lp: further candidates per layer and iteration, as a share of `candidates`: swaps toward the
    # covariance-aware packing, so that a search from the map in service can take the part of a
    # re-pack that pays for its moves (0.5 chosen on GPT-OSS windows 1-32 among 0, 0.25, 0.5)
    guided: float = 0.5
    # lp: iterations without an improving move before a layer stops (its moves are rare finds)
    patience: int = 5
    # even, given the map in service: a move must also lower the objective (before its price) on
    # each of two halves of the steps, alternate blocks of this many (None: no such check). The
    # steps' loads are autocorrelated (GPT-OSS: 0.2 one step apart, 0.06 eight apart), so blocks
    # keep the halves close to independent; 1, 4, 8 and 16 were measured (results/dropin.md)
    cross_block: int | None = 8
    cross_tries: int = 8  # even: a layer's best improving moves checked on the halves per pass
    # even: bytes of the experts' pairwise covariances held at once (ahead of the rest: 134 MB a
    # layer at the drop-in's limit of 4,096 experts; DeepSeek-V3's 58 layers of 256 hold 30 MB)
    cross_bytes: int = 256 * 2**20
    # even: moves of one layer scored at once (beyond: its hottest GPUs' moves)
    max_neighbourhood: int = 2**20
    # even: elements of one block of spare slots' gifts ([layers, spare slots, node's slots, GPUs])
    gift_cells: int = 2**21
    chunk: int = 25_000  # even: moves scored at once (bounds memory and the overrun of a deadline)
    extra_moves: int = 3  # even: further moves per layer and pass, each re-scored before applied
    max_iterations: int = 10_000  # a guard: every applied move lowers the objective anyway
    # a layer keeps the search's map only where it balances the newest steps at least as well as
    # EPLB's plan (guard.py; False: the search's map serves as it is, for tests and ablations)
    eplb_guard: bool = True
    # standard errors by which EPLB's lead on the newest steps must exceed its noise: 0 chosen on
    # the regime suite among 0, 1, 2 and no guard, the one value that left no regime's drop-in P95
    # above EPLB's (1: C +0.3%; 2: B +0.2%; none: B +0.5%, C +0.3%, DeepSeek-V3 +11.8%), at the
    # most copies (benchmarks/results/regimes-dropin.md)
    guard_z: float = 0.0
    # the steps the guard judges: "newest" (the newest quarter), "all" (every step alike) or
    # "auto" (every step for the search by steps, the newest quarter for the search by moments).
    # For the search by steps on the scale suite's 18 draws, every step: even +0.1% mean P95 against
    # EPLB at 0.34 of its copies, the newest quarter +0.5% at 0.56 (results/scale-step-search.md);
    # the search by moments keeps the newest quarter, with which guard_z was chosen
    guard_steps: str = "auto"
    # past this many GPUs, search by steps (step_search.py: one swap off each layer's hottest GPU
    # per pass, replica counts kept; for `lp` on the even split's peaks) instead of by moments
    # (`even`) or pooled cuts (`lp`); None: never. Chosen on the scale suite and the regime suite's
    # instance past 12 GPUs, each drawn with seeds 0, 1 and 2 (benchmarks/results/scale-step-search.md
    # and -lp.md): its replayed P95 is the other searches' within the draws' spread (mean against
    # EPLB, guard on every step: even +0.1%, lp -0.0%; by moments +0.3%, by pooled cuts -0.1%; one
    # draw between -3.4% and +4.7%) at 0.34 of EPLB's copies against 0.54 and 0.41, and it plans
    # within about 2x EPLB's time where they take 5-21x and 150-1,100x (results/scale-plan-time.md)
    step_search_gpus: int | None = 12
    # steps: GPUs paired with a layer's hot GPU per pass, the coolest of its node (2, 4 and 8
    # measured on the scale suite's first draws, commit 68af754's results/scale-step-search.md:
    # none better on every instance)
    step_partners: int = 4
    # steps: a layer keeps the search's map only where the same search, run on the history without
    # its newest quarter, balances that quarter at least as well as EPLB's plan of the whole
    # history (a held-out check; EPLB's plan has seen the quarter, so the check leans to EPLB).
    # Off: on the scale suite's 18 draws +0.4% mean P95 against EPLB at 0.65 of its copies, against
    # the default's +0.1% at 0.34 (results/scale-step-search.md)
    held_back: bool = False
    # The search's work, counted in what it takes on a typical machine (nanoseconds of one core of
    # the project's 2-core AMD EPYC host, NumPy 2.4, measured on the drop-in's six timing inputs,
    # GPT-OSS and DeepSeek-V3 shapes: benchmarks/results/dropin.md). They turn counts into a
    # budget; the count itself, not the clock, decides where a search stops.
    ns_per_move: float = 550.0  # even: one move scored (a swap or a gift, halves' checks included)
    ns_per_pair_step: float = 0.8  # even: one (expert pair, step) covariance term, once per layer
    ns_per_cell: float = 5.0  # lp: one (GPU set, step) sum of a candidate or of an exact best split
    # lp: whether one expert's replicas lie in one GPU set (38-55 ns measured at 144 GPUs, 3 words)
    ns_per_expert_set: float = 40.0


DEFAULT = SearchConfig()


class Work:
    """A budget of work (model nanoseconds, the `ns_*` costs) that the search spends as it
    scores, so that where it stops depends on the input alone, never on the machine or its load."""

    def __init__(self, budget: float = float("inf")):
        self.budget, self.used = budget, 0.0
        self.refused = False  # a batch of work was not begun: it would have gone past the budget

    def spend(self, units: float) -> None:
        self.used += units

    def fits(self, units: float) -> bool:
        """Whether `units` more stay within the budget (if not, the budget counts as spent)."""
        self.refused |= self.used + units > self.budget
        return not self.refused

    @property
    def spent(self) -> bool:
        return self.refused or self.used >= self.budget
