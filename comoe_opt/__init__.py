"""comoe-opt: expert placement and token-to-replica mapping for MoE on chiplets.

The package follows one flow: read validated, immutable data (an `Instance`
and a `Trace`), run a method on it, get a result with a summary.
"""

from comoe_opt.errors import ComoeError, InputError

__all__ = ["ComoeError", "InputError", "__version__"]
__version__ = "0.1.0"
