"""The layers of docs/architecture.md, checked on the code's own imports, and the one planning path.

Every module's imports are read with `ast` (imports inside functions count
too: they are dependencies all the same). The rules: no import cycles,
nothing imports the CLI, layers only import downwards, the data and
statistics layers import no solver, the slow and fast loops never import
each other (they meet in the planning owner and the evaluator), and the best
split and the balancers sit below the slow loop (best_split < balancers <
residency: a balancer sees counts and slots, never a `ResidencyProblem`).
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import numpy as np
import pytest
from conftest import small_table

from comoe_opt.evaluator.runtime import simulate
from comoe_opt.evaluator.strategies import STRATEGIES
from comoe_opt.instance import instance_from_table
from comoe_opt.planning import rolling_horizon
from comoe_opt.planning.rolling import reproducible_limit
from comoe_opt.trace import instance_batches

PACKAGE = Path(__file__).resolve().parent.parent / "comoe_opt"

# lowest first; a module may import its own layer's modules and lower layers only
LAYERS: list[tuple[str, ...]] = [
    (
        "errors",
        "results",
        "schema",
        "files",
        "npzfile",
        "jsonio",
        "parallel",
        "interrupts",
        "highs",
        "costs",
        "deadline",
    ),
    ("instance", "presets"),
    ("docs",),
    ("trace",),
    ("stats",),
    ("best_split",),
    ("balancers",),
    ("residency", "mapping"),
    ("formats", "serving", "gpus"),
    ("planning",),
    ("replay",),
    ("evaluator",),
    ("bench",),
    ("cli",),
]
PEERS_APART = {("residency", "mapping"), ("mapping", "residency")}
# residency/'s own order, lowest first: a module imports its own unit's modules and lower units only
RESIDENCY_ORDER = (
    "placement",
    "problem",
    "even_split",
    "schedule",
    "objective",
    "models",
    "search",
    "bounds",
    "report",
    "heuristics",
    "exact",
    "methods",
    "layer_slots",
    "solve",
)
NO_SOLVER = ("trace", "stats")
SOLVERS = (
    "pyomo",
    "highspy",
    "ortools",
    "comoe_opt.highs",
    "comoe_opt.best_split",
    "comoe_opt.balancers",
    "comoe_opt.residency",
    "comoe_opt.mapping",
)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _root_names() -> dict[str, str]:
    """Each name the package root re-exports, and the module it comes from."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text(encoding="utf-8"))
    return {
        alias.asname or alias.name: node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    return imports_of(path.read_text(encoding="utf-8"), name, path.name == "__init__.py", known)


def imports_of(source: str, name: str, is_package: bool, known: set[str]) -> set[str]:
    """Every module `source` (module `name`) imports, absolute: `from pkg import sub` resolves to
    pkg.sub; a name taken from the package root to the module the root takes it from;
    `importlib.import_module` with a literal to that module, and with a computed name to every
    module named in the file's strings ("?dynamic" when it names none: a test fails on it)."""
    out: set[str] = set()
    root = _root_names()
    tree = ast.parse(source)
    bare_root = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
            bare_root |= any(alias.name == "comoe_opt" for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in known:
                    out.add(full)
                elif base == "comoe_opt" and alias.name in root:
                    out.add(root[alias.name])
                else:
                    out.add(base)
        elif isinstance(node, ast.Call) and _is_import_module(node.func):
            out.update(_dynamic_targets(node, tree, known))
    if bare_root:  # `import comoe_opt` then `comoe_opt.rebalance_experts(...)`
        for node in ast.walk(tree):
            named = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            if named and node.value.id == "comoe_opt" and node.attr in root:  # type: ignore[attr-defined]
                out.add(root[node.attr])  # type: ignore[attr-defined]
    return out


def _is_import_module(func: ast.expr) -> bool:
    return (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
        isinstance(func, ast.Name) and func.id == "import_module"
    )


def _dynamic_targets(call: ast.Call, tree: ast.Module, known: set[str]) -> set[str]:
    arg = call.args[0] if call.args else None
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return {arg.value}
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        prefix = str(arg.values[0].value)  # f"comoe_opt.cli.{module}": any module of that package
        return {m for m in known if m.startswith(prefix) and not m.endswith(".__main__")} or {"?dynamic"}
    named = {
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in known
    }
    return named or {"?dynamic"}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(path, name, known) for name, path in modules.items()}


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _layer(module: str) -> int:
    top = _top(module)
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(f"{module} is in no layer of docs/architecture.md: add it to LAYERS")


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle among the graph's own modules, or None."""
    internal = {m: sorted(d for d in deps if d in graph and d != m) for m, deps in graph.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(path: list[str]) -> list[str] | None:
        state[path[-1]] = 1
        for dep in internal[path[-1]]:
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep not in state and (cycle := visit([*path, dep])):
                return cycle
        state[path[-1]] = 2
        return None

    for module in sorted(internal):
        if module not in state and (cycle := visit([module])):
            return cycle
    return None


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports that point up the layers, or between the slow and the fast loop."""
    wrong = []
    for module, deps in graph.items():
        for dep in deps:
            if module == "comoe_opt" or not dep.startswith("comoe_opt.") or _top(dep) == _top(module):
                continue
            if _layer(dep) > _layer(module) or (_top(module), _top(dep)) in PEERS_APART:
                wrong.append(f"{module} -> {dep}")
    return sorted(wrong)


def residency_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports inside residency/ that point up its order (`RESIDENCY_ORDER`)."""

    def unit(module: str) -> str | None:
        parts = module.split(".")
        return parts[2] if len(parts) > 2 and parts[1] == "residency" else None

    wrong = []
    for module, deps in graph.items():
        here = unit(module)
        if here is None:
            continue
        assert here in RESIDENCY_ORDER, f"{module} is in no unit of RESIDENCY_ORDER: add it"
        for dep in deps:
            there = unit(dep)
            if there is not None and RESIDENCY_ORDER.index(there) > RESIDENCY_ORDER.index(here):
                wrong.append(f"{module} -> {dep}")
    return sorted(wrong)


def solver_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports of a solver (or of the loops that call one) from the data and statistics layers."""
    return sorted(
        f"{m} -> {d}"
        for m, deps in graph.items()
        if _top(m) in NO_SOLVER
        for d in deps
        if any(d == s or d.startswith(s + ".") for s in SOLVERS)
    )


def test_every_module_has_a_layer(graph):
    for module in graph:
        if module != "comoe_opt":
            _layer(module)


def test_no_import_cycles(graph):
    assert find_cycle(graph) is None


def test_layers_point_one_way(graph):
    assert layer_violations(graph) == []


def test_balancers_and_the_best_split_never_import_the_slow_loop(graph):
    """best_split < balancers < residency: the balancers see counts and slots, never a
    `ResidencyProblem`, and the cut condition serves all three without knowing them."""
    below = [m for m in graph if _top(m) in ("best_split", "balancers")]
    assert below, "best_split/ and balancers/ hold modules"
    upward = [
        f"{m} -> {d}"
        for m in below
        for d in graph[m]
        if _top(d) == "residency" or (_top(m) == "best_split" and _top(d) == "balancers")
    ]
    assert upward == []


def test_residency_has_an_inner_order(graph):
    assert residency_violations(graph) == []


def test_every_dynamic_import_is_resolved(graph):
    assert [m for m, deps in graph.items() if "?dynamic" in deps] == []


def test_nothing_imports_the_cli(graph):
    users = [m for m, deps in graph.items() if _top(m) != "cli" and any(_top(d) == "cli" for d in deps)]
    assert users == []


def test_data_and_statistics_import_no_solver(graph):
    assert solver_imports(graph) == []


def test_the_checks_catch_violations():
    cycle = {"comoe_opt.a.x": {"comoe_opt.a.y"}, "comoe_opt.a.y": {"comoe_opt.a.x"}}
    assert find_cycle(cycle) == ["comoe_opt.a.x", "comoe_opt.a.y", "comoe_opt.a.x"]
    upward = {"comoe_opt.trace.io": {"comoe_opt.planning.window", "pyomo.environ"}}
    assert layer_violations(upward) == ["comoe_opt.trace.io -> comoe_opt.planning.window"]
    assert solver_imports(upward) == ["comoe_opt.trace.io -> pyomo.environ"]
    peers = {"comoe_opt.mapping.gap": {"comoe_opt.residency.placement"}}
    assert layer_violations(peers) == ["comoe_opt.mapping.gap -> comoe_opt.residency.placement"]
    balancer = {"comoe_opt.balancers.eplb": {"comoe_opt.residency.problem"}}
    assert layer_violations(balancer) == ["comoe_opt.balancers.eplb -> comoe_opt.residency.problem"]
    inner = {"comoe_opt.residency.bounds.decompose": {"comoe_opt.residency.exact.pipeline"}}
    assert residency_violations(inner) == [
        "comoe_opt.residency.bounds.decompose -> comoe_opt.residency.exact.pipeline"
    ]


@pytest.mark.parametrize(
    "source",
    [
        "import importlib\nimportlib.import_module('comoe_opt.planning.window')",
        "from importlib import import_module\nimport_module('comoe_opt.planning.window')",
        "import importlib\nWHERE = {'x': 'comoe_opt.planning.window'}\nimportlib.import_module(WHERE['x'])",
        "from comoe_opt import rebalance_experts",
        "import comoe_opt\ncomoe_opt.rebalance_experts(None, 1, 1, 1, 1)",
    ],
)
def test_a_planted_upward_import_of_any_kind_is_caught(source):
    """trace/ sits below planning/ and balancers/: each way of importing them from it is seen."""
    known = set(_modules())
    deps = imports_of(source, "comoe_opt.trace.planted", False, known)
    assert layer_violations({"comoe_opt.trace.planted": deps}) != []


# ------------------------------------------------------- one planning path


def small_instance_table() -> dict:
    """The shared small instance, with room for replicas, leases and balance scenarios."""
    table = small_table()
    table["hardware"]["capacity_gb"] = 8
    table["trace"].update(micro_batches=16, drift_every=4)  # the hot set moves every window
    # cheap copies: without the leases the plans of later windows would differ
    table["policy"].update(lease_windows=2, balance_scenarios=2, migration_weight=0.2)
    return table


@pytest.mark.parametrize("name", ["comoe", "hot", "eplb", "single-scale"])
def test_evaluate_uses_the_placements_solve_rolling_plans(name):
    """The runtime plans through the rolling horizon: the placements it used, window by window,
    are exactly those `solve --rolling` plans with the strategy's method and terms."""
    instance = instance_from_table(small_instance_table(), "small.toml")
    batches = instance_batches(instance)
    strategy = STRATEGIES[name]
    used = simulate(instance, batches, strategy).placements
    planned = list(
        rolling_horizon(
            strategy.planning_instance(instance),
            batches,
            strategy.residency,
            terms=strategy.terms,
            time_limit_s=reproducible_limit(strategy.residency),  # as evaluations plan: no clock
        )
    )
    assert [w for w, _ in used] == [p.window for p in planned]
    for (_, placement), plan in zip(used, planned, strict=True):
        assert np.array_equal(placement.resident, plan.placement.resident)


def test_comoe_plans_what_solve_rolling_prints(cli, tmp_path):
    """CoMoE's plans are `solve --rolling --method milp` on the same instance (leases included)."""
    import tomli_w

    path = tmp_path / "small.toml"
    path.write_text(tomli_w.dumps(small_instance_table()), encoding="utf-8")
    instance = instance_from_table(small_instance_table(), path)
    used = simulate(instance, instance_batches(instance), STRATEGIES["comoe"]).placements
    # planned as evaluations plan (work limits, no clock), so the two agree under any load
    rows = cli("solve", path, "--rolling", "--work-limits", "--json").json()["windows"]
    assert len(rows) == len(used) == 4
    for (_, placement), row in zip(used, rows, strict=True):
        assert row["pages"] == placement.pages and row["distinct_experts"] == placement.distinct
    assert [r["pages_moved"] for r in rows[1:]] == [
        b.pages_moved_from(a) for (_, a), (_, b) in itertools.pairwise(used)
    ]
