"""The names `--help` lists, with what each does: building the parser imports no solver
(`comoe-opt --help` must not wait for Pyomo and OR-Tools); heuristics come from their registry,
which loads none.

tests/test_cli.py checks that these names are exactly the library's.
"""

from __future__ import annotations

from comoe_opt.evaluator.strategies import COMPARE_PEERS
from comoe_opt.evaluator.strategies import STRATEGIES as EVALUATOR_STRATEGIES
from comoe_opt.formats.engines import ENGINE_FORMATS
from comoe_opt.residency import MODEL_METHODS, RESIDENCY_METHODS

# the slow loop's methods with what each does: defined with the models and the heuristics' registry
# (comoe_opt.residency, imported without Pyomo)
__all__ = ["COMPARE_PEERS", "MODEL_METHODS", "RESIDENCY_METHODS"]

STRATEGIES: dict[str, str] = {name: s.description for name, s in EVALUATOR_STRATEGIES.items()}

EXPORT_FORMATS = tuple(ENGINE_FORMATS)  # `solve --export` formats: formats/engines.py's registry


DEFAULT_STRATEGIES = ("static", "hot", "transition", "comoe", "eplb")  # paper Table 4 and EPLB

DEFAULT_PAPER_INSTANCE = "instances/paper-baseline.toml"  # in a checkout; else the packaged copy
DEFAULT_REGIME_INSTANCE = "instances/paper-regime.toml"  # where most of the paper's claims hold

# `comoe-opt paper` defaults (comoe_opt.evaluator.paper.PaperSettings)
PAPER_TABLE5_BATCHES = 200
PAPER_SWEEP_BATCHES = 200


def described(names: dict[str, str]) -> str:
    """Help text listing every name with what it does."""
    return "; ".join(f"{name}: {text}" for name, text in names.items())
