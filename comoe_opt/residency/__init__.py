"""The slow loop: expert residency and replicas of one window (problem, MILPs, heuristics).

Planning window after window (the rolling horizon) is `comoe_opt.planning`'s job. Names are
imported on first use, so that reading the heuristics' registry or a `Placement` does not load
the MILP stack (Pyomo, HiGHS).
"""

from __future__ import annotations

import importlib
from typing import Any

from comoe_opt.residency.exact import MODEL_METHODS
from comoe_opt.residency.methods import RESIDENCY_METHODS

_WHERE = {
    "Placement": "comoe_opt.residency.placement",
    "ResidencyProblem": "comoe_opt.residency.problem",
    "Tenant": "comoe_opt.residency.problem",
    "residency_problem": "comoe_opt.residency.problem",
    "solve": "comoe_opt.residency.solve",
}

__all__ = [
    "MODEL_METHODS",
    "RESIDENCY_METHODS",
    "Placement",
    "ResidencyProblem",
    "Tenant",
    "residency_problem",
    "solve",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
