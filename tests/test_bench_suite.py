"""Suite files: expansion into runs, content-hashed run ids, one-line validation errors."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from conftest import ROOT

from comoe_opt.bench import expand_suite, load_suite
from comoe_opt.bench.columns import column_reference
from comoe_opt.bench.docs import generated
from comoe_opt.bench.suite import suite_reference
from comoe_opt.instance import load_instance


@pytest.fixture
def make_suite(tmp_path: Path, table: dict[str, Any]) -> Callable[..., Path]:
    """Write the small instance beside a suite file holding `text` (TOML); return the suite path."""
    (tmp_path / "inst.toml").write_text(tomli_w.dumps(table), encoding="utf-8")

    def make(text: str, name: str = "suite") -> Path:
        path = tmp_path / f"{name}.toml"
        path.write_text(text, encoding="utf-8")
        return path

    return make


SWEEP = """
name = "sweep"
instance = "inst.toml"
methods = ["greedy", "static"]
seeds = [0, 1]
[vary]
"trace.zipf_alpha" = [0.5, 1.1]
"trace.rho" = [0.3, 0.6]
"""


def test_cartesian_product_of_axes_methods_and_seeds(make_suite) -> None:
    suite = load_suite(make_suite(SWEEP))
    assert len(suite.specs) == 2 * 2 * 2 * 2
    combos = {
        (s.method, s.seed, dict(s.point)["trace.zipf_alpha"], dict(s.point)["trace.rho"]) for s in suite.specs
    }
    assert len(combos) == 16
    for spec in suite.specs:
        instance = spec.instance()
        assert instance.trace.seed == spec.seed
        assert instance.trace.zipf_alpha == dict(spec.point)["trace.zipf_alpha"]
        assert instance.trace.rho == dict(spec.point)["trace.rho"]
        assert instance.model.experts_per_layer == 8  # untouched keys keep the base instance's values
    assert suite.groups[0].axes == ("trace.zipf_alpha", "trace.rho")
    assert suite.specs[0].point_label == "trace.zipf_alpha=0.5, trace.rho=0.3"


def test_run_ids_are_content_hashes_not_positions(make_suite) -> None:
    ids = {s.run_id for s in load_suite(make_suite(SWEEP)).specs}
    assert len(ids) == 16 and all(len(i) == 16 and int(i, 16) >= 0 for i in ids)
    reordered = SWEEP.replace('["greedy", "static"]', '["static", "greedy"]')
    reordered = reordered.replace("[0.5, 1.1]", "[1.1, 0.5]")
    assert {s.run_id for s in load_suite(make_suite(reordered, "again")).specs} == ids
    # the same runs inside a bigger sweep keep their ids: resume finds them
    extended = SWEEP.replace("[0.5, 1.1]", "[0.5, 1.1, 2.0]")
    assert ids < {s.run_id for s in load_suite(make_suite(extended, "more")).specs}
    # a default written out explicitly is the same instance
    explicit = SWEEP + '[set]\n"policy.window_batches" = 4\n'
    assert {s.run_id for s in load_suite(make_suite(explicit, "explicit")).specs} == ids
    changed = SWEEP + '[set]\n"policy.window_batches" = 6\n'
    assert not ids & {s.run_id for s in load_suite(make_suite(changed, "changed")).specs}


def test_groups_inherit_and_override_the_top_level(make_suite) -> None:
    text = """
instance = "inst.toml"
methods = ["greedy"]
time_limit_s = 5
[set]
"trace.rho" = 0.2
"hardware.d2d_bandwidth_gb_s" = 80
[[group]]
name = "a"
[[group]]
name = "b"
methods = ["milp", "lp"]
windows = [0, 2]
seeds = [7]
set = { "trace.rho" = 0.9 }
"""
    suite = load_suite(make_suite(text))
    a = [s for s in suite.specs if s.group == "a"]
    b = [s for s in suite.specs if s.group == "b"]
    assert [(s.method, s.seed, s.window) for s in a] == [("greedy", 3, 0)]  # the instance's own seed
    assert {(s.method, s.seed, s.window) for s in b} == {(m, 7, w) for m in ("milp", "lp") for w in (0, 2)}
    ia, ib = a[0].instance(), b[0].instance()
    assert (ia.trace.rho, ib.trace.rho) == (0.2, 0.9)
    assert ia.hardware.d2d_bandwidth_gb_s == ib.hardware.d2d_bandwidth_gb_s == 80
    assert ia.policy.time_limit_s == b[0].time_limit_s == 5
    assert suite.name == "suite" and [g.name for g in suite.groups] == ["a", "b"]


def test_linked_axis_changes_chiplets_with_per_chiplet_values(make_suite) -> None:
    text = """
instance = "inst.toml"
methods = ["greedy"]
[vary]
scale = [
  { label = "small", "hardware.chiplets" = 2, "hardware.nop_hops" = [1, 2] },
  { label = "big", "hardware.chiplets" = 8, "hardware.capacity_gb" = 2, "hardware.nop_hops" = 1 },
]
"""
    suite = load_suite(make_suite(text))
    small, big = (s.instance() for s in suite.specs)
    assert small.hardware.chiplets == 2 and small.hardware.nop_hops == (1, 2)
    assert small.hardware.capacity_gb == (4.0, 4.0)  # the base's uniform list follows the chiplet count
    assert big.hardware.chiplets == 8 and big.hardware.capacity_gb == (2.0,) * 8
    assert big.hardware.nop_hops == (1,) * 8
    assert [s.point_label for s in suite.specs] == ["scale=small", "scale=big"]
    assert dict(suite.specs[0].point) == {"hardware.chiplets": 2}  # list values are not columns
    assert suite.groups[0].axes == ("hardware.chiplets", "hardware.capacity_gb", "hardware.nop_hops")


def test_expand_suite_from_a_table(tmp_path: Path, table: dict[str, Any]) -> None:
    (tmp_path / "inst.toml").write_text(tomli_w.dumps(table), encoding="utf-8")
    suite = expand_suite({"instance": "inst.toml", "methods": ["eplb"]}, tmp_path / "inline.toml")
    assert len(suite.specs) == 1 and suite.specs[0].suite == "inline"
    assert json.loads(suite.specs[0].instance_json)["model"]["layers"] == 3


HEAD = 'instance = "inst.toml"\n'
GREEDY = HEAD + 'methods = ["greedy"]\n'


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        (GREEDY + "bogus = 1\n", ["bogus", "unknown key"]),
        (HEAD, ["methods", "missing"]),
        (HEAD + 'methods = ["nope"]\n', ["methods", "'nope' is not a method of slow-loop"]),
        (HEAD + 'methods = ["milp"]\nkind = "evaluate"\n', ["'milp' is not a method of evaluate"]),
        (HEAD + 'methods = ["comoe"]\nkind = "evaluate"\nwindows = [1]\n', ["windows", "no windows"]),
        (HEAD + 'methods = "greedy"\n', ["methods", "list of strings"]),
        (HEAD + 'methods = ["static"]\nkind = "fast-loop"\n', ["kind", "not available yet"]),
        (HEAD + 'methods = ["static"]\nkind = "magic"\n', ["kind", "unknown run kind"]),
        (GREEDY + "seeds = [1, 1]\n", ["seeds", "repeats"]),
        (GREEDY + "seeds = [-1]\n", ["seeds", ">= 0"]),
        (GREEDY + "time_limit_s = 0\n", ["time_limit_s", "> 0"]),
        (GREEDY + 'vary = { "trace.rho" = 0.5 }\n', ["vary.trace.rho", "list"]),
        (GREEDY + 'vary = { "trace.rho" = [2.0] }\n', ["trace.rho", "<= 1"]),
        (GREEDY + 'set = { "trace.zipf_alpa" = 1 }\n', ["zipf_alpa", "unknown"]),
        (GREEDY + 'set = { "trace.seed" = 1 }\n', ["set.trace.seed", "seeds"]),
        (GREEDY + 'set = { "a.b.c" = 1 }\n', ["a.b.c", "section.key"]),
        ('instance = "missing.toml"\nmethods = ["greedy"]\n', ["missing.toml", "no such instance file"]),
        ('methods = ["greedy"]\n', ["instance", "missing"]),
        (GREEDY + "[[group]]\nseeds = [1]\n", ["group[0].name", "missing"]),
        (GREEDY + '[[group]]\nname = "x"\n[[group]]\nname = "x"\n', ["group[1].name", "two groups"]),
        (HEAD + '[[group]]\nname = "g"\nmethods = ["full", "oops"]\n', ["group[0].methods", "'oops'"]),
        ("instance = [\n", ["not valid TOML"]),
    ],
)
def test_invalid_suites_fail_on_one_line_naming_file_and_key(cli, make_suite, text: str, needles) -> None:
    path = make_suite(text)
    result = cli("bench", path, "--dry-run")
    result.assert_user_error(*needles)
    if "missing.toml" not in needles:
        assert str(path) in result.err  # the suite file itself is named


def test_missing_suite_file(cli, tmp_path: Path) -> None:
    cli("bench", tmp_path / "nope.toml").assert_user_error("nope.toml", "no such suite file")


def test_dry_run_lists_runs(cli, make_suite) -> None:
    report = cli("bench", make_suite(SWEEP), "--dry-run", "--json").json()
    assert report["suite"] == "sweep" and len(report["runs"]) == 16


# runs counted by hand from the suite files: methods x seeds x values, per group
PAPER_RUNS = 6 * 3 * (6 + 5 + 6) + 5 * 1 * (6 + 5 + 6) + 6 * 1  # model sweeps, paper figures, ablations
LADDER_RUNS = 6 * 1 * 12 + 6 * 1  # 12 sizes, then DeepSeek-V3, six methods each


@pytest.mark.parametrize(
    ("name", "runs"),
    [("smoke.toml", 1 * 4 * 4), ("paper.toml", PAPER_RUNS), ("scale-ladder.toml", LADDER_RUNS)],
)
def test_committed_suites_expand(name: str, runs: int) -> None:
    suite = load_suite(ROOT / "benchmarks" / "suites" / name)
    assert len(suite.specs) == runs


def test_real_traces_suite_expands_when_its_instance_exists() -> None:
    instance = ROOT / "instances" / "real-gptoss20b.toml"
    if not instance.is_file():
        pytest.skip(f"{instance.name} is not in this checkout yet")
    trace = load_instance(instance).resolve(load_instance(instance).trace.path)
    if not Path(trace).is_file():
        pytest.skip(f"real trace not present at {trace}")
    suite = load_suite(ROOT / "benchmarks" / "suites" / "real-traces.toml")
    assert suite.specs and all(s.seed == 0 for s in suite.specs)


def test_docs_reference_is_current() -> None:
    """docs/bench.md matches the code; `python -m comoe_opt.bench.docs docs/bench.md` rewrites it."""
    text = (ROOT / "docs" / "bench.md").read_text(encoding="utf-8")
    assert generated(text, "suite keys").strip() == suite_reference().strip()
    assert generated(text, "columns").strip() == column_reference().strip()
