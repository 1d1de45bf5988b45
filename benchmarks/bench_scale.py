"""Plan time at scale: the drop-in (`even`, `lp`) against the EPLB port, as GPUs (8 -> 320) and
experts (64 -> 384) grow.

Each shape plans one call on a history of Zipf loads (`steps` steps, each expert's popularity
Zipf(0.8) in its own order per layer, Poisson counts of `tokens` x top-8 selections per step), as an
engine calls its balancer: the EPLB port (`deepseek_eplb`) on the history's sum, the drop-in
(`rebalance_experts`) on the sum with `history=`. Times are wall-clock seconds of one process,
best of `--runs`, the EPLB port and the drop-in measured side by side so that their ratio is of
one run on one machine; the drop-in's plans are work-limited (deterministic), only its time varies.

The first table is the scale suite's shapes (instances/scale/); the curves vary one of GPUs or
experts at a time.

`even` and `lp` are the drop-in's defaults: past 12 GPUs (`SearchConfig.step_search_gpus`) the
search by steps (balancers/dropin/step_search.py); `even by moments` and `lp by pooled cuts` are its
other searches (`SearchConfig(step_search_gpus=None)`), the defaults up to 12 GPUs; `even on time`
plans for modelled layer time (`timing=`, DeepSeek-V3's expert on H100s).

    .venv/bin/python benchmarks/bench_scale.py [--runs 3] [--steps 32] [--only even]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from _common import RESULTS, describe, script_args

from comoe_opt import rebalance_experts
from comoe_opt.balancers.dropin.config import SearchConfig
from comoe_opt.balancers.eplb import deepseek_eplb
from comoe_opt.costs import LayerTime

RESULT = RESULTS / "scale-plan-time.md"
# the drop-in's variants: its dispatch with its defaults, and its searches by moments or pooled cuts
VARIANTS = {
    "even": {"dispatch": "even"},
    "even by moments": {"dispatch": "even", "config": SearchConfig(step_search_gpus=None)},
    "lp": {"dispatch": "lp"},
    "lp by pooled cuts": {"dispatch": "lp", "config": SearchConfig(step_search_gpus=None)},
    "even on time": {"dispatch": "even", "timing": "dsv3-h100"},
}
# `timing` of "even on time": DeepSeek-V3's FP8 expert (44 MB) read at an H100's 3,350 GB/s, its
# 2 x 3 x 7168 x 2048 FLOP per selection at 1,979 TFLOP/s (FP8 dense), a selection's FP8 dispatch
# and BF16 combine (7168 x 3 B) at 50 GB/s across nodes (gpus.py's H100 figures), ms
DSV3_H100_MS = (0.044 / 3350 * 1e3, 2 * 3 * 7168 * 2048 / 1979e12 * 1e3, 7168 * 3 / 50e9 * 1e3)


@dataclass(frozen=True)
class Shape:
    name: str
    layers: int
    experts: int
    gpus: int
    slots: int  # per layer
    nodes: int
    groups: int
    tokens: int = 4096  # tokens per step

    def history(self, steps: int, seed: int = 0) -> np.ndarray:
        """[steps, layers, experts] Poisson counts of Zipf(0.8) popularity, top-8."""
        rng = np.random.default_rng(seed)
        popularity = 1.0 / np.arange(1, self.experts + 1) ** 0.8
        rates = np.stack([popularity[rng.permutation(self.experts)] for _ in range(self.layers)])
        rates *= 8 * self.tokens / rates.sum(axis=1, keepdims=True)
        return rng.poisson(rates, size=(steps, *rates.shape)).astype(np.float64)


SUITE = (
    Shape("DeepSeek-V3 EP32 prefill", 58, 256, 32, 288, 4, 8),
    Shape("DeepSeek-V3 EP144 decode", 58, 256, 144, 288, 18, 8, tokens=9216),
    Shape("Kimi-K2 EP64", 60, 384, 64, 448, 8, 1),
    Shape("Qwen3-235B EP16", 94, 128, 16, 144, 2, 1, tokens=2048),
    Shape("Qwen3-235B EP32", 94, 128, 32, 160, 4, 1),
)
BY_GPUS = tuple(Shape(f"{g} GPUs", 58, 256, g, 256 + g, max(1, g // 8), 8) for g in (8, 16, 32, 64, 128))
BY_GPUS += (Shape("320 GPUs", 58, 256, 320, 640, 40, 8),)
BY_EXPERTS = tuple(Shape(f"{e} experts", 58, e, 32, e + 32, 4, 1) for e in (64, 128, 256, 384))
SMOKE = (Shape("smoke", 4, 32, 8, 40, 2, 4),)


def best_of(runs: int, call: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(runs):
        began = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - began)
    return best


def measure(shape: Shape, steps: int, runs: int, variants: tuple[str, ...]) -> dict[str, float]:
    """Seconds of the EPLB port and of each variant of the drop-in on one shape."""
    history = shape.history(steps)
    load = history.sum(axis=0)
    args = (shape.slots, shape.groups, shape.nodes, shape.gpus)
    seconds = {"EPLB port": best_of(runs, lambda: deepseek_eplb(load, *args))}
    for name in variants:
        options = dict(VARIANTS[name])
        if "timing" in options:
            options["timing"] = LayerTime.of_gpus(*DSV3_H100_MS, shape.gpus)
        seconds[name] = best_of(runs, lambda o=options: rebalance_experts(load, *args, history=history, **o))
    return seconds


def table(
    title: str, shapes: tuple[Shape, ...], steps: int, runs: int, dispatches: tuple[str, ...]
) -> list[str]:
    lines = [
        f"## {title}",
        "",
        "| shape | layers x experts | GPUs | slots | nodes | EPLB port s | "
        + " | ".join(f"{d} s | {d} / EPLB" for d in dispatches)
        + " |",
        "|---|---|---:|---:|---:|---:|" + "---:|---:|" * len(dispatches),
    ]
    for shape in shapes:
        s = measure(shape, steps, runs, dispatches)
        port = s["EPLB port"]
        cells = " | ".join(f"{s[d]:.3f} | {s[d] / port:.1f}x" for d in dispatches)
        lines.append(
            f"| {shape.name} | {shape.layers} x {shape.experts} | {shape.gpus} | {shape.slots}"
            f" | {shape.nodes} | {port:.3f} | {cells} |"
        )
        print(lines[-1], flush=True)
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--steps", type=int, default=32, help="history steps per call (the suite's 4 windows of 8)"
    )
    parser.add_argument("--only", choices=tuple(VARIANTS), help="one variant only")
    script_args(parser, RESULT)
    args = parser.parse_args()
    dispatches = (args.only,) if args.only else tuple(VARIANTS)
    groups = {"The scale suite's shapes": SUITE, "Against GPUs (58 x 256)": BY_GPUS,
              "Against experts (58 layers, 32 GPUs)": BY_EXPERTS}  # fmt: skip
    if args.smoke:
        groups, args.runs, args.steps = {"smoke": SMOKE}, 1, 4
    lines = ["# Plan time at scale", "", describe(), ""]
    for title, shapes in groups.items():
        lines += table(title, shapes, args.steps, args.runs, dispatches)
    args.output.write_text("\n".join(lines), encoding="utf-8")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
