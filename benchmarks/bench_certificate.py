"""The class LP bound's certificate, recomputed without a solver (formulations/residency.md, "Bound
certificate").

For each window the problem is built as `comoe-opt solve INSTANCE --method exact --window W`
builds it (`planning.plan_window`; the problem does not depend on the method, so the cheap
`static` heuristic is asked for the plan). Then `decompose.class_lp_certificate` solves the class
model's LP relaxation and writes its certificate, which goes through JSON and is recomputed by
`check_bound.check_certificate` from the problem's data. Reported: the LP optimum HiGHS gives, the
certificate's bound, the recomputed bound and their relative difference, the duals by family,
the times, and — as the upper side — `milp`'s incumbent, above which neither the bound nor the
bound of scaled or perturbed duals may lie.

    .venv/bin/python benchmarks/bench_certificate.py [--windows 0 13] [--save DIR]
    .venv/bin/python benchmarks/bench_certificate.py --instance instances/paper-baseline.toml \
        --scenarios 32 --windows 0 --output /tmp/paper-certificate.md
    .venv/bin/python benchmarks/bench_certificate.py --check DIR/gptoss-13.json --windows 13

(`--check` recomputes a saved certificate, or the one in `comoe-opt solve --json`'s output, for one
window: no solver runs.)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
from _common import GPTOSS, describe, script_args, window_problem

from comoe_opt.residency.bounds.check_bound import BoundCertificate, check_certificate, recompute

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "benchmarks" / "results" / "certificate.md"


def run_window(path: Path, window: int, incumbent_limit: float, save: Path | None, overrides: dict) -> dict:
    from comoe_opt.residency.bounds.decompose import class_lp_certificate
    from comoe_opt.residency.solve import solve

    t = time.perf_counter()
    problem = window_problem(path, window, overrides)
    built = time.perf_counter() - t
    cert = class_lp_certificate(problem)
    if cert is None:
        raise SystemExit(f"window {window}: the class model does not apply")
    text = cert.to_json()
    if save is not None:
        save.mkdir(parents=True, exist_ok=True)
        (save / f"{path.stem.removeprefix('real-')}-{window}.json").write_text(text, encoding="utf-8")
    t = time.perf_counter()
    again = recompute(problem, BoundCertificate.from_json(text))
    checked = time.perf_counter() - t
    incumbent = solve(problem, "milp", time_limit_s=incumbent_limit, mip_gap=1e-2).objective
    rng = np.random.default_rng(window)
    perturbed = []
    for factor in (0.5, 1.5):
        duals = [(f, i, y * factor) for f, i, y in cert.duals]
        perturbed.append(check_certificate(problem, _with(cert, duals)))
    noisy = [(f, i, y * rng.lognormal(0, 0.5) * rng.choice([1, 1, -1])) for f, i, y in cert.duals]
    perturbed.append(check_certificate(problem, _with(cert, noisy)))
    return {
        "instance": path.name,
        "window": window,
        "shape": f"{problem.layers} x {problem.experts} x {problem.chiplets}, {problem.scenarios} scenarios",
        "lp_objective": cert.lp_objective,
        "bound": cert.bound,
        "recomputed": again.bound,
        "relative": abs(again.bound - cert.bound) / abs(cert.bound),
        "layer_max_abs": float(np.abs(again.layer_values - np.array(cert.layer_values)).max()),
        "coupling_duals": cert.coupling_duals,
        "coupling_value": cert.coupling_value,
        "families": dict(Counter(f for f, _, _ in cert.duals)),
        "json_bytes": len(text),
        "build_s": built,
        "lp_s": cert.seconds["lp"],
        "certificate_s": cert.seconds["certificate"],
        "check_s": checked,
        "incumbent": incumbent,
        "perturbed": perturbed,
        "machine": describe(),
    }


def _with(cert: BoundCertificate, duals: list) -> BoundCertificate:
    import dataclasses

    return dataclasses.replace(cert, duals=duals)


def render(rows: list[dict]) -> str:
    lines = [
        "# The class LP bound's certificate, recomputed without a solver",
        "",
        '`.venv/bin/python benchmarks/bench_certificate.py` (formulations/residency.md, "Bound'
        " certificate\"). LP: the class model's LP optimum as HiGHS reports it (`class_lp_bound`);"
        " certificate: L(y) at HiGHS's duals, evaluated on HiGHS's rows; recomputed: L(y) from the"
        " rows `check_bound` rebuilds from the problem's data; incumbent: `milp`'s objective"
        " (10 s), above which no bound may lie; perturbed: the largest recomputed bound of the"
        " duals scaled by 0.5 and 1.5 and of the duals with log-normal noise and a third of the"
        " signs flipped. Times in seconds, machine shared with other jobs.",
        "",
        "| window | LP (ms) | certificate | recomputed | relative difference | perturbed (max) |"
        " incumbent | duals | JSON kB | LP s | certificate s | check s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['instance']} {r['window']} | {r['lp_objective']:.9g} | {r['bound']:.12g} |"
            f" {r['recomputed']:.12g} | {r['relative']:.1e} | {max(r['perturbed']):.6g} |"
            f" {r['incumbent']:.6g} | {sum(r['families'].values())} | {r['json_bytes'] / 1000:.0f} |"
            f" {r['lp_s']:.2f} | {r['certificate_s']:.3f} | {r['check_s']:.3f} |"
        )
    lines.append("")
    for r in rows:
        families = ", ".join(f"{k} {v}" for k, v in sorted(r["families"].items(), key=lambda kv: -kv[1]))
        lines.append(
            f"* window {r['window']} ({r['shape']}): duals by family: {families}; coupling duals"
            f" {json.dumps(r['coupling_duals'])} (their term {r['coupling_value']:.6g} ms); largest"
            f" per-layer difference {r['layer_max_abs']:.1e} ms. {r['machine']}"
        )
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instance", type=Path, default=GPTOSS)
    parser.add_argument("--windows", type=int, nargs="*", default=[0, 13, 20, 60, 91])
    parser.add_argument("--incumbent-limit", type=float, default=10.0, help="milp's time limit, s")
    parser.add_argument("--save", type=Path, help="write each certificate's JSON into this folder")
    parser.add_argument("--check", type=Path, help="recompute this saved certificate (one window)")
    parser.add_argument("--scenarios", type=int, help="policy.balance_scenarios (default: the instance's)")
    script_args(parser, RESULT)
    args = parser.parse_args(argv)
    if args.smoke:  # one window of GPT-OSS, the incumbent on a short limit
        args.windows, args.incumbent_limit = [0], 2.0
    overrides = {} if args.scenarios is None else {"policy.balance_scenarios": args.scenarios}
    if args.check is not None:
        if len(args.windows) != 1:
            parser.error("--check needs exactly one --windows")
        saved = json.loads(args.check.read_text(encoding="utf-8"))
        if "report" in saved:  # `comoe-opt solve --json` output: the certificate is in its report
            saved = saved["report"]["certificate"]
        cert = BoundCertificate.from_json(json.dumps(saved))
        t = time.perf_counter()
        again = recompute(window_problem(args.instance, args.windows[0], overrides), cert)
        value, seconds = again.bound, time.perf_counter() - t
        relative = abs(value - cert.bound) / max(abs(cert.bound), 1e-300)
        same = "the certificate's data" if again.same_data else "OTHER data than the certificate's"
        print(f"recomputed {value!r} ms, certificate {cert.bound!r} ms, relative {relative:.1e};"
              f" {same} (problem and check {seconds:.2f} s)")  # fmt: skip
        return 0 if math.isclose(value, cert.bound, rel_tol=1e-6) else 1
    rows = []
    for window in args.windows:
        rows.append(run_window(args.instance, window, args.incumbent_limit, args.save, overrides))
        print(render(rows[-1:]), file=sys.stderr)
    text = render(rows)
    args.output.write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
