"""Time the synthetic trace generator on the paper baseline.

Generates the trace of `instances/paper-baseline.toml` (by default 1000
micro-batches x 64 tokens x 32 layers, top-2 of 64 experts) five times and
reports min / median / max seconds and tokens per second. Prints a Markdown
table and writes it, with the machine description, to
`benchmarks/results/tracegen.md`.

    .venv/bin/python benchmarks/bench_tracegen.py [--runs 5] [--instance PATH]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from _common import describe, script_args

from comoe_opt.instance import SyntheticTrace, load_instance, with_overrides
from comoe_opt.trace import generate

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_INSTANCE = ROOT / "instances" / "paper-baseline.toml"
RESULT = ROOT / "benchmarks" / "results" / "tracegen.md"
TARGET_S = 5.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--instance", type=Path, default=DEFAULT_INSTANCE)
    script_args(parser, RESULT)
    args = parser.parse_args(argv)

    instance = load_instance(args.instance)
    if args.smoke:  # one run of a short trace
        args.runs = 1
        instance = with_overrides(instance, {"trace.micro_batches": 20}, "--smoke")
    spec = instance.trace
    if not isinstance(spec, SyntheticTrace):
        parser.error(f"{args.instance} has no synthetic trace")
    model = instance.model

    times = []
    shape = None
    for _ in range(args.runs):
        start = time.perf_counter()
        trace = generate(model, spec)
        times.append(time.perf_counter() - start)
        shape = trace.topk.shape
    assert shape is not None
    tokens = shape[0]
    lo, med, hi = min(times), statistics.median(times), max(times)
    verdict = "met" if med < TARGET_S else "MISSED"

    try:
        relative = args.instance.resolve().relative_to(ROOT)
    except ValueError:
        relative = args.instance
    lines = [
        "# Synthetic trace generation",
        "",
        f"Instance `{relative}`: {spec.micro_batches} micro-batches x {spec.tokens_per_batch} tokens"
        f" = {tokens} tokens, {model.layers} layers, top-{model.top_k} of {model.experts_per_layer} experts,"
        f" drift every {spec.drift_every} micro-batches; {args.runs} runs"
        f" (`.venv/bin/python benchmarks/bench_tracegen.py`).",
        "",
        "| runs | min s | median s | max s | tokens/s (median) | token-layers/s (median) | target |",
        "|---:|---:|---:|---:|---:|---:|---|",
        f"| {args.runs} | {lo:.3f} | {med:.3f} | {hi:.3f} | {tokens / med:,.0f}"
        f" | {tokens * model.layers / med:,.0f} | < {TARGET_S:g} s: {verdict} |",
        "",
        describe(),
        "",
    ]
    text = "\n".join(lines)
    print(text)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text, encoding="utf-8")
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
