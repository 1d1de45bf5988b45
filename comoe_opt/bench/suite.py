"""Suite files: sets of instances x methods x seeds, expanded into `RunSpec`s.

A suite is a TOML file (format in docs/bench.md). Its top-level keys are
defaults for its `[[group]]` tables; a suite without groups is one group.
Each group names a base instance, fixed overrides (`set`), sweep axes
(`vary`, cartesian product), run kind, methods, seeds and windows. Every
expanded instance is validated up front, so a typo fails before any run
starts, with an `InputError` naming the suite file and the key.
"""

from __future__ import annotations

import copy
import itertools
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from comoe_opt.bench.kinds import PLANNED_KINDS, RUN_KINDS
from comoe_opt.bench.spec import RunSpec, canonical_json
from comoe_opt.errors import InputError
from comoe_opt.instance import (
    SyntheticTrace,
    apply_overrides,
    instance_from_table,
    load_instance,
    overridable_table,
    to_table,
)
from comoe_opt.schema import build, describe, param

LIST_KEYS = ("methods", "seeds", "windows")
TABLE_KEYS = ("set", "vary")
RESERVED_OVERRIDES = {"trace.seed": "use `seeds`"}
MAX_SUITE_RUNS = 100_000  # expanding (validating every instance) takes about a minute at this size

# The non-scalar keys, documented here because `GroupOptions` holds only the scalar ones.
OTHER_KEYS: dict[str, tuple[str, str, str]] = {
    "methods": ("list of strings", "required", "methods of the run kind; one run per method"),
    "seeds": (
        "list of integers",
        "the instance's trace.seed",
        "trace seeds, written into trace.seed (synthetic traces; a file trace takes one seed)",
    ),
    "windows": ("list of integers", "[0]", "slow-loop windows to solve, one run per window"),
    "set": ("table", "{}", 'fixed overrides: `"section.key" = value` for any instance key'),
    "vary": (
        "table",
        "{}",
        'sweep axes, cartesian product: `"section.key" = [v1, v2, ...]`, or '
        '`name = [{"section.key" = v, label = "..."}, ...]` for keys that move together',
    ),
    "group": (
        "array of tables",
        "the top level is the one group",
        "`[[group]]`: any key above (`name` required); a group's keys override the top level's, "
        "`set` and `vary` merge key by key",
    ),
}


@dataclass(frozen=True)
class GroupOptions:
    """Scalar keys of a suite's top level and of each `[[group]]` (lists and tables are checked apart)."""

    name: str | None = param("suite name (top level) or group name (unique in the suite)", default=None)
    description: str = param("free text, copied into the report", default="")
    instance: str | None = param("base instance file, relative to the suite file", default=None)
    kind: str | None = param("run kind (default 'slow-loop')", default=None)
    time_limit_s: float | None = param(
        "solver time limit of every run (sets policy.time_limit_s)", "s", gt=0, default=None
    )
    mip_gap: float | None = param(
        "relative MIP gap of every run (sets policy.mip_gap)", ge=0, le=1, default=None
    )
    work_limits: bool | None = param(
        "plan every run on work limits, no time limit: the same results on any machine and load"
        " (excludes time_limit_s)",
        default=None,
    )


@dataclass(frozen=True)
class Group:
    name: str
    description: str
    kind: str
    methods: tuple[str, ...]
    instance: Path
    axes: tuple[str, ...]  # dotted instance keys swept in this group (result columns)


@dataclass(frozen=True)
class Suite:
    name: str
    description: str
    path: Path
    groups: tuple[Group, ...]
    specs: tuple[RunSpec, ...]

    def group(self, name: str) -> Group:
        return next(g for g in self.groups if g.name == name)


def load_suite(path: str | Path) -> Suite:
    """Read, validate and expand a suite file."""
    path = Path(path)
    try:
        table = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(path, None, "no such suite file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(path, None, f"cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(path, None, f"not valid TOML: {exc}") from None
    return expand_suite(table, path)


def expand_suite(table: dict[str, Any], path: Path) -> Suite:
    """Expand a parsed suite into its runs (groups in file order, then the cartesian product)."""
    raw_groups = table.get("group", [])
    if not isinstance(raw_groups, list) or not all(isinstance(g, dict) for g in raw_groups):
        raise InputError(path, "group", "must be an array of tables ([[group]])")
    top = _Layer.parse({k: v for k, v in table.items() if k != "group"}, path, "")
    suite_name = top.options.name or path.stem
    layers = [_Layer.parse(raw, path, f"group[{i}]") for i, raw in enumerate(raw_groups)]
    groups: list[Group] = []
    specs: list[RunSpec] = []
    seen: dict[str, RunSpec] = {}
    for layer in layers or [_Layer(GroupOptions(name=suite_name), {}, "")]:
        if layer.where and layer.options.name is None:
            raise InputError(path, f"{layer.where}.name", "missing required key")
        if layer.options.name in [g.name for g in groups]:
            raise InputError(path, f"{layer.where}.name", f"{layer.options.name!r} names two groups")
        plan = _Plan.resolve(top, layer, path)
        if len(specs) + plan.run_count() > MAX_SUITE_RUNS:
            raise InputError(
                path,
                layer.where or None,
                f"the suite expands to more than {MAX_SUITE_RUNS:,} runs"
                f" ({len(specs) + plan.run_count():,} so far): split it into several suites",
            )
        group_specs = plan.specs(suite_name, path)
        for spec in group_specs:
            first = seen.setdefault(spec.run_id, spec)
            if first is not spec:
                raise InputError(
                    path,
                    layer.where or None,
                    f"runs {first.point_label!r} and {spec.point_label!r} are "
                    "identical (same instance, method, seed and window)",
                )
        groups.append(plan.group())
        specs += group_specs
    return Suite(suite_name, top.options.description, path, tuple(groups), tuple(specs))


@dataclass(frozen=True)
class _Layer:
    """The keys of one level (the top or a group): scalars validated, lists and tables kept raw."""

    options: GroupOptions
    raw: dict[str, Any]
    where: str

    @classmethod
    def parse(cls, table: dict[str, Any], path: Path, where: str) -> _Layer:
        scalars = {k: v for k, v in table.items() if k not in (*LIST_KEYS, *TABLE_KEYS)}
        raw = {k: table[k] for k in (*LIST_KEYS, *TABLE_KEYS) if k in table}
        for key in TABLE_KEYS:
            if key in raw and not isinstance(raw[key], dict):
                raise InputError(path, _key(where, key), "must be a table of dotted instance keys")
        return cls(build(GroupOptions, scalars, path, where), raw, where)

    def label(self, key: str) -> str:
        return _key(self.where, key)


@dataclass(frozen=True)
class _Plan:
    """A group's effective settings: its own keys over the suite's; `set` and `vary` merge key by key."""

    name: str
    description: str
    base: Path
    kind: str
    methods: tuple[str, ...]
    seeds: tuple[int, ...] | None  # None: the instance's own seed
    seeds_label: str
    windows: tuple[int, ...]
    fixed: dict[str, Any]
    axes: tuple[tuple[_Point, ...], ...]  # per sweep axis, its points
    work_limits: bool = False  # every run plans on work limits (no time limit)

    @classmethod
    def resolve(cls, top: _Layer, layer: _Layer, path: Path) -> _Plan:
        def pick(key: str) -> Any:
            own = getattr(layer.options, key)
            return own if own is not None else getattr(top.options, key)

        def listed(key: str) -> tuple[Any, str]:
            source = layer if key in layer.raw or key not in top.raw else top
            return source.raw.get(key), source.label(key)

        if pick("instance") is None:
            raise InputError(
                path, layer.label("instance"), "missing: name a base instance here or at the top"
            )
        kind = _kind(pick("kind") or "slow-loop", path, layer.label("kind"))
        methods_raw, methods_label = listed("methods")
        methods = _str_list(methods_raw, methods_label, path)
        for method in methods:
            if method not in RUN_KINDS[kind].methods:
                known = ", ".join(RUN_KINDS[kind].methods)
                raise InputError(
                    path, methods_label, f"{method!r} is not a method of {kind} (known: {known})"
                )
        seeds_raw, seeds_label = listed("seeds")
        seeds = None if seeds_raw is None else _int_list(seeds_raw, seeds_label, path)
        windows_raw, windows_label = listed("windows")
        windows = (0,) if windows_raw is None else _int_list(windows_raw, windows_label, path)
        if windows != (0,) and not RUN_KINDS[kind].windows:
            raise InputError(path, windows_label, f"run kind {kind!r} covers the whole trace: no windows")
        fixed = _merged_table("set", top, layer)
        work_limits = bool(pick("work_limits"))
        if work_limits and pick("time_limit_s") is not None:
            raise InputError(path, layer.label("work_limits"), "excludes time_limit_s: give one of them")
        for key, target in (("time_limit_s", "policy.time_limit_s"), ("mip_gap", "policy.mip_gap")):
            if pick(key) is not None:
                if target in fixed:
                    raise InputError(path, fixed[target][1], f"conflicts with `{key}`: give one of them")
                fixed[target] = (pick(key), layer.label(key))
        vary = _merged_table("vary", top, layer)
        for key, (_, label) in vary.items():
            if key in fixed:
                raise InputError(path, label, f"is also fixed by {fixed[key][1]}: give it in one place")
        for value, label in fixed.values():
            _check_finite(value, label, path)
        axes = [_axis(key, values, label, path) for key, (values, label) in vary.items()]
        swept = [(k, label) for points, label in axes for p in points for k in p.overrides]
        for key, label in [*((k, lab) for k, (_, lab) in fixed.items()), *swept]:
            if key in RESERVED_OVERRIDES:
                raise InputError(path, label, f"cannot be overridden here: {RESERVED_OVERRIDES[key]}")
        return cls(
            name=layer.options.name or top.options.name or path.stem,
            description=layer.options.description,  # the suite's own is the report's preamble
            base=(path.parent / pick("instance")).resolve(),
            kind=kind,
            methods=methods,
            seeds=seeds,
            seeds_label=seeds_label,
            windows=windows,
            fixed={k: v for k, (v, _) in fixed.items()},
            axes=tuple(items for items, _ in axes),
            work_limits=work_limits,
        )

    def run_count(self) -> int:
        """How many runs the group expands to (known before expanding: it may be too many)."""
        points = math.prod(len(axis) for axis in self.axes)
        return points * len(self.seeds or (0,)) * len(self.windows) * len(self.methods)

    def specs(self, suite: str, path: Path) -> list[RunSpec]:
        base = load_instance(self.base)  # errors name the instance file itself
        base_table = overridable_table(base)
        context = f"{path}: group {self.name!r}"
        seeds = self.seeds or ((base.trace.seed,) if isinstance(base.trace, SyntheticTrace) else (0,))
        out = []
        for combo in itertools.product(*self.axes):
            overrides = dict(self.fixed)
            for p in combo:
                overrides.update(p.overrides)
            point = tuple((k, v) for p in combo for k, v in p.overrides.items() if not isinstance(v, list))
            label = ", ".join(p.label for p in combo) or "-"
            table = apply_overrides(base_table, overrides, path)
            synthetic = isinstance(table.get("trace"), dict) and table["trace"].get("kind") == "synthetic"
            if not synthetic and len(seeds) > 1:
                raise InputError(path, self.seeds_label, "the trace is read from a file: seeds repeat runs")
            for seed in seeds:
                if synthetic:
                    table["trace"]["seed"] = seed
                instance = instance_from_table(copy.deepcopy(table), context)
                canonical = canonical_json(to_table(instance))
                for window, method in itertools.product(self.windows, self.methods):
                    out.append(
                        RunSpec(
                            suite,
                            self.name,
                            self.kind,
                            method,
                            seed,
                            window,
                            instance.name,
                            canonical,
                            str(self.base),
                            point,
                            label,
                            self.work_limits,
                        )
                    )
        return out

    def group(self) -> Group:
        columns = dict.fromkeys(
            k
            for points in self.axes
            for p in points
            for k, v in p.overrides.items()
            if not isinstance(v, list)
        )
        return Group(self.name, self.description, self.kind, self.methods, self.base, tuple(columns))


def suite_reference() -> str:
    """The Markdown table of every suite key (generated into docs/bench.md)."""
    rows = ["| key | type | unit | default | meaning |", "|---|---|---|---|---|"]
    for row in describe(GroupOptions):
        kind = {"time_limit_s": "float", "mip_gap": "float", "work_limits": "bool"}.get(row["key"], "string")
        default = "instance policy" if row["key"] in ("time_limit_s", "mip_gap") else row["default"]
        default = "false" if row["key"] == "work_limits" else default
        default = {"None": "-", "''": '""'}.get(default, default)
        rows.append(f"| `{row['key']}` | {kind} | {row['unit'] or '–'} | {default} | {row['doc']} |")
    for key, (kind, default, doc) in OTHER_KEYS.items():
        rows.append(f"| `{key}` | {kind} | – | {default} | {doc} |")
    return "\n".join(rows)


# ------------------------------------------------------------------ helpers


def _kind(kind: str, path: Path, label: str) -> str:
    if kind in RUN_KINDS:
        return kind
    available = ", ".join(RUN_KINDS)
    if kind in PLANNED_KINDS:
        raise InputError(
            path,
            label,
            f"run kind {kind!r} ({PLANNED_KINDS[kind]}) is not available yet (available: {available})",
        )
    raise InputError(path, label, f"unknown run kind {kind!r} (available: {available})")


def _merged_table(key: str, top: _Layer, layer: _Layer) -> dict[str, tuple[Any, str]]:
    """Flattened `set` or `vary` of the top and the group (group wins), each value with its label."""
    out: dict[str, tuple[Any, str]] = {}
    for source in (top, layer):
        if key in source.raw:
            label = source.label(key)
            out.update({k: (v, f"{label}.{k}") for k, v in _flatten(source.raw[key]).items()})
    return out


@dataclass(frozen=True)
class _Point:
    label: str  # for people: "trace.zipf_alpha=0.5", or "scale=64x4" for a labelled table
    overrides: dict[str, Any]


def _axis(key: str, values: Any, label: str, path: Path) -> tuple[tuple[_Point, ...], str]:
    """One sweep axis: `key = [v1, v2]`, or `name = [{k1 = v, k2 = w}, ...]` for keys that move together
    (a table may carry a `label` for reports)."""
    if not isinstance(values, list) or not values:
        raise InputError(path, label, "must be a non-empty list of values (one run per value)")
    _check_finite(values, label, path)
    if all(isinstance(v, dict) for v in values):
        points = tuple(_table_point(key, v, label, path) for v in values)
    elif any(isinstance(v, dict) for v in values):
        raise InputError(path, label, "mixes tables and values: use one or the other")
    else:
        points = tuple(_Point(f"{key}={_show(v)}", {key: v}) for v in values)
    if len({canonical_json(p.overrides) for p in points}) != len(points):
        raise InputError(path, label, "repeats a value")
    return points, label


def _table_point(axis: str, table: dict[str, Any], label: str, path: Path) -> _Point:
    overrides = _flatten(table)
    name = overrides.pop("label", None)
    if not overrides:
        raise InputError(path, label, "a table of a sweep axis needs at least one instance key")
    if name is not None and not isinstance(name, str):
        raise InputError(path, f"{label}.label", "must be a string")
    shown = ", ".join(f"{k}={_show(v)}" for k, v in overrides.items() if not isinstance(v, list))
    return _Point(f"{axis}={name}" if name else shown, overrides)


def _check_finite(value: Any, label: str, path: Path) -> None:
    """TOML allows nan and inf; no instance key does, and results could not be stored as JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(path, label, f"must be finite, got {value!r}")
    if isinstance(value, list):
        for v in value:
            _check_finite(v, label, path)
    if isinstance(value, dict):
        for k, v in value.items():
            _check_finite(v, f"{label}.{k}", path)


def _show(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"trace": {"rho": 1}} -> {"trace.rho": 1}: quoted and unquoted dotted keys mean the same."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        full = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict):
            out.update(_flatten(value, full))
        else:
            out[full] = value
    return out


def _str_list(raw: Any, label: str, path: Path) -> tuple[str, ...]:
    if raw is None:
        raise InputError(path, label, "missing required key (a list, here or at the top)")
    if not isinstance(raw, list) or not raw or not all(isinstance(v, str) for v in raw):
        raise InputError(path, label, "must be a non-empty list of strings")
    return _unique(raw, label, path)


def _int_list(raw: Any, label: str, path: Path) -> tuple[int, ...]:
    ok = isinstance(raw, list) and raw and all(isinstance(v, int) and not isinstance(v, bool) for v in raw)
    if not ok:
        raise InputError(path, label, "must be a non-empty list of integers")
    if min(raw) < 0:
        raise InputError(path, label, f"must be >= 0, got {min(raw)}")
    return _unique(raw, label, path)


def _unique(values: list, label: str, path: Path) -> tuple:
    if len(set(values)) != len(values):
        raise InputError(path, label, "repeats a value")
    return tuple(values)


def _key(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key
