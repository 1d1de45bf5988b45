"""How `milp` and `exact` divide their budget among their phases (formulations/residency.md,
"Time limit").

A solve has one of two budgets:

* a time limit (`solve`, the online loop): the cheap phases run first, then each open-ended
  phase gets at most its `SHARES` entry of the time left when it starts, so that no phase takes
  the whole budget while one that pays has not run;
* no time limit (evaluations: `evaluate`, `paper`, `compare`, `gap`, which must give the same
  numbers on any machine and under any load): every phase ends on a count of work instead,
  `WorkLimits.of(problem)`: HiGHS nodes, cut rounds, annealing runs. The annealing's proposals
  and the searches' moves are per layer (policy.anneal_proposals, policy.search_moves), so they
  grow with the instance; the HiGHS counts are per solve.

The phases' order and shares rest on `benchmarks/studies/bench_phases.py` (benchmarks/results/phases.md):
what each phase gave per second at each shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from comoe_opt.deadline import Deadline
from comoe_opt.residency.problem import ResidencyProblem

# share of the time left when the phase starts, with a time limit; `milp` / `exact`
SHARES: dict[str, tuple[float, float]] = {
    # the full-model polish (small instances): on the 5 x 60 x 8 stand-in its root LP alone outlasts
    # 40 s and its bound stays below the class bound; where it pays (no scenarios, tiny models) it
    # closes in a fraction of a second (benchmarks/results/phases.md)
    "polish": (0.25, 0.25),
    # the Lagrangian over layers: `milp` runs it last, on half of what is left (GPT-OSS window 0,
    # 10 s: 26.63 against the class LP's 26.27 ms, gap 10.8% -> 9.3%); `exact` on a fifth
    "lagrangian": (0.5, 0.2),
    # `exact`'s cut rounds; behind the class bound (which on every GPT-OSS window measured held what
    # 20-60 s of rounds proved) a tenth, the rest going to the longer searches
    # `exact`: the scenario-group bound (group_bound.py); its group solves did not close on GPT-OSS
    # window 0 or the paper baseline (formulations/residency.md, "Scenario-group bound"): it pays
    # where they do, and stops at the first layer where none closes
    "group_bound": (0.0, 0.1),
    "cut_rounds": (0.5, 0.5),
    "cut_rounds_behind_classes": (0.1, 0.1),
}


def share(name: str, exact: bool) -> float:
    """Phase `name`'s share of the time left."""
    return SHARES[name][1 if exact else 0]


@dataclass(frozen=True)
class WorkLimits:
    """What each open-ended phase may do in a solve without a time limit."""

    replica_nodes: int  # branch-and-bound nodes of the replica-count MILP
    lagrangian_nodes: int  # ... of each layer's priced class MILP (`exact`)
    cut_rounds: int  # `exact`'s cut model: rounds
    cut_rounds_behind_classes: int  # ... when the class bound is already proven
    cut_round_nodes: int  # ... and nodes per round's MILP
    cut_node_rows: int  # ... and nodes x rows over all rounds
    longer_runs: int  # `exact`'s longer searches: annealing runs (or refine.py searches)
    longer_proposals: int  # ... of this many proposals per layer
    longer_stall_runs: int  # ... ending after this many runs in a row that lowered nothing
    polish_rows: int  # the full model's polish: at most this many rows (with scenarios)
    polish_node_rows: int  # ... and this many nodes x rows

    @classmethod
    def of(cls, problem: ResidencyProblem) -> WorkLimits:
        """The limits for `problem`: the per-layer counts (moves, proposals) already grow with it;
        the cut rounds' count shrinks on all but tiny instances, where each round costs seconds;
        `exact`'s longer annealing runs share `LONGER_PROPOSALS` proposals over all layers."""
        shares = problem.layers * problem.experts * problem.chiplets * max(problem.scenarios, 1)
        tiny = shares <= TINY_SHARES
        return cls(
            replica_nodes=REPLICA_NODES,
            lagrangian_nodes=LAGRANGIAN_NODES,
            cut_rounds=CUT_ROUNDS if tiny else CUT_ROUNDS_LARGE,
            cut_rounds_behind_classes=CUT_ROUNDS if tiny else CUT_ROUNDS_BEHIND_CLASSES,
            cut_round_nodes=CUT_ROUND_NODES,
            cut_node_rows=CUT_NODE_ROWS,
            longer_runs=max(1, LONGER_PROPOSALS // (problem.layers * ANNEAL_PROPOSALS)),
            longer_proposals=min(ANNEAL_PROPOSALS, LONGER_PROPOSALS // problem.layers),
            longer_stall_runs=LONGER_STALL_RUNS,
            polish_rows=POLISH_ROWS,
            polish_node_rows=POLISH_NODE_ROWS,
        )

    def per_layer(self, layers: int) -> WorkLimits:
        """Each layer's limits where a window's `layers` are solved one at a time
        (exact/by_layer.py): the polish's rows and node-rows split over the layers, so that the
        layers polish what the window's one polish would have (a sparse 3 x 16 x 8 dump's compare:
        58 s with a polish of every layer, 9.5 s with none, the window's full model being above
        `POLISH_ROWS`); the other limits are per layer already."""
        share = max(layers, 1)
        return replace(
            self, polish_rows=self.polish_rows // share, polish_node_rows=self.polish_node_rows // share
        )

    def round_work(self) -> RoundWork:
        """The cut rounds' share of these limits."""
        return RoundWork(self.cut_round_nodes, self.cut_node_rows, CUT_STALL_ROUNDS)


@dataclass(frozen=True)
class RoundWork:
    """What the rounds may do without a time limit (residency/schedule.py: WorkLimits)."""

    round_nodes: int  # branch-and-bound nodes of one round's MILP, at most
    node_rows: int  # nodes x the model's rows over all rounds: a round's simplex work grows with its rows
    stall_rounds: int  # rounds in a row whose MILP stopped on its nodes and moved neither bound nor incumbent


# the rounds' work limits when a caller gives neither a time limit nor work limits (a study or a
# test solving a small model to optimality): far above what such a model needs, yet an end
CLOSING_ROUND_WORK = RoundWork(round_nodes=10_000, node_rows=50_000_000, stall_rounds=3)


def work_limited(deadline: Deadline) -> bool:
    """Whether the solve has no time limit, so that its phases end on work limits."""
    return not math.isfinite(deadline.limit_s)


# Work limits. Sources: benchmarks/results/phases.md (2-core machine); GPT-OSS windows 0/13/20/60
# plan in 2.8-7.4 s with them under a load of 3.6, the stand-in's windows in the times listed there
# nodes; a cap, far above what the replica MILPs of the shapes in phases.md need (0.03-1.1 s)
REPLICA_NODES = 1000
POLISH_NODES = 100  # nodes of the polish, with or without a time limit (residency/exact/pipeline.py)
# rows of the full model with scenarios up to which it is polished, with or without a time limit
# (exact/pipeline.py): a MILP's nodes are bounded, the simplex work of one node is not (HiGHS applies
# no iteration limit inside a MIP), and with scenarios it grows fast with the rows: a sparse
# 2 x 16 x 8 dump's polish (1,286 rows, 3 scenarios) spent 1,300 simplex iterations a node, 4.3 s
# for 38 nodes, and gave nothing; the stand-in's with 8 scenarios has 18,701 rows and its root LP
# ran 40 s without finishing. The property tests' instances have a few hundred
POLISH_ROWS = 1000
LAGRANGIAN_NODES = 500  # nodes per layer; a layer stopped on them gives its dual bound
# scenario shares x[l,e,c] x scenarios up to which an instance is tiny (the property tests' are at
# most a few hundred): there the cut rounds run to `CUT_ROUNDS`, as with a time limit
TINY_SHARES = 4096
CUT_ROUNDS = 50  # rounds on tiny instances (cuts.solve_with_cuts' own limit)
CUT_ROUNDS_LARGE = 10  # ... elsewhere; the bound settles in the first few rounds
# ... and behind the class bound: on the 5 x 60 x 8 stand-in's window 0 ten rounds took 123 s and
# raised neither bound nor objective
CUT_ROUNDS_BEHIND_CLASSES = 2
CUT_ROUND_NODES = 100  # nodes per round
# Node-rows: a branch-and-bound node's simplex work grows with the model's rows, so a MILP's nodes
# are budgeted as nodes x rows. On this project's 2-core machine a node-row took 40-45 us (a sparse
# 2 x 16 x 8 dump's cut model, 400 rows: 16 ms a node; its polish, 1,300 rows: 59 ms a node), so
# 25,000 node-rows are about a second there. The cut rounds over all rounds, about 10 s there
CUT_NODE_ROWS = 250_000
# ... and rounds in a row whose MILP stopped on its nodes with neither bound nor incumbent moved,
# after which the rounds stop: each such round restarts the same unfinished tree (the sparse dump's
# windows: 12 rounds of 100 nodes, 20 s, none of which moved either)
CUT_STALL_ROUNDS = 2
# the polish: node-rows of its one MILP, about 2 s there (100 nodes of its 1,300 rows took 5.9 s
# and gave nothing); the stand-in shapes of phases.md it closes have a few hundred rows
POLISH_NODE_ROWS = 50_000
# `full` (the plain x[l,e,c] model, for small instances) without a time limit: at most this many
# nodes, on this many node-rows (about 200 s on the machine above), enough to close the property
# tests' instances (a few hundred rows)
FULL_NODES = 100_000
FULL_NODE_ROWS = 5_000_000
# `exact`'s longer annealing runs, all layers and runs together: the stand-in (5 layers) gets two
# runs of `ANNEAL_PROPOSALS` (6 s on window 0, the only step after the annealing that lowered its
# objective), GPT-OSS (24 layers) one of 16,666 per layer
LONGER_PROPOSALS = 400_000
# ... and they end after this many runs in a row that lowered nothing (each starts from the same
# best placement with a new seed): on a tiny instance the runs are many (5 of 40,000 on a 2-layer
# dump) and the first misses tell; GPT-OSS (one run) and the stand-in (two) are not cut
LONGER_STALL_RUNS = 2
# proposals per layer of one of `exact`'s longer runs. Measured on GPT-OSS window 13 (`exact`, 60 s):
# runs of 10,000 alternating with refine.py's searches 0.52%, runs of 10,000 alone 0.53%, of 40,000
# 0.43%, one run over all the time left 0.45%
ANNEAL_PROPOSALS = 40_000
