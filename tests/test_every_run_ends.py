"""Every run ends: solver calls bounded by work, signals that stop a verb, flags that conflict
refused before any work, load dumps that are instances of their own.

No assertion here rests on how fast this machine is: the signal tests give the command a
generous minute to end (the watchdog ends it about a second after the signal).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import highspy
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from comoe_opt.balancers.engines.ascend_flashlb import ascend_flashlb
from comoe_opt.highs import DirectModel, UnboundedSolve, lp_work, mip_work, nodes_within
from comoe_opt.residency.models.cut_model import _RoundBudget
from comoe_opt.residency.schedule import RoundWork
from comoe_opt.trace.from_counts import capped_apportion, tokens_of_counts

# ------------------------------------------------------------------ solver calls bounded by work


def _knapsack(integer: bool) -> DirectModel:
    m = DirectModel()
    first = m.add_columns([-3.0, -2.0, -4.0], [0, 0, 0], [1, 1, 1], integer=integer)
    m.add_row(-highspy.kHighsInf, 4.0, [first, first + 1, first + 2], [2.0, 1.0, 3.0])
    return m


def test_a_solver_call_without_any_limit_is_refused():
    with pytest.raises(UnboundedSolve, match="node limit"):
        _knapsack(integer=True).solve()
    with pytest.raises(UnboundedSolve, match="iteration limit"):
        _knapsack(integer=False).solve()
    with pytest.raises(UnboundedSolve, match="node limit"):  # an LP's iteration limit does not bound a MIP
        _knapsack(integer=True).solve(options=lp_work(1, 3))


def test_work_limits_or_a_time_limit_let_it_run():
    assert _knapsack(integer=True).solve(options=mip_work(100)).objective == pytest.approx(-6.0)
    assert _knapsack(integer=False).solve(options=lp_work(1, 3)).objective == pytest.approx(-19 / 3)
    assert _knapsack(integer=True).solve(time_limit_s=60.0, options=mip_work(10)).objective == pytest.approx(
        -6
    )


def test_nodes_shrink_with_the_rows():
    assert nodes_within(rows=100, node_rows=50_000, most=100) == 100
    assert nodes_within(rows=1286, node_rows=50_000, most=100) == 38
    assert nodes_within(rows=10**7, node_rows=50_000, most=100) == 1


def test_cut_rounds_stop_when_they_stall_or_the_work_is_spent():
    budget = _RoundBudget(RoundWork(round_nodes=100, node_rows=1000, stall_rounds=2))
    assert budget.next_round(rows=4) == 100
    budget.after_round(100, closed=False, moved=True)  # 400 node-rows spent
    assert budget.next_round(rows=4) == 100
    budget.after_round(100, closed=False, moved=False)  # stalled once: 800 spent
    assert budget.next_round(rows=4) == 50  # what is left of the node-rows
    budget.after_round(50, closed=True, moved=False)  # a round that closed is no stall
    assert budget.next_round(rows=4) == 0 and "spent" in budget.reason
    stalls = _RoundBudget(RoundWork(round_nodes=10, node_rows=10**9, stall_rounds=2))
    for _ in range(2):
        assert stalls.next_round(rows=1) == 10
        stalls.after_round(10, closed=False, moved=False)
    assert stalls.next_round(rows=1) == 0 and "no gain" in stalls.reason
    assert _RoundBudget(None).next_round(rows=5) is None  # a time limit bounds the rounds instead


# ------------------------------------------------------------------ a load dump's tokens


@given(
    st.integers(1, 4),
    st.integers(1, 3),
    st.integers(2, 12),
    st.integers(1, 30),
    st.data(),
)
def test_a_dumps_steps_become_tokens_of_distinct_experts(steps, layers, experts, tokens, data):
    top_k = data.draw(st.integers(1, experts))
    counts = np.array(
        data.draw(
            st.lists(st.integers(0, 60), min_size=steps * layers * experts, max_size=steps * layers * experts)
        )
    ).reshape(steps, layers, experts)
    topk = tokens_of_counts(counts, tokens, top_k)
    assert topk.shape == (steps * tokens, layers, top_k)
    ordered = np.sort(topk, axis=2)
    assert (np.diff(ordered, axis=2) > 0).all(), "a token picked an expert twice"
    per_step = topk.reshape(steps, tokens, layers, top_k)
    for s in range(steps):
        for layer in range(layers):
            got = np.bincount(per_step[s, :, layer].ravel(), minlength=experts)
            want = counts[s, layer]
            assert got.sum() == tokens * top_k and got.max() <= tokens
            if want.sum() == tokens * top_k and want.max() <= tokens:
                assert (got == want).all(), "a step that fits is replayed exactly"


def test_apportioning_keeps_the_total_and_the_cap():
    quota = capped_apportion(np.array([[10.0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 5]]), 6, 2)
    assert quota.tolist() == [[2, 2, 1, 1], [2, 2, 1, 1], [2, 1, 1, 2]]  # ties to the first


# ------------------------------------------------------------------ a port that crashed


@given(st.integers(2, 8), st.integers(1, 5), st.integers(1, 8), st.integers(1, 3), st.data())
def test_flashlb_plans_any_valid_shape(experts, gpus, per_gpu, stages, data):
    slots = gpus * per_gpu
    if slots < experts:
        return
    counts = np.array(
        data.draw(st.lists(st.integers(0, 5), min_size=stages * experts, max_size=stages * experts))
    ).reshape(stages, 1, experts)
    phy2log, _, logcnt = ascend_flashlb(counts, slots, 1, 1, gpus)
    assert phy2log.shape == (1, slots)
    assert (logcnt >= 1).all() and logcnt.sum() == slots


# ------------------------------------------------------------------ a dump is an instance


@pytest.fixture
def dump(tmp_path: Path) -> Path:
    """A small sparse dump (counts 0-2): the kind that made compare run for minutes."""
    path = tmp_path / "dump.npz"
    np.savez(path, logical_count=np.random.default_rng(0).integers(0, 3, size=(12, 2, 8)))
    return path


def test_instance_new_writes_an_instance_every_verb_accepts(cli, dump, tmp_path):
    written = tmp_path / "sub" / "serving.toml"
    assert cli("instance", "new", "--from-counts", dump, "--gpus", "4", "-o", written).code == 0
    assert 'path = "../dump.npz"' in written.read_text()
    from_file = cli("compare", written, "--peers", "eplb,comoe", "--bound-windows", "1", "--json").json()
    from_dump = cli(
        "compare", "--counts", dump, "--gpus", "4", "--peers", "eplb,comoe", "--bound-windows", "1", "--json"
    ).json()
    strip = ("plan_s",)
    rows = [
        [{k: v for k, v in r.items() if k not in strip} for r in out["rows"]]
        for out in (from_file, from_dump)
    ]
    assert rows[0] == rows[1], "the written instance plans as --counts --gpus does"
    assert cli("solve", written, "--work-limits", "--window", "1", "--json").json()["status"]
    cli("solve", written, "--work-limits", "--window", "99").assert_user_error("--window 99", "windows")
    evaluated = cli("evaluate", written, "--strategies", "static,eplb", "--json").json()
    assert [r["strategy"] for r in evaluated["results"]] == ["static", "eplb"]


# ------------------------------------------------------------------ flags refused before any work


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        (["--gpus", "4", "--slots", "8", "--redundant", "0,4"], ["--slots", "--redundant"]),
        (["--gpus", "4", "--migration-weights", "0,1"], ["--migration-weights", "--frontier"]),
        (["--gpus", "4", "--move-costs", "0"], ["--move-costs", "--frontier"]),
        (["--gpus", "4", "--frontier", "--redundant", "0"], ["--frontier", "--redundant"]),
        (["--gpus", "4", "--figure", "out/fig.txt"], ["--figure", "fig.txt", ".png"]),
        (["--gpus", "4", "--peers", "eplb,eplb"], ["--peers", "eplb", "more than once"]),
        (["--gpus", "4", "--peers", "eplb,nobody"], ["--peers", "nobody"]),
        (["--gpus", "4", "--hindsight-limit", "1e12"], ["--hindsight-limit", "1000000000000"]),
        (["--gpus", "3"], ["--gpus 3", "--slots or --redundant"]),
        (
            ["--gpus", "4", "--frontier", "--migration-weights", ",".join(str(i) for i in range(65))],
            ["at most 64"],
        ),
    ],
)
def test_compare_refuses_conflicting_and_ignored_flags(cli, dump, tmp_path, monkeypatch, extra, needles):
    monkeypatch.chdir(tmp_path)
    result = cli("compare", "--counts", dump, *extra)
    result.assert_user_error(*needles)
    assert not (tmp_path / "out").exists(), "refused before anything was written"


def test_instance_new_needs_gpus(cli, dump, tmp_path):
    cli("instance", "new", "--from-counts", dump, "-o", tmp_path / "x.toml").assert_user_error("--gpus")


def test_a_policy_number_has_an_upper_limit(cli, write_toml, table):
    table["policy"]["migration_weight"] = 1e300
    cli("solve", write_toml(table)).assert_user_error("policy.migration_weight", "<= 1,000,000", "1e+300")
    table["policy"]["migration_weight"] = -1.0000001
    cli("solve", write_toml(table)).assert_user_error("policy.migration_weight", "-1.0000001")


def test_the_drop_ins_limits_hold_for_lists_too():
    from comoe_opt import rebalance_experts
    from comoe_opt.balancers.dropin.rebalance import ArgumentError

    with pytest.raises(ArgumentError, match="layers; at most 1,024"):
        rebalance_experts([[1.0, 2.0]] * 1025, 2, 1, 1, 1)
    with pytest.raises(ArgumentError, match="experts per layer; at most 4,096"):
        rebalance_experts([[1.0] * 4097], 4097, 1, 1, 1)
    with pytest.raises(ArgumentError, match="previous must be an integer array"):
        rebalance_experts([[1.0, 2.0]], 2, 1, 1, 1, previous=[[0, 1], [0]])


# ------------------------------------------------------------------ signals stop a running verb


SLOW_COMPARE = """
import sys
import numpy as np
np.savez(sys.argv[1], logical_count=np.random.default_rng(0).integers(0, 3, size=(400, 2, 16)))
"""


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads a process's CPU time from /proc")
@pytest.mark.parametrize(
    ("sig", "status", "word"), [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")]
)
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_signal_stops_a_running_compare_with_one_line(tmp_path, sig, status, word, jobs):
    dump = tmp_path / "dump.npz"
    subprocess.run([sys.executable, "-c", SLOW_COMPARE, str(dump)], check=True)
    command = [sys.executable, "-m", "comoe_opt.cli", "compare", "--counts", str(dump), "--gpus", "8"]
    child = subprocess.Popen(
        [*command, "--jobs", jobs], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    # signalled once it has done some work (CPU seconds of it and its workers, not wall-clock
    # time: imports take about two, the whole compare over sixty), so that the signal meets it
    # inside its planning
    while _tree_cpu_seconds(child.pid) < 4.0 and child.poll() is None:
        _pause()
    assert child.poll() is None, "compare ended before it was signalled"
    child.send_signal(sig)
    try:
        out, err = child.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        child.kill()
        pytest.fail(f"{sig.name} did not stop compare within a minute")
    assert child.returncode == status
    assert "Traceback" not in err
    assert err.count(f"comoe-opt: {word}") == 1
    assert err.strip().splitlines()[-1] == f"comoe-opt: {word}"
    assert out == ""


def _cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of a running process (/proc), 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of a running process and every process under it (/proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        total += _cpu_seconds(current)
        todo += children.get(current, [])
    return total


def _pause() -> None:
    select.select([], [], [], 0.1)


def test_the_oracle_plans_a_bounded_number_of_steps(cli, dump, monkeypatch):
    """One EPLB plan per step: a long dump's oracle is scored on steps spread evenly over it."""
    from comoe_opt.evaluator import compare as cmp

    monkeypatch.setattr(cmp, "ORACLE_STEPS", 4)
    picked = cmp.oracle_steps(np.arange(12)[:, None, None] * np.ones((1, 2, 8)))
    assert picked.tolist() == [1, 4, 7, 10]
    out = cli(
        "compare", "--counts", dump, "--gpus", "4", "--peers", "eplb", "--bound-windows", "0", "--json"
    ).json()
    assert out["oracle_steps"] == 4 and out["steps"] == 12 and out["scored_from"] == 2
