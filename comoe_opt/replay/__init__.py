"""One replay of balancers over per-step counts, and one way to score it (docs/architecture.md).

`replay(planner, steps, spans, history_windows, foresight)` plans each window (`replay.py`);
`serve(slots, counts, dispatch)` scores a step under the even split, SGLang's `lp` and our flow
(`serve.py`); the planners are adapters of the slow loop's methods, the engines' balancers, EPLB
and the drop-in (`planners.py`). `compare`, the drop-in replay and the regime suite all go
through these, so the same inputs give the same rows whichever of them computes them.
"""

from comoe_opt.replay.planners import DropIn, EplbLayout, EplbOnSteps, Rolling
from comoe_opt.replay.replay import (
    FORESIGHTS,
    Foresight,
    Planner,
    Run,
    Static,
    Window,
    copies,
    replay,
    windows_of,
)
from comoe_opt.replay.serve import DISPATCHES, Served, serve

__all__ = [
    "DISPATCHES",
    "FORESIGHTS",
    "DropIn",
    "EplbLayout",
    "EplbOnSteps",
    "Foresight",
    "Planner",
    "Rolling",
    "Run",
    "Served",
    "Static",
    "Window",
    "copies",
    "replay",
    "serve",
    "windows_of",
]
