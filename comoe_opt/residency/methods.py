"""Every slow-loop method and what it does: the models (exact/), then the heuristics (their
registry, the engines' balancers included). Reading it loads no solver."""

from __future__ import annotations

from comoe_opt.residency.exact import MODEL_METHODS
from comoe_opt.residency.heuristics import HEURISTICS
from comoe_opt.residency.heuristics import engines as _engines  # noqa: F401  (registers the engines' balancers as heuristics)

RESIDENCY_METHODS: dict[str, str] = {
    **MODEL_METHODS,
    **{name: f"heuristic: {h.description}" for name, h in HEURISTICS.items()},
}
