"""Hostile input: every mistake a user can make ends in exit 2 and one stderr line naming the
file, key or option, without allocating what the input merely declares, and no worker
process outlives a killed run.

One test (or parametrised case) per failure class: tracebacks, silent acceptance, several
stderr lines, orphan workers, and the smaller ones.
"""

from __future__ import annotations

import json
import math
import os
import select
import signal
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tomli_w
from conftest import BASELINE, ROOT, make_problem

from comoe_opt.errors import InputError
from comoe_opt.npzfile import read_npz
from comoe_opt.trace import read_trace


def lying_npz(path: Path, name: str, shape: tuple[int, ...], dtype: str = "<i2") -> Path:
    """An .npz whose member header declares `shape` but holds 16 bytes of data."""
    header = {"descr": dtype, "fortran_order": False, "shape": shape}
    text = repr(header).encode("latin1")
    pad = 64 - (10 + len(text) + 1) % 64
    member = b"\x93NUMPY\x01\x00" + (len(text) + pad + 1).to_bytes(2, "little") + text + b" " * pad + b"\n"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}.npy", member + b"\x00" * 16)
    return path


def write_instance(tmp_path: Path, table: dict[str, Any], name: str = "inst") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(tomli_w.dumps(table), encoding="utf-8")
    return path


# ------------------------------------------------------------------ 1. tracebacks


def test_npy_renamed_to_npz_is_one_line_everywhere(tmp_path: Path, cli, table) -> None:
    renamed = tmp_path / "routing.npz"
    np.save(tmp_path / "routing.npy", np.zeros((4, 3, 2), np.int16))
    (tmp_path / "routing.npy").rename(renamed)
    instance = write_instance(tmp_path, table)
    for args in (
        ("trace", "info", renamed),
        ("solve", instance, "--trace", renamed),
        ("gap", instance, "--trace", renamed),
        ("solve", instance, "--counts", renamed),
    ):
        cli(*args).assert_user_error("routing.npz", "single .npy array")


def test_text_file_named_npz_is_not_called_pickled(tmp_path: Path, cli) -> None:
    path = tmp_path / "notes.npz"
    path.write_text("hello\n", encoding="utf-8")
    line = cli("trace", "info", path).assert_user_error("notes.npz", "no zip header")
    assert "pickle" not in line


@pytest.mark.parametrize(
    ("name", "shape"),
    [("topk", (10**12, 4, 2)), ("counts", (10**9, 10**9)), ("topk", (2**62, 2))],
)
def test_declared_shapes_are_checked_before_allocating(tmp_path: Path, cli, name, shape) -> None:
    path = lying_npz(tmp_path / "huge.npz", name, shape)
    with pytest.raises(InputError, match=rf"huge\.npz: {name}: declares shape"):
        read_npz(path)
    cli("trace", "info", path).assert_user_error("huge.npz", name, "declares shape")


def test_declared_shape_larger_than_the_stored_bytes(tmp_path: Path) -> None:
    path = lying_npz(tmp_path / "short.npz", "topk", (100, 3, 2))  # 1200 bytes declared, 16 held
    with pytest.raises(InputError, match=r"declares shape .* but holds only 16 bytes"):
        read_npz(path)


def test_object_arrays_are_never_unpickled(tmp_path: Path) -> None:
    path = tmp_path / "obj.npz"
    np.savez(path, topk=np.array([{"a": 1}], dtype=object))
    with pytest.raises(InputError, match="pickled"):
        read_npz(path)


def test_npz_reader_round_trips_every_layout(tmp_path: Path) -> None:
    arrays = {
        "c": np.arange(24, dtype=np.int16).reshape(2, 3, 4),
        "f": np.asfortranarray(np.arange(6, dtype=np.float64).reshape(2, 3)),
        "scalar": np.array(7, dtype=np.int64),
        "text": np.array("meta"),
        "empty": np.zeros((0, 3), np.float32),
    }
    np.savez_compressed(tmp_path / "a.npz", **arrays)
    read = read_npz(tmp_path / "a.npz")
    assert read.keys() == arrays.keys()
    for key, value in arrays.items():
        assert read[key].dtype == value.dtype and np.array_equal(read[key], value)
        assert read[key].flags.writeable


def test_declared_expert_counts_are_capped(tmp_path: Path, cli) -> None:
    npz = tmp_path / "t.npz"
    np.savez(npz, topk=np.zeros((4, 2, 2), np.int16) + np.array([0, 1]), num_experts=np.array(10**12))
    cli("trace", "info", npz).assert_user_error("t.npz", "num_experts", "<= 65536")
    parquet = tmp_path / "t.parquet"
    header = {"num_experts": 10**12, "version": 1}
    columns = pa.table({"e0_0": pa.array([0, 1], pa.int16()), "e0_1": pa.array([1, 0], pa.int16())})
    pq.write_table(columns.replace_schema_metadata({"comoe-trace": json.dumps(header)}), parquet)
    cli("trace", "info", parquet).assert_user_error("t.parquet", "num_experts", "<= 65536")


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("trace", "tokens_per_batch", 10**12),
        ("trace", "micro_batches", 2**63 - 1),
        ("model", "experts_per_layer", 10**9),
        ("model", "layers", 10**9),
        ("hardware", "chiplets", 10**9),
        ("model", "top_k", 10**6),
    ],
)
def test_sizes_have_upper_limits(tmp_path: Path, cli, table, section, key, value) -> None:
    table[section][key] = value
    if key == "chiplets":
        table["hardware"]["nop_hops"] = 1
    path = write_instance(tmp_path, table)
    cli("instance", "show", path).assert_user_error("inst.toml", f"{section}.{key}", "must be <=")


def test_products_of_sizes_have_limits(tmp_path: Path, cli, table) -> None:
    table["model"].update(layers=1000, experts_per_layer=4000, top_k=8)
    table["hardware"].update(chiplets=64, nop_hops=1)
    cli("instance", "show", write_instance(tmp_path, table)).assert_user_error(
        "hardware.chiplets", "layers x experts_per_layer x chiplets"
    )
    small = {**table["model"], "layers": 100, "experts_per_layer": 64}
    table["model"] = small
    table["trace"].update(micro_batches=10**6, tokens_per_batch=4096)
    cli("instance", "show", write_instance(tmp_path, table)).assert_user_error(
        "trace.micro_batches", "routes exceeds"
    )


def test_decode_batching_counts_the_whole_requests_it_draws(tmp_path: Path, cli, table) -> None:
    """64 steps of 9,216 in flight fit the routes limit, but decode batching draws whole requests
    for ~2 mean lengths past the steps: 512-token requests would allocate 46 GiB."""
    table["model"].update(layers=58, experts_per_layer=256, top_k=8)
    table["hardware"].update(chiplets=32, nop_hops=1)
    table["trace"].update(micro_batches=64, tokens_per_batch=9216, sequence_tokens=512, batching="decode")
    cli("instance", "show", write_instance(tmp_path, table)).assert_user_error(
        "trace.micro_batches", "tokens drawn (decode batching", "routes exceeds"
    )
    table["trace"].update(sequence_tokens=16, batching="token-order")  # the steps' own tokens only
    assert cli("instance", "show", write_instance(tmp_path, table)).code == 0


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (("evaluate", BASELINE, "--strategies", ""), ("--strategies", "none named")),
        (("evaluate", BASELINE, "--strategies", " , "), ("--strategies",)),
        (("gap", BASELINE, "--seed", "-1"), ("--seed", ">= 0")),
        (("solve", BASELINE, "--gap", "-0.1"), ("--gap", "policy.mip_gap", ">= 0")),
        (("gap", BASELINE, "--windows", "0"), ("--windows",)),
        (("evaluate", BASELINE, "--jobs", "0"), ("--jobs",)),
        (("paper", BASELINE, "--sweep-batches", "0"), ("--sweep-batches",)),
        (("paper", BASELINE, "--regime", "nowhere.toml"), ("nowhere.toml", "no such instance file")),
    ],
)
def test_bad_options_are_one_line(cli, args, needles) -> None:
    cli(*args).assert_user_error(*needles)


def test_deeply_nested_and_huge_json(tmp_path: Path, cli) -> None:
    nested = tmp_path / "nested.json"
    nested.write_text("[" * 100_000, encoding="utf-8")
    huge = tmp_path / "huge.json"
    huge.write_text(json.dumps({"logical_count": [[1] * 64] * 3}).replace("1", "1" + "0" * 400, 1))
    cli("solve", BASELINE, "--counts", nested).assert_user_error("nested.json", "nested too deeply")
    cli("gap", BASELINE, "--placement", nested).assert_user_error("nested.json", "nested too deeply")
    cli("solve", BASELINE, "--counts", huge).assert_user_error("huge.json", "logical_count[0][0]", "above")


def test_non_finite_values_in_a_suite(tmp_path: Path, cli, table) -> None:
    write_instance(tmp_path, table)
    suite = tmp_path / "suite.toml"
    suite.write_text(
        'instance = "inst.toml"\nmethods = ["greedy"]\n[vary]\n"trace.zipf_alpha" = [0.8, nan]\n'
    )
    cli("bench", suite, "--dry-run").assert_user_error("suite.toml", "vary.trace.zipf_alpha", "finite")
    suite.write_text('instance = "inst.toml"\nmethods = ["greedy"]\n[set]\n"trace.rho" = inf\n')
    cli("bench", suite, "--dry-run").assert_user_error("suite.toml", "set.trace.rho", "finite")


def test_paper_out_must_be_a_writable_folder(tmp_path: Path, cli) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for out in (blocker, blocker / "below"):
        line = cli("paper", BASELINE, "--out", out, "--table5-batches", "1").assert_user_error("--out")
        assert str(out) in line


def test_broken_pipe_is_quiet() -> None:
    command = [sys.executable, "-m", "comoe_opt.cli", "instance", "show", str(BASELINE), "--json"]
    reader = subprocess.Popen(["head", "-c", "1"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    done = subprocess.run(command, stdout=reader.stdin, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    reader.stdin.close()
    reader.wait()
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    assert done.returncode == 0


# ------------------------------------------------------- 2. silently accepted


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_time_limit_option_is_validated_like_the_file(cli, value) -> None:
    cli("solve", BASELINE, "--time-limit", value).assert_user_error("--time-limit", "policy.time_limit_s")


@pytest.mark.parametrize("value", ["1.5", "inf", "nan", "-0.1"])
def test_gap_option_is_validated_like_the_file(cli, value) -> None:
    cli("solve", BASELINE, "--gap", value).assert_user_error("--gap", "policy.mip_gap")


@pytest.mark.parametrize("value", ["-1", "-5"])
def test_negative_micro_batches_are_refused(cli, value) -> None:
    cli("evaluate", BASELINE, "--micro-batches", value).assert_user_error("--micro-batches")


def test_overflowing_counts_are_refused(tmp_path: Path, cli) -> None:
    path = tmp_path / "counts.json"
    path.write_text(json.dumps({"logical_count": [[1e308] * 64] * 3}))
    cli("solve", BASELINE, "--counts", path).assert_user_error("counts.json", "above 1e+15")
    npz = tmp_path / "counts.npz"
    np.savez(npz, logical_count=np.full((3, 64), 1e308))
    cli("solve", BASELINE, "--counts", npz).assert_user_error("counts.npz", "logical_count[0][0]")


def test_set_refuses_text_after_a_line_break(cli) -> None:
    line = cli("evaluate", BASELINE, "--set", "model.layers=4\nmodel.top_k=9").assert_user_error("--set")
    assert "one line" in line


def test_a_milp_stopped_before_its_root_bound_reports_the_lp_bound(monkeypatch) -> None:
    """The solver stopping before any bound (as a very short time limit does) is simulated, so the
    test does not depend on timing: the result must still carry a bound, the LP relaxation's."""
    import importlib

    from comoe_opt.highs import HighsOutcome
    from comoe_opt.residency.solve import solve
    from comoe_opt.results import Status

    solve_module = importlib.import_module("comoe_opt.residency.exact.pipeline")  # the models' phases
    real = solve_module.solve_with_highs
    calls = []

    def stopped_first(model, **kwargs):
        calls.append(kwargs)
        if len(calls) == 1:
            return HighsOutcome(Status.TIME_LIMIT, float("inf"), float("-inf"), 0.0, "time limit")
        return real(model, **kwargs)

    monkeypatch.setattr(solve_module, "solve_with_highs", stopped_first)
    problem = make_problem(
        miss=[[5.0, 3.0, 2.0, 1.0]], work=[[4.0, 2.0, 1.0, 1.0]], capacity=[2, 2, 2], budget=5
    )
    result = solve(problem, "milp", time_limit_s=math.inf, mip_gap=1e-6)
    assert np.isfinite(result.bound) and result.bound <= result.objective + 1e-9
    assert result.report.replica_model_bound_from.startswith("LP relaxation")
    lp = solve_module.solve_lp(problem)  # the full-model polish of a small instance may raise it further
    assert result.bound >= lp.bound - 1e-9 and np.isfinite(lp.bound)


# --------------------------------------------------- 3. several stderr lines


def test_corrupt_and_duplicated_parquet_are_one_line(tmp_path: Path, cli) -> None:
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"e0_0": pa.array(np.arange(1000) % 4, pa.int16())}), good)
    data = bytearray(good.read_bytes())
    data[100:400] = b"\xff" * 300  # a corrupt page
    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_bytes(bytes(data))
    cli("trace", "info", corrupt).assert_user_error("corrupt.parquet")
    duplicated = tmp_path / "dup.parquet"
    column = pa.array([0, 1], pa.int16())
    pq.write_table(pa.Table.from_arrays([column, column, column], names=["e0_0", "e0_1", "e0_1"]), duplicated)
    cli("trace", "info", duplicated).assert_user_error("dup.parquet", "e0_1", "more than once")


def test_bench_out_is_checked_before_the_first_run(tmp_path: Path, cli, table) -> None:
    write_instance(tmp_path, table)
    suite = tmp_path / "suite.toml"
    suite.write_text('instance = "inst.toml"\nmethods = ["greedy", "static"]\n')
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    for out in (blocker, blocker / "below"):
        result = cli("bench", suite, "--jobs", "1", "--out", out, "--no-plots")
        line = result.assert_user_error("--out", str(out))
        assert "not a folder" in line or "cannot write" in line
        assert "runs to do" not in result.err + result.out  # no run was started


# ------------------------------------------------------ 4. orphan workers

ORPHAN_SCRIPT = """
import os, threading
from comoe_opt.parallel import parallel_map

def work(i):
    print(os.getpid(), flush=True)
    threading.Event().wait()  # blocks until the worker is stopped: no sleep
    return i

if __name__ == "__main__":
    parallel_map(work, [0, 1], 2)
"""


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_workers_exit_when_their_parent_is_killed(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(ORPHAN_SCRIPT)
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    workers = [int(parent.stdout.readline()) for _ in range(2)]
    assert all(_running(w) for w in workers)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    # wait for each worker's exit itself (a pidfd is readable once the process has ended); the
    # bound only turns a worker that never exits into a failure instead of a hang
    for worker in workers:
        try:
            fd = os.pidfd_open(worker)
        except ProcessLookupError:
            continue  # gone already
        try:
            ended, _, _ = select.select([fd], [], [], 600)
        finally:
            os.close(fd)
        assert ended or not _running(worker), "a worker outlived its killed parent"


# ----------------------------------------------------------- 5. smaller things


def test_parquet_header_layers_must_match_the_columns(tmp_path: Path, cli) -> None:
    path = tmp_path / "layers.parquet"
    columns = {f"e{layer}_0": pa.array([0, 1], pa.int16()) for layer in (0, 1, 2)}
    header = {"layers": [9, 8, 7], "version": 1}
    pq.write_table(pa.table(columns).replace_schema_metadata({"comoe-trace": json.dumps(header)}), path)
    cli("trace", "info", path).assert_user_error("layers.parquet", "layers", "[9, 8, 7]")
    with pytest.raises(InputError):
        read_trace(path)


def test_a_suite_key_in_set_and_vary_is_refused(tmp_path: Path, cli, table) -> None:
    write_instance(tmp_path, table)
    suite = tmp_path / "suite.toml"
    suite.write_text(
        'instance = "inst.toml"\nmethods = ["greedy"]\n[set]\n"trace.rho" = 0.5\n'
        '[vary]\n"trace.rho" = [0.3, 0.6]\n'
    )
    cli("bench", suite, "--dry-run").assert_user_error("vary.trace.rho", "also fixed by set.trace.rho")


def test_a_huge_suite_is_refused_before_expanding(tmp_path: Path, cli, table) -> None:
    write_instance(tmp_path, table)
    suite = tmp_path / "suite.toml"
    values = ", ".join(f"{0.5 + i / 1000:.3f}" for i in range(800))
    seeds = ", ".join(str(i) for i in range(800))
    suite.write_text(
        f'instance = "inst.toml"\nmethods = ["greedy"]\nseeds = [{seeds}]\n'
        f'[vary]\n"trace.zipf_alpha" = [{values}]\n'
    )
    cli("bench", suite, "--dry-run").assert_user_error("suite.toml", "more than 100,000 runs")


def test_changing_chiplets_names_the_per_chiplet_key(cli) -> None:
    cli("evaluate", BASELINE, "--set", "hardware.chiplets=16").assert_user_error(
        "hardware.nop_hops", "one value per chiplet (16)"
    )


# ------------------------------------------------------- derived quantities and layer rows


@pytest.mark.parametrize(
    ("section", "key", "value", "needle"),
    [
        ("hardware", "d2d_bandwidth_gb_s", 1e-308, "model.page_gb / hardware.d2d_bandwidth_gb_s"),
        ("model", "page_gb", 1e-300, "model.page_gb / hardware.d2d_bandwidth_gb_s"),
        ("hardware", "local_bandwidth_gb_s", 1e-300, "hardware.local_bandwidth_gb_s"),
        ("hardware", "copy_inter_node_gb_s", 1e-300, "hardware.copy_inter_node_gb_s"),
    ],
)
def test_derived_times_and_pages_are_checked(tmp_path: Path, cli, table, section, key, value, needle) -> None:
    """Each value passes its own key's range (each key's own upper limit refuses 1e308 first:
    test_every_run_ends.py); what the loops derive from it does not."""
    table[section][key] = value
    instance = write_instance(tmp_path, table)
    for args in (("instance", "show", instance), ("solve", instance), ("evaluate", instance)):
        cli(*args).assert_user_error("inst.toml", needle)


def test_a_dump_with_rows_of_another_model_is_refused(tmp_path: Path, cli, table) -> None:
    """SGLang-style dump of 6 layer rows for a 3-layer model: never silently cut to 3 rows."""
    dump = tmp_path / "dump.json"
    dump.write_text(json.dumps({"logical_count": np.ones((2, 6, 8)).tolist()}))
    cli("solve", write_instance(tmp_path, table), "--counts", dump).assert_user_error(
        "dump.json", "6 layer rows", "3 layers"
    )


def test_work_limits_and_a_time_limit_exclude_each_other(cli) -> None:
    both = cli("solve", BASELINE, "--work-limits", "--time-limit", "5")
    both.assert_user_error("--work-limits", "--time-limit")
