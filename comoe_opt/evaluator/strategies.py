"""The strategies the evaluator compares (paper Table 4, EPLB, and Table 5 ablations).

A strategy is a set of switches over one runtime; all of them share the
capacity budget of the instance.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from comoe_opt.balancers.engines import ENGINES
from comoe_opt.errors import ComoeError
from comoe_opt.instance import Instance
from comoe_opt.residency.problem import TERMS


@dataclass(frozen=True)
class Strategy:
    name: str
    residency: str  # slow-loop method (comoe_opt.residency.RESIDENCY_METHODS)
    replan: bool  # re-plan every window (False: once, on the profiling window)
    prefetch: Literal["none", "transitions", "popularity"]
    mapping: Literal["home", "even", "flow"]  # fast loop: home replica, even split, min-cost flow
    credits: bool = False  # credit-limited prefetch on the lowest-priority channel
    multicast: bool = False  # one copy of a token per chiplet, top-k merged locally
    max_replicas: int | None = None  # None: the instance's policy
    window_divisor: int = 1  # > 1: re-plan that many times per window (single time scale)
    terms: frozenset[str] = TERMS
    oracle: bool = False  # plan every micro-batch on itself, placed at once (the limit, not a policy)
    label: str = ""
    description: str = ""  # one line for `--help` (cli/choices.py reads it)

    @property
    def title(self) -> str:
        return self.label or self.name

    def planning_instance(self, instance: Instance) -> Instance:
        """The instance as this strategy plans it: its window length and replica limit."""
        policy = instance.policy
        window = 1 if self.oracle else max(1, policy.window_batches // self.window_divisor)
        planned = dataclasses.replace(
            policy,
            window_batches=window,
            max_replicas=policy.max_replicas if self.max_replicas is None else self.max_replicas,
        )
        return dataclasses.replace(instance, policy=planned)


COMOE = Strategy(
    "comoe",
    residency="milp",
    replan=True,
    prefetch="transitions",
    mapping="flow",
    credits=True,
    multicast=True,
    label="CoMoE-Chip",
    description="CoMoE-Chip: both loops, prefetch, credits, min-cost-flow routing",
)

# Only CoMoE plans residency knowing what prefetch hides (the transition graph's coupling).
NO_PREFETCH_TERM = TERMS - {"prefetch"}

HOT = Strategy(
    "hot",
    residency="hot",
    replan=True,
    prefetch="none",
    mapping="even",
    terms=NO_PREFETCH_TERM,
    label="hot replication",
    description="hot-expert replication in spare pages, even split (paper Table 4)",
)

STRATEGIES: dict[str, Strategy] = {
    "static": Strategy(
        "static",
        residency="static",
        replan=False,
        prefetch="none",
        mapping="home",
        terms=NO_PREFETCH_TERM,
        label="static",
        description="planned once, no replicas, home routing (paper Table 4)",
    ),
    "hot": HOT,
    # the evicting variant: replicas take their share of the pages even when experts do not fit
    "hot-evict": dataclasses.replace(
        HOT,
        name="hot-evict",
        residency="hot-evict",
        label="hot replication, evicting",
        description="hot replication that evicts the coldest experts for its replicas",
    ),
    "transition": Strategy(
        "transition",
        residency="static",
        replan=False,
        prefetch="transitions",
        mapping="home",
        credits=True,
        terms=NO_PREFETCH_TERM,
        label="transition prefetch",
        description="static placement + confidence-gated transition prefetch (paper Table 4)",
    ),
    "comoe": COMOE,
    "eplb": Strategy(
        "eplb",
        residency="eplb",
        replan=True,
        prefetch="none",
        mapping="even",
        terms=NO_PREFETCH_TERM,
        label="EPLB-style",
        description="EPLB re-planned every window, the engines' even split",
    ),
    # a peer that separates placement from routing: EPLB's placement, routed by the min-cost flow
    "eplb-flow": Strategy(
        "eplb-flow",
        residency="eplb",
        replan=True,
        prefetch="none",
        mapping="flow",
        terms=NO_PREFETCH_TERM,
        label="EPLB + flow routing",
        description="EPLB's placement with min-cost-flow routing (the strongest EPLB)",
    ),
    # the limit: EPLB planned on each micro-batch's own loads, in place at once, optimally routed
    "oracle": Strategy(
        "oracle",
        residency="eplb",
        replan=True,
        prefetch="none",
        mapping="flow",
        terms=NO_PREFETCH_TERM,
        oracle=True,
        label="oracle (planned on the step itself)",
        description="EPLB planned on each micro-batch itself, installed at once (the limit)",
    ),
    # CoMoE planning each window with the exact scenario model (to the gap or policy.time_limit_s)
    "comoe-exact": dataclasses.replace(
        COMOE,
        name="comoe-exact",
        residency="exact",
        label="CoMoE-Chip, exact scenario model",
        description="CoMoE planning with the exact scenario model (time-limited)",
    ),
    # Table 5: CoMoE with one mechanism off
    "no-transitions": dataclasses.replace(
        COMOE,
        name="no-transitions",
        prefetch="popularity",
        terms=NO_PREFETCH_TERM,
        label="no transition graph",
        description="Table 5 ablation: popularity prefetch instead of the transition graph",
    ),
    "no-replicas": dataclasses.replace(
        COMOE,
        name="no-replicas",
        max_replicas=1,
        label="no bounded replicas",
        description="Table 5 ablation: one replica per expert",
    ),
    "no-congestion": dataclasses.replace(
        COMOE,
        name="no-congestion",
        mapping="even",
        label="no congestion-aware mapping",
        description="Table 5 ablation: even split instead of congestion-aware mapping",
    ),
    "no-credits": dataclasses.replace(
        COMOE,
        name="no-credits",
        credits=False,
        label="no credits/priorities",
        description="Table 5 ablation: prefetch without credits or priorities",
    ),
    "single-scale": dataclasses.replace(
        COMOE,
        name="single-scale",
        window_divisor=10,
        label="single time scale",
        description="Table 5 ablation: one time scale (re-plan 10x per window)",
    ),
}

# the balancers engines ship (balancers/engines): each with the engines' even split and
# with the min-cost flow, as EPLB's two rows
for _name, _engine in ENGINES.items():
    _label, _whose = _engine.label, _engine.whose
    STRATEGIES[_name] = dataclasses.replace(
        STRATEGIES["eplb"],
        name=_name,
        residency=_name,
        label=_label,
        description=f"{_whose} re-planned every window, even split",
    )
    STRATEGIES[f"{_name}-flow"] = dataclasses.replace(
        STRATEGIES["eplb-flow"],
        name=f"{_name}-flow",
        residency=_name,
        label=f"{_label} + flow routing",
        description=f"{_whose} with min-cost-flow routing",
    )

TABLE4 = ("static", "hot", "transition", "comoe")
FAIR_COMPARISON = ("eplb", "eplb-flow", "oracle", "comoe")  # EPLB twice, the limit, CoMoE
# `comoe-opt compare`'s balancers (evaluator/compare.py): EPLB, the engines' (their registry), CoMoE
COMPARE_PEERS = ("eplb", *ENGINES, "comoe")
TABLE5 = ("comoe", "no-transitions", "no-replicas", "no-congestion", "no-credits", "single-scale")


def strategy(name: str) -> Strategy:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ComoeError(f"unknown strategy {name!r} (known: {', '.join(STRATEGIES)})") from None
