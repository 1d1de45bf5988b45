"""Safe `.npz` reading: each array's declared shape is checked against what the archive
really holds before anything is allocated, and pickled (object) arrays are refused.

`np.load` trusts an array header: a few-byte file declaring a shape of 10^12 makes it
allocate terabytes. Here every member's header is read first and its size compared with
the member's stored (uncompressed) size and with `MAX_ARRAY_BYTES`.
"""

from __future__ import annotations

import zipfile
import zlib
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from comoe_opt.errors import InputError, first_line

MAX_ARRAY_BYTES = 8 * 2**30  # one array above 8 GiB is not a trace a 24 GiB machine can plan on
_ZIP_MAGIC = b"PK\x03\x04"
_EMPTY_ZIP_MAGIC = b"PK\x05\x06"
_NPY_MAGIC = b"\x93NUMPY"


def read_npz(path: Path, keys: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """The arrays of an `.npz` archive (only `keys` when given, those present), validated.

    Raises `InputError` naming the file (and array) for anything that is not a well-formed
    archive of plain arrays whose declared sizes match their contents.
    """
    path = Path(path)
    _check_magic(path)
    wanted = None if keys is None else set(keys)
    try:
        with zipfile.ZipFile(path) as archive:
            members = {
                info.filename[: -len(".npy")]: info
                for info in archive.infolist()
                if info.filename.endswith(".npy")
            }
            return {
                name: _read_member(archive, info, path, name)
                for name, info in members.items()
                if wanted is None or name in wanted
            }
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError, NotImplementedError) as exc:
        raise InputError(path, None, f"not a readable .npz archive: {first_line(exc)}") from None


def npz_names(path: Path) -> list[str]:
    """The array names an `.npz` archive holds, without reading any array."""
    _check_magic(path)
    try:
        with zipfile.ZipFile(path) as archive:
            return [n[: -len(".npy")] for n in archive.namelist() if n.endswith(".npy")]
    except (zipfile.BadZipFile, OSError) as exc:
        raise InputError(path, None, f"not a readable .npz archive: {first_line(exc)}") from None


def _check_magic(path: Path) -> None:
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
    except FileNotFoundError:
        raise InputError(path, None, "no such file") from None
    except IsADirectoryError:
        raise InputError(path, None, "not a readable .npz archive: it is a folder") from None
    except OSError as exc:
        raise InputError(path, None, f"not a readable .npz archive: {first_line(exc)}") from None
    if head.startswith(_NPY_MAGIC):
        raise InputError(
            path, None, "not a readable .npz archive: a single .npy array (write it with np.savez)"
        )
    if not (head.startswith(_ZIP_MAGIC) or head.startswith(_EMPTY_ZIP_MAGIC)):
        raise InputError(path, None, "not a readable .npz archive: no zip header")


def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, path: Path, name: str) -> np.ndarray:
    with archive.open(info) as fh:
        try:
            version = np.lib.format.read_magic(fh)
            header = (
                np.lib.format.read_array_header_1_0(fh)
                if version == (1, 0)
                else np.lib.format.read_array_header_2_0(fh)
            )
        except (ValueError, EOFError) as exc:
            raise InputError(path, name, f"not a valid .npy array header: {first_line(exc)}") from None
        shape, fortran, dtype = header
        if dtype.hasobject:
            raise InputError(path, name, "holds pickled (object) data, which is never loaded")
        declared = _declared_bytes(shape, dtype)
        if declared > MAX_ARRAY_BYTES:
            raise InputError(
                path, name, f"declares shape {list(shape)}: {declared / 2**30:.3g} GiB, above the 8 GiB limit"
            )
        stored = info.file_size - fh.tell()
        if declared > stored:
            raise InputError(
                path, name, f"declares shape {list(shape)} ({declared} bytes) but holds only {stored} bytes"
            )
        data = fh.read(declared)
    array = np.frombuffer(data, dtype=dtype, count=int(np.prod(shape, dtype=np.int64)))
    array = array.reshape(shape, order="F" if fortran else "C")
    return array.copy()  # writable, and detached from the read buffer


def _declared_bytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    total = dtype.itemsize
    for n in shape:
        total *= int(n)
    return total
