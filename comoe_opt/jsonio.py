"""JSON helpers shared by the placement and load-count formats: validated reads, typed checks,
atomic and diff-friendly writes; the YAML read and plain-text write of TensorRT-LLM's file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np

from comoe_opt.errors import InputError
from comoe_opt.files import atomic_path

MAX_ID = 2**31  # an expert or device id beyond this is a corrupt value (and would overflow int64 math)


def read_text(path: Path, what: str) -> str:
    """The file's text, or one line naming it (missing, unreadable, not UTF-8)."""
    if not path.exists():
        raise InputError(path, None, f"no such {what}")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(path, None, f"cannot read: {exc}") from None


def load_json(path: Path, what: str) -> Any:
    text = read_text(path, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            path, None, f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except RecursionError:
        raise InputError(path, None, "not a usable JSON document: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer literal of more than 4300 digits
        raise InputError(path, None, f"not a usable JSON document: {exc}") from None


def load_yaml(path: Path, what: str) -> Any:
    """A YAML document (PyYAML's safe loader: plain data only), or one line naming the file."""
    import yaml

    text = read_text(path, what)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        raise InputError(path, None, f"not valid YAML{where}") from None
    except RecursionError:
        raise InputError(path, None, "not a usable YAML document: nested too deeply") from None


def write_text(text: str, path: Path) -> None:
    """`text` written atomically (a reader sees the old file or the whole new one)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def int_table(raw: Any, name: str, path: Path) -> np.ndarray:
    if not isinstance(raw, list) or not raw:
        raise InputError(path, name, "must be a non-empty list of rows")
    width = None
    for r, row in enumerate(raw):
        if not isinstance(row, list) or not row:
            raise InputError(path, f"{name}[{r}]", "must be a non-empty list of logical expert ids")
        if width is not None and len(row) != width:
            raise InputError(
                path,
                f"{name}[{r}]",
                f"has {len(row)} slots, row 0 has {width}: every layer needs the same count",
            )
        width = len(row)
        for i, x in enumerate(row):
            if not is_int(x) or not 0 <= x < MAX_ID:
                shown = repr(x) if len(repr(x)) < 40 else repr(x)[:40] + "..."
                problem = f"must be a non-negative integer expert id below {MAX_ID:,}, got {shown}"
                raise InputError(path, f"{name}[{r}][{i}]", problem)
    return np.array(raw, dtype=np.int64)


def num_logical(table: np.ndarray, experts: int | None, name: str, path: Path) -> int:
    largest = int(table.max())
    if experts is None:
        return largest + 1
    if largest >= experts:
        where = tuple(int(i) for i in np.argwhere(table == largest)[0])
        raise InputError(path, name, f"expert id {largest} at {list(where)} out of range 0..{experts - 1}")
    return experts


def expect_list(value: Any, length: int, where: str, path: Path, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise InputError(path, where, f"must be a list, got {json_type(value)}")
    if len(value) != length:
        raise InputError(path, where, f"has {len(value)} entries, expected {length} {what}")
    return value


def with_source(path: Path, fn: Any) -> Any:
    """Run `fn`, attaching `path` to an InputError that names no file."""
    try:
        return fn()
    except InputError as exc:
        if exc.source is None:
            raise InputError(path, exc.field, exc.problem) from None
        raise


def plain_json(value: Any, name: str) -> Any:
    try:
        return json.loads(json.dumps(value, sort_keys=True, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise InputError(None, name, f"not JSON-serialisable: {exc}") from None


def write_json(doc: Any, path: Path) -> None:
    text = _format(doc, 0) + "\n"
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def _is_flat(value: Any) -> bool:
    scalar = (str, int, float, bool, type(None))
    if isinstance(value, list):
        return all(isinstance(x, scalar) for x in value)
    if isinstance(value, dict):
        return all(isinstance(v, scalar) or (isinstance(v, list) and _is_flat(v)) for v in value.values())
    return True


def _format(value: Any, indent: int) -> str:
    """JSON with containers of scalars on one line: one line per expert / row / device."""
    if _is_flat(value) or not value:
        return json.dumps(value, separators=(", ", ": "), allow_nan=False)
    pad, inner = "  " * indent, "  " * (indent + 1)
    if isinstance(value, list):
        items = [inner + _format(x, indent + 1) for x in value]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    items = [f"{inner}{json.dumps(k)}: {_format(v, indent + 1)}" for k, v in value.items()]
    return "{\n" + ",\n".join(items) + "\n" + pad + "}"


def is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def is_number(value: Any) -> TypeGuard[float]:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(
        value, bool | np.bool_
    )


def json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    for kind, label in names.items():
        if isinstance(value, kind):
            return label
    return "a number" if is_number(value) else type(value).__name__
