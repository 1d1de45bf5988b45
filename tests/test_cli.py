"""The command line: every verb's output, --json, and one-line user errors."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from conftest import BASELINE

from comoe_opt import __version__
from comoe_opt.instance import instance_from_table, load_instance, to_table
from comoe_opt.trace import Trace, instance_trace, read_trace, write_trace


def test_trace_info_paper_baseline_json(cli) -> None:
    result = cli("trace", "info", "--json", BASELINE)
    assert result.code == 0, result.err
    report = result.json()
    s = report["summary"]
    assert report["source"] == "instance paper-baseline"
    assert report["kind"] == "per-token"
    assert s["layers"] == 32 and s["experts"] == 64 and s["top_k"] == 2
    assert s["tokens"] == 1000 * 64 and s["micro_batches"] == 1000 and s["tokens_per_batch"] == 64
    # within a window (one drift phase) the rank-1 skew is the instance's alpha 1.1
    assert abs(s["alpha_top1_window_mean"] - 1.1) < 0.1
    assert s["predictability_mean"] > 2 * s["popularity_guess_mean"]
    assert len(report["layers"]) == 32


def test_trace_info_text(cli, table: dict, write_toml: Callable[..., Path]) -> None:
    result = cli("trace", "info", write_toml(table))
    assert result.code == 0 and result.err == ""
    first = result.out.splitlines()[0]
    assert first == "instance small: per-token trace, 3 logged layers, 8 experts, top-2, 96 tokens"
    assert "Zipf alpha within windows" in result.out


def test_instance_show(cli, write_toml: Callable[..., Path], table: dict) -> None:
    path = write_toml(table)
    text = cli("instance", "show", path)
    assert text.code == 0
    assert text.out == load_instance(path).to_toml() + "\n"
    report = cli("instance", "show", "--json", path).json()
    assert report["instance"] == "small"
    again = instance_from_table(tomllib.loads(report["toml"]), "again.toml")
    assert to_table(again) == to_table(load_instance(path))


def test_trace_gen_then_info(cli, write_toml: Callable[..., Path], table: dict, tmp_path: Path) -> None:
    inst = write_toml(table)
    for suffix in (".npz", ".parquet"):
        out = tmp_path / f"gen{suffix}"
        gen = cli("trace", "gen", "--json", inst, "-o", out)
        assert gen.code == 0, gen.err
        report = gen.json()
        assert report == {
            "path": str(out),
            "tokens": 12 * 8,
            "layers": 3,
            "top_k": 2,
            "experts": 8,
        }
        trace = read_trace(out)
        assert isinstance(trace, Trace)
        expected = load_instance(inst)

        assert np.array_equal(trace.topk, instance_trace(expected).topk)
        assert trace.meta["seed"] == 3
        info = cli("trace", "info", "--json", out)
        assert info.code == 0, info.err
        stats = info.json()
        assert stats["source"] == str(out)
        assert stats["summary"]["tokens"] == 96 and stats["summary"]["layers"] == 3
        text = cli("trace", "info", out)
        assert text.code == 0
        assert text.out.startswith(f"{out}: per-token trace, 3 logged layers, 8 experts, top-2, 96 tokens")


def test_trace_gen_text(cli, write_toml: Callable[..., Path], table: dict, tmp_path: Path) -> None:
    out = tmp_path / "t.npz"
    result = cli("trace", "gen", write_toml(table), "-o", out)
    assert result.code == 0
    assert result.out.strip() == f"wrote {out}: 96 tokens x 3 layers x top-2"


def test_trace_info_on_instance(cli, write_toml: Callable[..., Path], table: dict) -> None:
    path = write_toml(table)
    via_info = cli("trace", "info", "--json", path).json()
    assert via_info["summary"]["micro_batches"] == 12
    assert cli("run", path).code == 2  # `run` is gone: `trace info` is the instance's statistics


def test_file_trace_instance(
    cli, write_toml: Callable[..., Path], table: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file-trace instance reads its trace relative to the instance file, in decode steps."""
    rng = np.random.default_rng(0)
    tokens = 40
    topk = np.argsort(rng.random((tokens, 3, 8)), axis=2)[:, :, :2].astype(np.int16)
    seq_id = np.repeat(np.arange(8, dtype=np.int32), 5)
    write_trace(Trace(topk=topk, num_experts=8, seq_id=seq_id), tmp_path / "traces" / "real.npz")
    table["trace"] = {"kind": "file", "path": "traces/real.npz", "tokens_per_batch": 4}
    path = write_toml(table)
    monkeypatch.chdir(tmp_path / "traces")  # the path is relative to the instance, not the cwd
    report = cli("trace", "info", "--json", path).json()
    # 8 sequences of 5 tokens, 4 in flight: 2 rounds of 5 full steps
    assert report["summary"]["micro_batches"] == 10
    assert report["summary"]["tokens_per_batch"] == 4
    assert report["summary"]["sequences"] == 8
    table["trace"]["micro_batches"] = 3
    assert cli("trace", "info", "--json", write_toml(table)).json()["summary"]["micro_batches"] == 3


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"model": {"layers": 4}}, "has 3 layers, the instance's model 4"),
        ({"model": {"top_k": 3}}, "has top-2 routing, the instance's model top-3"),
        ({"model": {"experts_per_layer": 16}}, "file has 8 experts, the instance 16"),
        ({"trace": {"path": "missing.npz"}}, "no such trace file"),
        ({"trace": {"path": "agg.npz"}}, "aggregates only"),
        ({"trace": {"tokens_per_batch": 1000}}, "do not fill one micro-batch"),
    ],
    ids=["layers", "top-k", "experts", "missing", "aggregate", "too-few-tokens"],
)
def test_file_trace_mismatch(
    cli, write_toml: Callable[..., Path], table: dict, tmp_path: Path, change: dict, problem: str
) -> None:
    rng = np.random.default_rng(0)
    topk = np.argsort(rng.random((20, 3, 8)), axis=2)[:, :, :2].astype(np.int16)
    write_trace(Trace(topk=topk, num_experts=8), tmp_path / "real.npz")
    np.savez(tmp_path / "agg.npz", counts=np.ones((3, 8), np.int64))
    table["trace"] = {"kind": "file", "path": "real.npz", "tokens_per_batch": 4}
    for section, values in change.items():
        table[section].update(values)
    path = write_toml(table)
    for verb in (["solve"], ["trace", "info"]):
        cli(*verb, path).assert_user_error(problem)


def test_trace_gen_bad_output_suffix(
    cli, write_toml: Callable[..., Path], table: dict, tmp_path: Path
) -> None:
    out = tmp_path / "trace.csv"
    cli("trace", "gen", write_toml(table), "-o", out).assert_user_error("trace.csv", "unknown trace format")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inst.toml"]


def test_trace_gen_output_is_directory(
    cli, write_toml: Callable[..., Path], table: dict, tmp_path: Path
) -> None:
    out = tmp_path / "out.npz"
    out.mkdir()
    inst = write_toml(table)
    try:
        result = cli("trace", "gen", inst, "-o", out)
    except OSError:
        pytest.fail("OSError escaped from the CLI")
    result.assert_user_error("out.npz")


@pytest.mark.parametrize(
    "args",
    [
        ["solve"],
        ["bogus"],
        ["trace", "gen", "x.toml"],  # -o is required
        ["trace", "info", "a", "b"],
        ["trace", "info", "--nope", "x.toml"],
    ],
    ids=["missing-argument", "unknown-verb", "missing-option", "extra-argument", "unknown-option"],
)
def test_usage_errors_one_line(cli, args: list[str]) -> None:
    result = cli(*args)
    line = result.assert_user_error("error:")
    assert "(see --help)" in line
    assert result.out == ""


def test_no_verb_prints_help(cli) -> None:
    result = cli()
    assert result.code == 2
    assert "usage: comoe-opt" in result.out


def test_version(cli) -> None:
    result = cli("--version")
    assert result.code == 0
    assert result.out.strip() == f"comoe-opt {__version__}"


def test_a_closed_pipe_is_not_an_error(write_toml: Callable[..., Path], table: dict) -> None:
    """`comoe-opt ... | head -1`: the reader may go away before the output is written."""
    import subprocess
    import sys

    script = Path(sys.executable).parent / "comoe-opt"
    if not script.exists():
        pytest.skip(f"console script not installed at {script}")
    proc = subprocess.Popen(
        [str(script), "instance", "show", str(write_toml(table))],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.close()  # before the verb has printed anything
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0
    assert b"Traceback" not in err and err == b""


def test_help_names_are_the_librarys() -> None:
    """The parser lists methods and strategies without importing the solvers: the names must be
    exactly the library's, and the paper's defaults its settings'."""
    from comoe_opt.cli import choices
    from comoe_opt.evaluator.paper import PaperSettings
    from comoe_opt.evaluator.strategies import STRATEGIES, TABLE4
    from comoe_opt.residency import RESIDENCY_METHODS

    assert tuple(choices.RESIDENCY_METHODS) == tuple(RESIDENCY_METHODS)
    assert tuple(choices.STRATEGIES) == tuple(STRATEGIES)
    assert all(choices.STRATEGIES.values())  # every strategy describes itself where it is defined
    assert all(choices.RESIDENCY_METHODS.values())
    assert (*TABLE4, "eplb") == choices.DEFAULT_STRATEGIES
    assert PaperSettings.sweep_batches == choices.PAPER_SWEEP_BATCHES
    assert PaperSettings.table5_batches == choices.PAPER_TABLE5_BATCHES


def test_help_imports_no_solver() -> None:
    """`comoe-opt --help` and each verb's help build the parser only: no Pyomo, OR-Tools, pandas."""
    code = (
        "import sys\n"
        "from comoe_opt.cli import main\n"
        "for argv in (['--help'], ['solve', '--help'], ['evaluate', '--help'], ['bench', '--help']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "heavy = [m for m in ('pyomo', 'ortools', 'pandas', 'highspy', 'scipy') if m in sys.modules]\n"
        "print(heavy, file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stderr.strip() == "[]", done.stderr
    assert "eplb-flow: EPLB's placement" in done.stdout and "exact: milp, then" in done.stdout
