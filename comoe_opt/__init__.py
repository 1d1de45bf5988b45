"""comoe-opt: expert placement and token-to-replica mapping for MoE on chiplets.

The package follows one flow: read validated, immutable data (an `Instance`
and a `Trace`), run a method on it, get a result with a summary.

`rebalance_experts` is a drop-in for DeepSeek EPLB's function of the same name
(docs/api.md). Importing the package loads no solver: the solvers come in with
the modules that use them.
"""

from typing import TYPE_CHECKING, Any

from comoe_opt.errors import ComoeError, InputError

if TYPE_CHECKING:
    from comoe_opt.balancers.dropin.rebalance import rebalance_experts

__all__ = ["ComoeError", "InputError", "__version__", "rebalance_experts"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "rebalance_experts":
        from comoe_opt.balancers.dropin.rebalance import rebalance_experts

        return rebalance_experts
    raise AttributeError(f"module 'comoe_opt' has no attribute {name!r}")
