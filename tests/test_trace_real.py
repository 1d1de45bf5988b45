"""Acceptance on the real routing traces in ../shared/traces (skipped when absent)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import TRACES

from comoe_opt.stats.transitions import transition_counts
from comoe_opt.trace import AggregateTrace, Trace, read_trace

NPZ_FILES = (
    sorted(p.relative_to(TRACES).as_posix() for p in TRACES.glob("*/*.npz")) if TRACES.is_dir() else []
)


def test_gptoss_shape(gptoss_trace: Trace) -> None:
    assert gptoss_trace.topk.shape == (215_438, 24, 4)
    assert gptoss_trace.num_experts == 32
    assert gptoss_trace.seq_id is not None and gptoss_trace.pos is not None
    assert gptoss_trace.probs is not None and gptoss_trace.probs.shape == gptoss_trace.topk.shape
    assert np.array_equal(gptoss_trace.layer_ids, np.arange(24))


def test_gptoss_statistics(gptoss_stats) -> None:
    s = gptoss_stats.summary
    assert abs(s["alpha_mean"] - 0.60) <= 0.05, s["alpha_mean"]
    assert 0.35 <= s["predictability_mean"] <= 0.45, s["predictability_mean"]
    assert s["popularity_guess_mean"] < s["predictability_mean"]
    assert s["sequences"] == 703 and s["tokens"] == 215_438 and s["top_k"] == 4
    assert "sequence" in s["predictability_method"]
    assert s["entropy_bits_mean"] < s["entropy_max_bits"] == 5.0
    assert len(gptoss_stats.layers) == 24


def test_gptoss_matches_its_aggregates(gptoss_trace: Trace, traces_dir: Path) -> None:
    """The per-token file and the aggregate file of the same run agree exactly."""
    path = traces_dir / "gptoss20b" / "gptoss20b_aggregates.npz"
    if not path.is_file():
        pytest.skip(f"{path} absent")
    agg = read_trace(path)
    assert isinstance(agg, AggregateTrace)
    assert np.array_equal(agg.counts, gptoss_trace.counts())
    topk = np.asarray(gptoss_trace.topk)
    assert np.array_equal(agg.transitions, transition_counts(topk, 32, "top1"))
    assert np.array_equal(agg.transitions_kxk, transition_counts(topk, 32, "kxk"))


@pytest.mark.parametrize("name", NPZ_FILES or [None])
def test_trace_info_on_every_real_file(name: str | None, cli) -> None:
    if name is None:
        pytest.skip(f"no real traces at {TRACES}")
    path = TRACES / name
    result = cli("trace", "info", "--json", path)
    assert result.code == 0, result.err
    report = result.json()
    with np.load(path) as data:
        per_token = "topk" in data.files
        counts = data["topk"] if per_token else data["counts"]
        layers = (
            data["layers"].tolist()
            if "layers" in data.files
            else list(range(counts.shape[1 if per_token else 0]))
        )
    assert report["kind"] == ("per-token" if per_token else "aggregate")
    assert [row["layer"] for row in report["layers"]] == layers
    assert [row["next_layer"] for row in report["layers"]] == [*layers[1:], None]
    assert report["summary"]["layers"] == len(layers)
    alpha = report["summary"]["alpha_mean"]
    assert alpha is not None and 0.0 <= alpha < 3.0
    if not per_token:
        text = cli("trace", "info", path)
        assert text.code == 0 and text.err == ""
        assert "aggregate trace" in text.out


def test_skipped_layers_are_reported(traces_dir: Path) -> None:
    """Aggregate sources that skip layers: pairs are 0->7 and 7->15."""
    path = traces_dir / "olmoe1b7b" / "olmoe_routing_aggregates.npz"
    if not path.is_file():
        pytest.skip(f"{path} absent")
    agg = read_trace(path)
    assert isinstance(agg, AggregateTrace)
    assert agg.layer_ids.tolist() == [0, 7, 15]
    assert agg.transitions.shape == (2, 64, 64)
    assert {"arxiv", "book", "c4", "github", "wikipedia"} <= set(agg.domains)
