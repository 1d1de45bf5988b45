"""A serving engineer's first commands: a recorder dump and a GPU count, no instance file.

An SGLang-style dump ([steps, model layers, experts] counts; a dense layer's row all zero) goes
through `compare --counts DUMP --gpus 8 --redundant 8,16` and `solve --counts DUMP --gpus 8
--export sglang`; the answer's lines are checked against the table's numbers. Then the hostile
inputs of the new flags, each refused in one line before any work."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import pytest

from comoe_opt.evaluator import advice
from comoe_opt.instance import load_instance
from comoe_opt.presets import PRESETS

EXPERTS, MOE_LAYERS, STEPS = 16, 3, 24


def _dump(tmp_path: Path, experts: int = EXPERTS, rows: int = MOE_LAYERS + 1, name: str = "dump.npz") -> Path:
    """SGLang's recorder layout: one row per model layer, the dense layer 0 all zero, bursty
    per-step counts of 32 tokens in flight at top-2."""
    rng = np.random.default_rng(33)
    share = rng.dirichlet(np.full(experts, 0.3), size=rows - 1)  # skewed popularity per layer
    counts = np.zeros((STEPS, rows, experts), dtype=np.int64)
    for t in range(STEPS):
        counts[t, 1:] = [rng.multinomial(64, row) for row in share]
    path = tmp_path / name
    np.savez(path, logical_count=counts)
    return path


FAST = ("--peers", "eplb,comoe", "--bound-windows", "1")


def test_compare_a_dump_with_redundant_slots_answers_from_the_table(tmp_path: Path, cli) -> None:
    dump = _dump(tmp_path)
    figure = tmp_path / "missing" / "folder" / "sweep.png"
    out = cli(
        "compare", "--counts", dump, "--gpus", 8, "--redundant", "8,16", *FAST, "--figure", figure, "--json"
    )
    assert out.code == 0, out.err
    result = out.json()
    points = sorted(result["points"], key=lambda p: p["redundant"])
    assert [p["redundant"] for p in points] == [8, 16]
    assert [p["slots_per_device"] for p in points] == [3, 4]
    assert figure.is_file()  # the missing folder was created before any work
    lines = result["answer"]
    for peer, line in zip(("eplb", "comoe"), lines[:2], strict=True):
        knee = points[advice.knee_index(points, peer)]
        assert line.startswith(f"redundant slots, {peer}:")
        assert f"P95 {knee[peer]['p95']:.3f}" in line and f"{knee['slots_per_device']} slots per GPU" in line
        p95 = [p[peer]["p95"] for p in points]
        further = p95[1] <= 0.99 * p95[0]  # the last point still gained 1% or more
        assert ("sweep further" in line) == further and (knee["redundant"] == 8) == (not further)
    knee = points[advice.knee_index(points, "eplb")]
    gap = lines[2]
    assert gap.startswith("gap to the proven bound: eplb")
    assert f"{100 * knee['eplb']['gap_to_bound']:.1f}% above" in gap
    assert f"CoMoE {100 * knee['comoe']['gap_to_bound']:.1f}%" in gap
    assert "give --model or --expert-mb" in lines[3]  # sizes unknown: no regime


def test_compare_a_dump_table_answers_per_dispatch(tmp_path: Path, cli) -> None:
    dump = _dump(tmp_path)
    out = cli(
        "compare", "--counts", dump, "--gpus", 8, "--expert-mb", "44", *FAST, "--crossfit", "--json",
        "--replan-every", 1000,
    )  # fmt: skip
    assert out.code == 0, out.err
    result = out.json()
    assert result["replan_every"] == 1000
    rows = {(r["peer"], r["routing"]): r for r in result["rows"]}
    assert ("hindsight-crossfit", "flow") in rows  # --crossfit: a limit beside hindsight, not a peer
    even_time, lp_time, even, lp, gap, regime = result["answer"]  # sized (--expert-mb): led by time
    for line, routing in ((even_time, "even"), (lp_time, "lp")):
        planners = [r for r in result["rows"] if r["routing"] == routing and r["peer"] in ("eplb", "comoe")]
        best = max(planners, key=lambda r: r["net_ms_per_replan"])
        assert f"by time: least MoE time over a re-plan every 1,000 steps: {best['peer']}," in line
        assert f"{best['net_ms_per_replan']:+,.1f} ms per re-plan against EPLB" in line
        static = rows[("static", routing)]["net_ms_per_replan"]
        assert ("re-balancing does not pay" in line) == (best["net_ms_per_replan"] <= static)
    for line, routing in ((even, "even"), (lp, "lp")):
        best = rows[("eplb", routing)]  # the only engine balancer among the peers
        assert f"best balancer eplb, P95 {best['p95']:.3f}" in line
        ours = rows[("comoe", routing)]
        fewer = ours["copies_per_replan"] <= best["copies_per_replan"]
        assert (f"CoMoE at no more copies: P95 {ours['p95']:.3f}" in line) == fewer
        assert ("CoMoE copies more" in line) == (not fewer)
    assert f"eplb {100 * rows[('eplb', 'even')]['gap_to_bound']:.1f}% above" in gap
    assert "tokens per active expert" in regime


def _row(peer: str, routing: str, p95: float, copies: float) -> dict:
    return {"peer": peer, "routing": routing, "p95": p95, "copies_per_replan": copies, "gap_to_bound": 0.1}


@pytest.mark.parametrize(
    ("copies", "says"),
    [
        (3.0, "CoMoE at no more copies: P95 1.100 at 3.0 (-8.3%)"),
        (9.0, "CoMoE copies more (9.0 per re-plan, P95 1.100)"),
    ],
)
def test_the_answer_names_the_best_balancer_and_ours_at_no_more_copies(copies: float, says: str) -> None:
    rows = [
        _row("eplb", "even", 1.3, 5.0),
        _row("vllm-default", "even", 1.2, 5.0),
        _row("comoe", "even", 1.1, copies),
    ]
    result = {"rows": rows, "bound": {"windows": [0]}}
    line = advice.table_answer(result, "eplb", None)[0]
    assert line.startswith(
        "the even split (vLLM, SGLang static/dynamic), by token imbalance: best balancer vllm-default,"
        " P95 1.200"
    )
    assert says in line


@pytest.mark.parametrize(
    ("last", "says"),
    [
        (1.15, "P95 1.150 at 16 (4 slots per GPU; give --model or --expert-mb for GB) still improves by 1%"),
        (
            1.195,
            "redundant slots, eplb: 8 (3 slots per GPU; give --model or --expert-mb for GB), P95 1.200; more",
        ),
    ],
)
def test_the_knee_is_the_first_point_no_later_one_improves_by_a_percent(last: float, says: str) -> None:
    points = [
        {"redundant": r, "slots_per_device": s, "eplb": {"p95": p95, "gap_to_bound": 0.1}}
        for r, s, p95 in ((0, 2, 1.5), (8, 3, 1.2), (16, 4, last))
    ]
    assert says in advice.knee_line(points, "eplb", "slots")


def test_solve_a_dump_exports_sglangs_map(tmp_path: Path, cli) -> None:
    dump = _dump(tmp_path)
    out_file = tmp_path / "maps" / "expert-location.json"
    out = cli("solve", "--counts", dump, "--gpus", 8, "--export", "sglang", "-o", out_file, "--work-limits")
    assert out.code == 0, out.err
    table = json.loads(out_file.read_text())["physical_to_logical_map"]
    assert len(table) == MOE_LAYERS + 1  # one row per model layer, the dense one included
    assert all(len(row) == EXPERTS for row in table)  # one slot per expert by default
    for row in table[1:]:
        assert sorted(row) == list(range(EXPERTS))  # every expert resident once


def test_instance_new_writes_the_same_instance_with_every_default_commented(tmp_path: Path, cli) -> None:
    dump = _dump(tmp_path)
    path = tmp_path / "serving.toml"
    out = cli(
        "instance",
        "new",
        "--from-counts",
        dump,
        "--gpus",
        8,
        "--redundant",
        8,
        "--model",
        "olmoe",
        "-o",
        path,
    )
    assert out.code == 2 and "OLMoE-1B-7B has 64" in out.err  # the dump's 16 experts are not OLMoE's
    out = cli(
        "instance",
        "new",
        "--from-counts",
        dump,
        "--gpus",
        8,
        "--redundant",
        8,
        "--expert-mb",
        9.4,
        "-o",
        path,
    )
    assert out.code == 0, out.err
    text = path.read_text()
    values = [line for line in text.splitlines() if " = " in line and not line.startswith("name")]
    assert values and all("  # " in line for line in values)  # every key carries its unit and source
    written = load_instance(path)
    model, hardware, policy = written.model, written.hardware, written.policy
    # the values by hand: 16 experts + 8 redundant = 24 slots over 8 GPUs, 3 MoE layers of 9.4 MB
    assert (model.layers, model.experts_per_layer, model.top_k, model.page_gb) == (3, 16, 1, 0.0094)
    assert model.moe_layer_ids == [1, 2, 3] and model.hidden_layers == 4
    assert hardware.chiplets == 8 and hardware.capacity_gb[0] == pytest.approx(3 * 3 * 0.0094)
    assert policy.replica_budget_pages == 24 * 3 and policy.all_resident
    assert policy.window_batches == STEPS // 8  # 8 re-plans over the dump
    assert written.trace.tokens_per_batch == 64  # 64 selections per step and layer, each a token (top-1)
    assert tomllib.loads(text)["model"]["layer_ids"] == [1, 2, 3]


def test_presets_expert_sizes_from_their_configs() -> None:
    # DeepSeek-V3: 3 x 7168 x 2048 FP8 weights = 44.04 MB (instances/deepseek-v3-ep32.toml: 0.044)
    assert PRESETS["deepseek-v3"].expert_gb == pytest.approx(0.044040, abs=1e-6)
    # GPT-OSS-20B: 3 x 2880 x 2880 in MXFP4 (4.25 bit) = 13.2 MB (instances/real-gptoss20b.toml: 0.0133)
    assert PRESETS["gpt-oss-20b"].expert_gb == pytest.approx(0.0133, abs=1e-4)
    assert PRESETS["llama-4-maverick"].moe_layer_ids[:3] == (1, 3, 5)
    for p in PRESETS.values():
        assert len(p.moe_layer_ids) <= p.model_layers and p.top_k <= p.experts


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--gpus", "0"], ["--gpus", "must be >= 1"]),
        (["--gpus", "8", "--model", "no-such-model"], ["--model", "unknown model", "deepseek-v3"]),
        (["--gpus", "8", "--model", "qwen3-30b-a3b"], ["128 experts", "Qwen3-30B-A3B"]),
        (["--gpus", "8", "--slots", "20"], ["--slots 20", "split evenly over 8 GPUs"]),
        (["--gpus", "8", "--slots", "8"], ["--slots 8", "cannot hold the 16 experts"]),
        (["--gpus", "8", "--redundant", "1000000"], ["--redundant 1000000", "exceed 8 GPUs x 16 experts"]),
        (["--gpus", "8", "--redundant", "8,1000000"], ["--redundant 1000000", "exceed"]),
        (
            ["--gpus", "8", "--redundant", "112", "--expert-mb", "9000"],
            ["--redundant 112", "more than one H100 SXM's 80 GB"],
        ),
        (["--gpus", "8", "--nodes", "3"], ["--nodes 3", "must divide --gpus 8"]),
        (["--gpus", "8", "--expert-mb", "nan"], ["--expert-mb"]),
        (["--gpus", "8", "--expert-mb", "-1"], ["--expert-mb"]),
        (["--gpus", "2000"], ["--gpus"]),
        (["--gpus", "8", "--slots", "99999999"], ["--slots"]),
        (["--gpus", "8", "--gpu", "tpu-v5"], ["--gpu", "unknown GPU", "h200", "mi300x"]),
        (["--gpus", "8", "--gpu-memory-gb", "0"], ["--gpu-memory-gb", "must be in"]),
        (["--gpus", "8", "--scale-out-gb-s", "inf"], ["--scale-out-gb-s", "must be in"]),
        (
            ["--gpus", "8", "--expert-mb", "9000", "--gpu", "h200", "--gpu-memory-gb", "20"],
            ["54.0 GB", "H200 SXM (overridden)'s 20 GB"],
        ),
    ],
)
def test_hostile_serving_flags_are_one_line_before_any_work(tmp_path: Path, cli, args, needles) -> None:
    dump = _dump(tmp_path)
    cli("compare", "--counts", dump, *args).assert_user_error(*needles)


def test_the_dump_must_agree_with_the_model(tmp_path: Path, cli) -> None:
    dump = _dump(tmp_path, experts=64, rows=5)  # OLMoE's 64 experts, but 5 rows for its 16 layers
    cli("compare", "--counts", dump, "--gpus", 8, "--model", "olmoe").assert_user_error(
        "5 layer rows", "16 layers"
    )


def test_figure_into_a_file_as_folder_is_refused_at_once(tmp_path: Path, cli) -> None:
    dump = _dump(tmp_path)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    cli("compare", "--counts", dump, "--gpus", 8, "--figure", blocker / "f.png").assert_user_error("--figure")


def test_serving_flags_with_an_instance_file_are_refused(cli) -> None:
    cli("compare", "instances/real-gptoss20b.toml", "--gpus", 8).assert_user_error(
        "--gpus", "instance sets them"
    )


def _maverick_dump(tmp_path: Path) -> Path:
    """Llama-4-Maverick's recorder layout: 48 model layers, MoE on the odd ones, 128 experts."""
    rng = np.random.default_rng(7)
    counts = np.zeros((4, 48, 128), dtype=np.int64)
    counts[:, 1::2] = rng.poisson(4.0, size=(4, 24, 128))
    path = tmp_path / "maverick.npz"
    np.savez(path, logical_count=counts)
    return path


def test_the_gpus_memory_decides_what_fits(tmp_path: Path, cli) -> None:
    """Llama-4-Maverick in BF16 on 8 GPUs at 18 slots each: 18 x 24 layers x 251.7 MB = 108.7 GB of
    experts per GPU, more than an H100's 80 GB, within an H200's 141 GB."""
    dump, path = _maverick_dump(tmp_path), tmp_path / "m.toml"
    args = ["instance", "new", "--from-counts", dump, "--gpus", 8, "--slots", 144]
    args += ["--model", "llama-4-maverick"]
    cli(*args, "-o", path).assert_user_error("108.7 GB", "H100 SXM's 80 GB")
    out = cli(*args, "--gpu", "h200", "-o", path)
    assert out.code == 0, out.err
    hardware = load_instance(path).hardware
    # the H200's datasheet rates: 4.8 TB/s HBM, BF16 (the model's weights) 989 TFLOP/s, NVLink
    # 900 GB/s both ways (450 into a GPU), 400 Gb/s network cards (50 GB/s)
    assert (hardware.local_bandwidth_gb_s[0], hardware.peak_tflops[0]) == (4800.0, 989.0)  # per GPU
    assert (hardware.copy_intra_node_gb_s, hardware.copy_inter_node_gb_s) == (450.0, 50.0)
    assert "H200 SXM" in path.read_text()


def test_fp8_weights_run_at_the_fp8_peak_and_overrides_replace_the_datasheet(tmp_path: Path, cli) -> None:
    rng = np.random.default_rng(3)
    counts = np.zeros((4, 61, 256), dtype=np.int64)
    counts[:, 3:] = rng.poisson(2.0, size=(4, 58, 256))
    dump, path = tmp_path / "dsv3.npz", tmp_path / "d.toml"
    np.savez(dump, logical_count=counts)
    common = ["instance", "new", "--from-counts", dump, "--gpus", 32, "--model", "deepseek-v3", "-o", path]
    assert cli(*common, "--gpu", "b200").code == 0
    assert load_instance(path).hardware.peak_tflops[0] == 4500.0  # B200 dense FP8
    assert cli(*common, "--gpu", "b200", "--gpu-tflops", 3000, "--scale-up-gb-s", 700).code == 0
    hardware = load_instance(path).hardware
    assert (hardware.peak_tflops[0], hardware.copy_intra_node_gb_s, hardware.local_bandwidth_gb_s[0]) == (
        3000.0,
        700.0,
        7700.0,
    )


def _timed_point(redundant: int, eplb_ms: float, comoe_ms: float, static_ms: float) -> dict:
    cell = lambda ms, stall: {"step_ms_mean": ms, "migration_ms": stall}  # noqa: E731
    return {
        "redundant": redundant,
        "slots_per_device": 2 + redundant // 8,
        "gb_per_device": 1.0 + redundant / 8,
        "eplb": {"even": cell(eplb_ms, 300.0)},
        "comoe": {"even": cell(comoe_ms, 30.0)},
        "static": {"even": cell(static_ms, 0.0)},
    }


def test_the_sweep_by_time_names_the_balancer_at_the_time_knee() -> None:
    # over 1,000 steps: at 8 slots comoe 1.0 x 1000 + 30 = 1,030 ms beats eplb's 1,300 and the
    # static plan's 1,100; at 16, 1,020: within 1% of 1,030, so the knee stays at 8
    points = [
        _timed_point(0, 2.0, 2.0, 2.0),
        _timed_point(8, 1.0, 1.0, 1.1),
        _timed_point(16, 1.0, 0.99, 1.1),
    ]
    line = advice.sweep_time_line(points, "even", 1000)
    assert line.startswith(
        "the even split (vLLM, SGLang static/dynamic), by time: comoe at 8 redundant slots"
    )
    assert "(2.000 GB per GPU), 1.03 ms of MoE time per step" in line
    assert "re-balancing pays 70.0 ms per 1,000 steps over EPLB's first plan kept" in line
    # a static plan as fast as the best re-balancer, without its stall: re-balancing does not pay
    points = [_timed_point(8, 1.0, 1.0, 1.0)]
    assert "re-balancing does not pay: EPLB's first plan kept is 30.0 ms ahead" in advice.sweep_time_line(
        points, "even", 1000
    )
