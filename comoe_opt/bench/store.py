"""The result store of a suite: one JSON file per finished run, and the consolidated Parquet.

`OUT/runs/<run_id>.json` is written atomically (temporary file + rename) as
soon as a run finishes, so an interruption never loses a finished run and
never leaves half a file. `OUT/results.parquet` is rebuilt from those files:
one row per run of the suite, sorted by run id, so two invocations that
finished the same runs write the same table (wall-clock columns aside, see
`NONDETERMINISTIC`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from comoe_opt.files import atomic_path, writable_folder

# Columns that depend on when and where a run ran, not on its spec. Every other
# column is a function of the spec (for runs that finish before their time limit).
NONDETERMINISTIC = ("runtime_s", "build_s", "solver_s", "wall_s", "finished_at", "worker")
LEADING = (
    "run_id",
    "suite",
    "group",
    "kind",
    "method",
    "seed",
    "window",
    "instance",
    "point",
    "run_status",
    "error",
    "solver_status",
)
TRAILING = ("wall_s", "finished_at", "worker", "commit", "traceback")


class ResultStore:
    def __init__(self, out: Path):
        self.out = Path(out)
        self.runs = self.out / "runs"
        self.parquet = self.out / "results.parquet"

    def check_writable(self) -> None:
        """Fail before the first run, not after it, when results could not be stored."""
        writable_folder(self.out, "--out")
        writable_folder(self.runs, "--out")

    def path(self, run_id: str) -> Path:
        return self.runs / f"{run_id}.json"

    def save(self, row: dict[str, Any]) -> Path:
        path = self.path(row["run_id"])
        text = json.dumps(_plain(row), sort_keys=True, indent=1, allow_nan=False)
        with atomic_path(path) as tmp:
            tmp.write_text(text + "\n", encoding="utf-8")
        return path

    def load(self, run_id: str) -> dict[str, Any] | None:
        """A stored row, or None when the run has not finished (or its file is unreadable)."""
        path = self.path(run_id)
        try:
            row = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return None  # not written by us (writes are atomic): run it again
        return row if isinstance(row, dict) and row.get("run_id") == run_id else None

    def rows(self, run_ids: Iterable[str]) -> list[dict[str, Any]]:
        return [row for rid in run_ids if (row := self.load(rid)) is not None]

    def finished_ok(self, run_ids: Iterable[str]) -> set[str]:
        return {row["run_id"] for row in self.rows(run_ids) if row.get("run_status") == "ok"}

    def consolidate(self, run_ids: Iterable[str]) -> pd.DataFrame:
        """Write `results.parquet` from the stored rows of `run_ids` and return the table."""
        frame = results_frame(self.rows(run_ids))
        with atomic_path(self.parquet) as tmp:
            frame.to_parquet(tmp, index=False)
        return frame


def results_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Rows sorted by run id; columns: spec, status, swept keys, metrics, versions, provenance."""
    rows = sorted(rows, key=lambda r: r["run_id"])
    keys = {k for row in rows for k in row} - set(LEADING) - set(TRAILING)
    swept = sorted(k for k in keys if "." in k)
    versions = sorted(k for k in keys if k.startswith("version_"))
    metrics = sorted(keys - set(swept) - set(versions))
    columns = [*LEADING, *swept, *metrics, *versions, *TRAILING]
    frame = pd.DataFrame.from_records(rows, columns=columns)
    return frame.reset_index(drop=True)


def deterministic_columns(frame: pd.DataFrame) -> list[str]:
    return [c for c in frame.columns if c not in NONDETERMINISTIC and c != "traceback"]


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    """JSON-safe scalars: NumPy numbers as Python numbers, non-finite floats as null."""
    out = {}
    for key, value in row.items():
        if hasattr(value, "item") and not isinstance(value, (str, bytes)):
            value = value.item()
        if isinstance(value, float) and not math.isfinite(value):
            value = None
        out[key] = value
    return out
