"""The slow loop's solver-backed methods: the `milp`/`exact`/`full`/`lp` pipeline (pipeline.py),
which solves the models of residency/models/ within the phases' budget of residency/schedule.py."""

# the models' names and what each does (`--method`'s help reads these); loading them loads no solver
MODEL_METHODS: dict[str, str] = {
    "milp": "replica-count MILP (HiGHS) from the best heuristic, placed and refined: proven bound",
    "exact": "milp, then the exact scenario model by row generation: a proven gap on the scenario objective",
    "full": "plain MILP over every (layer, expert, chiplet): exact, for small instances",
    "lp": "LP relaxation bound of the replica-count model only (no placement)",
}
