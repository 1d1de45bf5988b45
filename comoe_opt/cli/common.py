"""What every verb shares: the parser class, verb registration, output and exit codes."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from comoe_opt.errors import ComoeError, InputError

if TYPE_CHECKING:
    from comoe_opt.instance import Instance

USER_ERROR = 2


class Parser(argparse.ArgumentParser):
    """argparse that reports usage errors on one line, like every other user error."""

    def error(self, message: str) -> NoReturn:
        self.exit(USER_ERROR, f"{self.prog}: error: {message} (see --help)\n")


def int_in(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse type: an integer in [lo, hi] (a usage error, on one line, otherwise)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be >= {lo} and <= {hi:,}, got {value}")
        return value

    parse.__name__ = "integer"
    return parse


def names_in(text: str, known: Any, flag: str) -> list[str]:
    """Comma-separated names of `known` given to `flag`, each once, in the order written."""
    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names:
        raise ComoeError(f"{flag}: none named (known: {', '.join(known)})")
    unknown = [s for s in names if s not in known]
    if unknown:
        shown = unknown[0] if len(unknown[0]) <= 40 else unknown[0][:37] + "..."
        raise ComoeError(f"{flag}: unknown {shown!r} (known: {', '.join(known)})")
    repeated = sorted({s for s in names if names.count(s) > 1})
    if repeated:
        raise ComoeError(f"{flag}: {', '.join(repeated)} named more than once")
    return names


def option_into(instance: Instance, option: str, key: str, value: Any) -> Instance:
    """The instance with a CLI option written into its key, validated by the same schema as
    the file: `--time-limit nan` fails exactly as `policy.time_limit_s = nan` does."""
    from comoe_opt.instance import with_overrides

    if value is None:
        return instance
    try:
        return with_overrides(instance, {key: value})
    except InputError as exc:
        raise InputError(None, f"{option} (instance key {key})", exc.problem) from None


def emit(result: dict[str, Any], as_json: bool) -> None:
    """Print a verb's result: its `_text` for people, the rest as JSON with --json."""
    if as_json:
        payload = {k: v for k, v in result.items() if not k.startswith("_")}
        print(json.dumps(_finite(payload), default=_json_default, allow_nan=False))
    else:
        print(result.get("_text", json.dumps(result, default=_json_default, indent=2)))


def _finite(value: Any) -> Any:
    """JSON has no infinity or NaN: a bound or objective that does not exist is null."""
    import numpy as np

    if isinstance(value, float | np.floating):
        return float(value) if np.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _json_default(value: Any) -> Any:
    import numpy as np

    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot serialise {type(value).__name__}")
