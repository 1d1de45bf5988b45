"""The Lagrangian over layers at prices other than the class LP's (formulations/residency.md,
"Scenario-group bound": where the gap of window 16 lies).

`exact` evaluates the Lagrangian once, at the class LP's duals of the coupling rows. This prints L
at those prices with the first class's price scaled and the second class's set, every layer's
class MILP solved on `--seconds` (a layer stopped short gives its dual bound): any prices ≥ 0 give
a valid bound, so a larger value is a better one.

    .venv/bin/python benchmarks/studies/bench_prices.py --window 16 --scale 1 1.2 \
        --second 0 0.0005 0.001 0.002 0.004
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common and studies

import argparse
import os

import numpy as np
from _common import GPTOSS, window_problem

from comoe_opt.deadline import Deadline
from comoe_opt.residency.bounds.decompose import Prices, class_lp_certificate, lagrangian_value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--instance", type=Path, default=GPTOSS)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--scale", type=float, nargs="+", default=[1.0, 1.2])
    ap.add_argument("--second", type=float, nargs="+", default=[0.0, 0.0005, 0.001, 0.002, 0.004])
    ap.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args(argv)
    problem = window_problem(args.instance, args.window)
    cert = class_lp_certificate(problem)
    lp = Prices.of_duals(cert.coupling_duals)
    load = os.getloadavg()
    print(f"# window {args.window}: class LP {cert.bound:.5f} at prices {lp.class_pages}; load {load}")
    print("| first class's price | second class's price | L | pages per class | every layer closed |")
    print("|---:|---:|---:|---|---|")
    for scale in args.scale:
        for second in args.second:
            prices = Prices(np.array([lp.class_pages[0] * scale, second]), lp.budget, lp.quota)
            value = lagrangian_value(problem, prices, deadline=Deadline(args.seconds))
            pages = value.class_pages.astype(int).tolist()
            print(f"| {prices.class_pages[0]:.5f} | {second:.5f} | {value.bound:.5f} | {pages} "
                  f"| {bool(value.closed.all())} |", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
