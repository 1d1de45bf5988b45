"""The names `--help` lists, with what each does: building the parser imports no solver
(`comoe-opt --help` must not wait for Pyomo and OR-Tools); heuristics come from their registry,
which loads none.

tests/test_cli.py checks that these names are exactly the library's.
"""

from __future__ import annotations

from comoe_opt.evaluator.strategies import STRATEGIES as EVALUATOR_STRATEGIES
from comoe_opt.formats.engines import ENGINE_FORMATS
from comoe_opt.residency.heuristics import HEURISTICS
from comoe_opt.residency.heuristics import engines as engine_balancers

# the models; the heuristics declare themselves (residency/heuristics/__init__.py, imported without Pyomo)
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

STRATEGIES: dict[str, str] = {name: s.description for name, s in EVALUATOR_STRATEGIES.items()}

ENGINES = tuple(ENGINE_FORMATS)  # `solve --export` formats: formats/engines.py's registry

# `comoe-opt compare` (evaluator/compare.py: PEERS): EPLB, the engines' balancers (their registry), CoMoE
COMPARE_PEERS = ("eplb", *engine_balancers.ENGINES, "comoe")

DEFAULT_STRATEGIES = ("static", "hot", "transition", "comoe", "eplb")  # paper Table 4 and EPLB

DEFAULT_PAPER_INSTANCE = "instances/paper-baseline.toml"  # in a checkout; else the packaged copy
DEFAULT_REGIME_INSTANCE = "instances/paper-regime.toml"  # where most of the paper's claims hold

# `comoe-opt paper` defaults (comoe_opt.evaluator.paper.PaperSettings)
PAPER_TABLE5_BATCHES = 200
PAPER_SWEEP_BATCHES = 200


def described(names: dict[str, str]) -> str:
    """Help text listing every name with what it does."""
    return "; ".join(f"{name}: {text}" for name, text in names.items())
