"""Declarative validation of TOML tables into frozen dataclasses.

Each dataclass field carries its unit, its documentation and its valid range
in `metadata` (built by `param`). `build` checks a TOML table against the
dataclass: unknown keys, missing keys, wrong types and out-of-range values all
raise an `InputError` naming the file and the dotted key.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import types
import typing
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from comoe_opt.errors import InputError

T = TypeVar("T")


@dataclass(frozen=True)
class Bounds:
    """Closed or open numeric interval; `None` means unbounded on that side."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False

    def describe(self) -> str:
        parts = []
        if self.lo is not None:
            parts.append(f"{'>' if self.lo_open else '>='} {_number(self.lo)}")
        if self.hi is not None:
            parts.append(f"{'<' if self.hi_open else '<='} {_number(self.hi)}")
        return ", ".join(parts)

    def violation(self, value: float) -> str | None:
        if self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo):
            return f"must be {'>' if self.lo_open else '>='} {_number(self.lo)}, got {plain_number(value)}"
        if self.hi is not None and (value >= self.hi if self.hi_open else value > self.hi):
            return f"must be {'<' if self.hi_open else '<='} {_number(self.hi)}, got {plain_number(value)}"
        return None


def plain_number(value: float) -> str:
    """A number as the user wrote it, in full (-1.0000001, not -1; 1e+300; nan), never numpy's repr."""
    if isinstance(value, numbers.Integral):
        return str(int(value))
    number = float(value)
    if number.is_integer() and abs(number) < 1e16:
        return str(int(number))
    return repr(number)


def _number(value: float) -> str:
    """A limit as people write it: 1,048,576 rather than 1.04858e+06."""
    if float(value).is_integer() and abs(value) >= 10_000:
        return f"{int(value):,}"
    return f"{value:g}"


def param(
    doc: str,
    unit: str = "",
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    default: Any = MISSING,
    per_chiplet: bool = False,
    why: str = "",
) -> Any:
    """A dataclass field with its documentation, unit and valid range.

    `per_chiplet` fields accept a scalar (same for every chiplet) or a list
    with one value per chiplet; they are stored as tuples. `why` gives the
    reason for an upper limit (sizes are capped so that a slip of a digit is an
    error, not an allocation of terabytes).
    """
    bounds = Bounds(
        lo=gt if gt is not None else ge,
        hi=lt if lt is not None else le,
        lo_open=gt is not None,
        hi_open=lt is not None,
    )
    meta = {"doc": doc, "unit": unit, "bounds": bounds, "per_chiplet": per_chiplet, "why": why}
    return dataclasses.field(default=default, metadata=meta)


def describe(cls: type) -> list[dict[str, str]]:
    """Rows (key, type, unit, default, doc) documenting a dataclass's fields."""
    rows = []
    for f in dataclasses.fields(cls):
        meta = f.metadata
        default = "required" if f.default is MISSING else repr(_toml_value(f.default))
        doc = meta.get("doc", "")
        bounds: Bounds | None = meta.get("bounds")
        if bounds is not None and (bounds.lo is not None or bounds.hi is not None):
            doc += f" ({bounds.describe()})"
        if meta.get("per_chiplet"):
            doc += "; a number or a list with one value per chiplet"
        row = {"key": f.name, "unit": meta.get("unit", ""), "default": default, "doc": doc}
        rows.append({**row, "why": meta.get("why", ""), "limit": bounds.describe() if bounds else ""})
    return rows


def _toml_value(value: Any) -> Any:
    """A default as a TOML file writes it (tuples are lists)."""
    return list(value) if isinstance(value, tuple) else value


def build(cls: type[T], table: Any, source: str | Path, where: str, **context: Any) -> T:
    """Validate `table` (a dict from TOML) and construct `cls` from it.

    `context` carries values other fields depend on, e.g. `chiplets` for
    per-chiplet lists.
    """
    if not isinstance(table, dict):
        raise InputError(source, where, f"must be a table, got {_type_name(table)}")
    hints, fields = _schema(typing.cast(Any, cls))
    unknown = sorted(set(table) - set(fields))
    if unknown:
        raise InputError(source, _key(where, unknown[0]), f"unknown key (valid keys: {', '.join(fields)})")
    values = {}
    for name, f in fields.items():
        key = _key(where, name)
        if name not in table:
            if f.default is MISSING:
                raise InputError(source, key, "missing required key")
            continue
        values[name] = _coerce(table[name], hints[name], f.metadata, source, key, context)
    return cls(**values)


@functools.cache
def _schema(cls: Any) -> tuple[dict[str, Any], dict[str, dataclasses.Field]]:
    """Type hints and init fields of a dataclass, computed once (resolving hints is slow)."""
    return typing.get_type_hints(cls), {f.name: f for f in dataclasses.fields(cls) if f.init}


def _coerce(value: Any, hint: Any, meta: Any, source: Any, key: str, context: dict) -> Any:
    if meta.get("per_chiplet"):
        return _per_chiplet(value, hint, meta, source, key, context)
    if typing.get_origin(hint) is tuple:
        return _sequence(value, hint, meta, source, key)
    checked = _check_type(value, hint, source, key)
    _check_bounds(checked, meta, source, key)
    return checked


def _sequence(value: Any, hint: Any, meta: Any, source: Any, key: str) -> tuple:
    """A list of any length (`tuple[T, ...]`), each element typed and within the bounds."""
    (elem,) = {a for a in typing.get_args(hint) if a is not Ellipsis}
    if not isinstance(value, list):
        raise InputError(source, key, f"must be a list, got {_type_name(value)}")
    items = [_check_type(v, elem, source, f"{key}[{i}]") for i, v in enumerate(value)]
    for i, v in enumerate(items):
        _check_bounds(v, meta, source, f"{key}[{i}]")
    return tuple(items)


def _per_chiplet(value: Any, hint: Any, meta: Any, source: Any, key: str, context: dict) -> tuple:
    (elem,) = {a for a in typing.get_args(hint) if a is not Ellipsis}
    chiplets = context.get("chiplets")
    if isinstance(value, list):
        if chiplets is not None and len(value) != chiplets:
            raise InputError(source, key, f"needs one value per chiplet ({chiplets}), got {len(value)}")
        items = [_check_type(v, elem, source, f"{key}[{i}]") for i, v in enumerate(value)]
    else:
        items = [_check_type(value, elem, source, key)] * (chiplets or 1)
    for i, v in enumerate(items):
        _check_bounds(v, meta, source, f"{key}[{i}]" if isinstance(value, list) else key)
    return tuple(items)


def _check_type(value: Any, hint: Any, source: Any, key: str) -> Any:
    origin = typing.get_origin(hint)
    if origin is Literal:
        choices = typing.get_args(hint)
        if value not in choices:
            raise InputError(source, key, f"must be one of {', '.join(map(repr, choices))}, got {value!r}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _check_type(value, inner, source, key)
    if hint is bool:
        if not isinstance(value, bool):
            raise InputError(source, key, f"must be true or false, got {_type_name(value)}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputError(source, key, f"must be an integer, got {_type_name(value)} {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InputError(source, key, f"must be a number, got {_type_name(value)} {value!r}")
        if not math.isfinite(value):
            raise InputError(source, key, f"must be finite, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise InputError(source, key, f"must be a string, got {_type_name(value)}")
        return value
    raise TypeError(f"unsupported field type {hint!r} for {key}")


def _check_bounds(value: Any, meta: Any, source: Any, key: str) -> None:
    bounds: Bounds | None = meta.get("bounds")
    if bounds is None or not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    problem = bounds.violation(value)
    if problem:
        raise InputError(source, key, problem)


def _key(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def _type_name(value: Any) -> str:
    return {dict: "a table", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )
