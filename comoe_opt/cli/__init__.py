"""The `comoe-opt` command: every verb is a thin call into the library.

Every verb accepts `--json` and then prints one JSON object on stdout. User
errors print one line on stderr and exit with status 2. Nothing outside this
package imports it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from comoe_opt.cli.common import USER_ERROR, emit
from comoe_opt.cli.parser import build_parser
from comoe_opt.errors import ComoeError


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _run(argv)
    except BrokenPipeError:  # the reader went away (`... | head`): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "handler"):
        parser.print_help()
        return USER_ERROR
    try:
        result = args.handler(args)
    except ComoeError as exc:
        print(f"comoe-opt: error: {one_line(str(exc))}", file=sys.stderr)
        return USER_ERROR
    except KeyboardInterrupt:
        print("comoe-opt: interrupted", file=sys.stderr)
        return 130
    emit(result, args.json)
    sys.stdout.flush()
    return 0


def one_line(message: str) -> str:
    """A user error on one line: messages quoted from libraries may span several."""
    return " ".join(message.split())
