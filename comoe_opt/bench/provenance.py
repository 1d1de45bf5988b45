"""Where a result came from: package versions (per worker) and the commit (per invocation)."""

from __future__ import annotations

import functools
import platform
import subprocess
from importlib import metadata
from pathlib import Path

from comoe_opt.parallel import available_cores

PACKAGES = ("comoe-opt", "numpy", "pandas", "pyomo", "highspy", "ortools", "scipy")


@functools.cache
def package_versions() -> dict[str, str]:
    """`version_<package>` columns: the versions the worker ran with (workers may differ)."""
    out = {"version_python": platform.python_version()}
    for name in PACKAGES:
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            version = "absent"
        out[f"version_{name.replace('-', '_')}"] = version
    return out


def commit(where: Path | None = None) -> str:
    """Short commit of the checkout holding comoe_opt, `-dirty` when it has uncommitted changes."""
    where = where or Path(__file__).resolve().parent
    try:
        head = _git(where, "rev-parse", "--short", "HEAD")
        dirty = _git(where, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head}-dirty" if dirty else head


def _git(where: Path, *args: str) -> str:
    out = subprocess.run(["git", *args], cwd=where, capture_output=True, text=True, check=True, timeout=30)
    return out.stdout.strip()


def machine() -> str:
    """The machine of this process, for report headers: cores, CPU model, Python, OS."""
    python = platform.python_version()
    return f"nproc {available_cores()}; CPU {_cpu_model()}; Python {python}; {platform.system()}"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
