"""Atomic file writes: a file is either complete or absent, never half written."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from comoe_opt.errors import InputError


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path beside `path`, renamed onto it only on success."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise InputError(path, None, f"cannot write: {exc.strerror or exc}") from None
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; files follow the umask like any other
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise InputError(path, None, f"cannot write: {exc.strerror or exc}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def writable_folder(path: Path, option: str) -> Path:
    """`path` as a folder results can be written to (created if missing), checked by writing a
    probe file: a file in the way, a read-only mount or a full disk fail now, in one line,
    rather than after the first result."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise InputError(None, f"{option} {path}", "exists and is not a folder")
    probe = path / ".write-probe"
    try:
        path.mkdir(parents=True, exist_ok=True)
        with open(probe, "w", encoding="utf-8") as fh:
            fh.write("probe\n")
        probe.unlink()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise InputError(None, f"{option} {path}", f"cannot write results there ({reason})") from None
    return path
