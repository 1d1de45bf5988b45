"""`comoe-opt evaluate` and `comoe-opt paper`: the trace-driven evaluator from the command line."""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path
from typing import Any

from comoe_opt.cli.choices import DEFAULT_PAPER_INSTANCE, DEFAULT_REGIME_INSTANCE
from comoe_opt.cli.common import names_in
from comoe_opt.errors import ComoeError
from comoe_opt.evaluator.metrics import peer_summary
from comoe_opt.evaluator.paper import PaperSettings, run_paper
from comoe_opt.evaluator.runs import eval_run, run_many, trace_regime
from comoe_opt.evaluator.strategies import STRATEGIES
from comoe_opt.files import writable_folder
from comoe_opt.instance import Instance, load_instance, packaged_instance, with_overrides

COLUMNS = (
    ("mean_ms", "mean ms", ".4f"),
    ("p95_ms", "P95 ms", ".4f"),
    ("p99_ms", "P99 ms", ".4f"),
    ("token_gb_per_batch", "token GB/b", ".4f"),
    ("load_gb_per_batch", "load GB/b", ".3f"),
    ("balance", "balance", ".3f"),
    ("token_imbalance_p95", "imbal P95", ".3f"),
    ("replica_factor", "replicas", ".2f"),
    ("energy_mj_per_layer", "mJ/layer", ".3f"),
    ("prefetch_accuracy", "pf acc", ".2f"),
    ("pages_migrated", "migrated", "d"),
    ("copies_cancelled", "cancelled", "d"),
)


def cmd_evaluate(args: argparse.Namespace) -> dict[str, Any]:
    instance = apply_settings(load_instance(args.instance), args.set)
    names = names_in(args.strategies, STRATEGIES, "--strategies")
    out = args.placements_out
    if out is not None:
        writable_folder(out, "--placements-out")
    rows = run_many([eval_run(instance, s, args.micro_batches, out) for s in names], args.jobs)
    peers = peer_summary(rows)
    regime = trace_regime(instance, args.micro_batches)
    text = format_rows(instance.name, rows) + "\n" + regime.summary()
    if peers is not None:
        text += "\n" + format_peers(peers)
    return {
        "instance": instance.name,
        "results": rows,
        "peers": peers,
        "regime": regime.to_dict(),
        "_text": text,
    }


def format_peers(peers: dict[str, Any]) -> str:
    """One line on CoMoE against EPLB with optimal routing and the oracle."""

    def pct(value: float | None) -> str:
        return "n/a" if value is None else f"{100 * value:.1f}%"

    copies = peers["copies_vs_eplb"]
    lead = pct(peers["lead_over_eplb_optimal_routing"])
    return (
        f"CoMoE vs EPLB + optimal routing, P95 token imbalance: {lead}"
        f" lower; closes {pct(peers['gap_closed_to_oracle'])} of the gap to the oracle; copies"
        f" {'n/a' if copies is None else f'{copies:.3f}'} of EPLB's"
    )


def apply_settings(instance: Instance, settings: list[str]) -> Instance:
    """The instance with `--set SECTION.KEY=VALUE` overrides, validated like the file itself."""
    if not settings:
        return instance
    overrides = {}
    for item in settings:
        key, sep, text = item.partition("=")
        if not sep or "." not in key:
            raise ComoeError(f"--set {item!r}: expected SECTION.KEY=VALUE, e.g. policy.balance_scenarios=32")
        overrides[key.strip()] = _toml_value(text.strip())
    return with_overrides(instance, overrides)


def _toml_value(text: str) -> Any:
    """A TOML value (number, boolean, array, quoted string); anything else is a bare string.
    A value is one line: text after a line break would otherwise be read as more keys."""
    if any(ch in text for ch in "\n\r\x00"):
        raise ComoeError(f"--set value {text!r}: must be one line (give each key its own --set)")
    try:
        table = tomllib.loads(f"v = {text}")
    except tomllib.TOMLDecodeError:
        return text
    if set(table) != {"v"}:
        raise ComoeError(f"--set value {text!r}: not a single TOML value")
    return table["v"]


def cmd_paper(args: argparse.Namespace) -> dict[str, Any]:
    instance = load_instance(_shipped(args.instance, DEFAULT_PAPER_INSTANCE))
    settings = PaperSettings(
        table5_batches=args.table5_batches, sweep_batches=args.sweep_batches, jobs=args.jobs
    )
    regime = None
    if args.regime != "none":
        regime = load_instance(_shipped(Path(args.regime), DEFAULT_REGIME_INSTANCE))
    report = run_paper(instance, args.out, settings, regime)
    report["_text"] += f"\n\nwrote {len(report['files'])} files to {args.out}/ in {report['runtime_s']:.0f} s"
    return report


def _shipped(path: Path, default: str) -> Path:
    """The default instance from the checkout, or outside one the copy shipped with the package."""
    if path == Path(default) and not path.exists():
        return packaged_instance(path.name)
    return path


def format_rows(name: str, rows: list[dict[str, Any]]) -> str:
    width = max(len(r["label"]) for r in rows)
    head = f"{'strategy':<{width}}  " + "  ".join(f"{title:>10}" for _, title, _ in COLUMNS)
    lines = [f"{name}: {rows[0]['micro_batches']} micro-batches", head]
    for r in rows:
        cells = "  ".join(f"{r[key]:>10{fmt}}" for key, _, fmt in COLUMNS)
        lines.append(f"{r['label']:<{width}}  {cells}")
    return "\n".join(lines)
