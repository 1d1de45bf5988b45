"""Every strategy on the real GPT-OSS-20B trace (instances/real-gptoss20b.toml).

Runs `evaluate` on all 3,133 decode steps and writes
`benchmarks/results/real-gptoss20b.md`: latency, balance, and the per-(step,
layer) P95 token imbalance (max / mean expert-token load over devices) beside
the reference values measured on the same batching (EPLB re-planned, EPLB planned once, an oracle).

    .venv/bin/python benchmarks/real_trace.py [--jobs 2]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from machine import describe

from comoe_opt.evaluator.runs import eval_run, run_many
from comoe_opt.instance import load_instance, with_overrides

ROOT = Path(__file__).resolve().parent.parent
STRATEGIES = ("static", "hot", "transition", "comoe", "eplb", "eplb-flow")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "real-gptoss20b.md")
    args = parser.parse_args(argv)
    instance = load_instance(ROOT / "instances" / "real-gptoss20b.toml")
    mean_load = with_overrides(instance, {"policy.balance_scenarios": 0})
    runs = [eval_run(instance, s) for s in STRATEGIES]
    runs.append(eval_run(mean_load, "comoe", variant="CoMoE-Chip, balance on the mean load"))
    rows = run_many(runs, args.jobs)
    lines = [
        "# Real trace: GPT-OSS-20B",
        "",
        f"`instances/real-gptoss20b.toml`: {rows[0]['micro_batches']} decode steps of 64 sequences,"
        " 24 layers, 32 experts, top-4, 8 devices, 40 slots per layer (1.25x), re-planned every 32"
        " steps on the last 128; CoMoE plans balance on 32 of those steps (`policy.balance_scenarios`),"
        " and once more on their mean load for comparison. `.venv/bin/python benchmarks/real_trace.py`.",
        "",
        "| strategy | mean ms | P95 ms | token imbalance P95 | token imbalance mean | balance"
        " | replica factor | pages migrated |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        name = r.get("variant", r["label"])
        lines.append(
            f"| {name} | {r['mean_ms']:.4f} | {r['p95_ms']:.4f} | {r['token_imbalance_p95']:.3f}"
            f" | {r['token_imbalance_mean']:.3f} | {r['balance']:.3f} | {r['replica_factor']:.2f}"
            f" | {r['pages_migrated']} |"
        )
    lines += [
        "",
        "Reference values (measured on the same batching): EPLB re-planned every 32 steps on the last"
        " 128 — even split 1.38, optimal routing 1.19; planned once on other sequences — 1.66 and"
        " 1.44; an oracle planning on the step itself — 1.03. Target for CoMoE: <= 1.15.",
        "",
        describe(),
        "",
    ]
    text = "\n".join(lines)
    print(text)
    args.output.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
