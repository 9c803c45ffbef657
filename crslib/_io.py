"""Atomic writes and content hashes shared by the modules that touch files."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

_CHUNK = 1 << 20


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file and a rename, so a
    reader never sees a half-written file and a killed writer leaves none."""
    return _atomic_write(path, lambda handle: handle.write(data))


def _atomic_write(path: str | os.PathLike, write: Callable[[Any], Any]) -> Path:
    """Call ``write(handle)`` on a temporary file beside ``path``, then rename it to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp creates the file 0600; a plain open() would honour the umask, so a shared course
        # folder or a web server can read a run folder's files
        os.chmod(tmp, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _umask() -> int:
    """The process's umask, read without changing it where the system says it (Linux /proc)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)  # elsewhere the only way to read it is to set it and set it back
    os.umask(mask)
    return mask


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Atomic counterpart of ``Path.write_text`` (UTF-8)."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``obj`` as indented, key-sorted JSON, atomically."""
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def atomic_save_npy(path: str | os.PathLike, array: np.ndarray) -> Path:
    """Save one array in ``.npy`` format, atomically (streamed to the file: no second copy in memory)."""
    return _atomic_write(path, lambda handle: np.save(handle, np.ascontiguousarray(array), allow_pickle=False))


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 hex digest of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def digest_of(parts: Iterable[Any]) -> str:
    """SHA-256 hex digest of a sequence of values, each rendered as JSON so
    that ``("a", "bc")`` and ``("ab", "c")`` differ."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(json.dumps(part, sort_keys=True, default=str).encode("utf-8"))
        digest.update(b"\x00")
    return digest.hexdigest()


def json_ready(obj: Any, digits: int | None = None) -> Any:
    """A copy of ``obj`` made of plain JSON types.

    Mappings, sequences, sets, numpy arrays and DataFrames (as a list of
    records) are converted recursively; numpy scalars become Python ones;
    NaN, infinities and pandas' missing values become ``None`` (JSON has no
    NaN); floats are rounded to ``digits`` when given; anything else becomes
    its ``str``.

    Examples
    --------
    >>> import numpy as np
    >>> json_ready({"a": np.float32(0.123456), "b": [np.nan, np.int64(2)]}, digits=3)
    {'a': 0.123, 'b': [None, 2]}
    """
    import math

    import numpy as np
    import pandas as pd

    if obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        value = float(obj)
        if not math.isfinite(value):
            return None
        return round(value, digits) if digits is not None else value
    if isinstance(obj, pd.DataFrame):
        return json_ready(obj.to_dict(orient="records"), digits)
    if isinstance(obj, dict) or hasattr(obj, "items"):
        return {str(k): json_ready(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [json_ready(v, digits) for v in obj]
    if isinstance(obj, np.ndarray):
        return json_ready(obj.tolist(), digits)
    if obj is pd.NA or obj is pd.NaT:
        return None
    return str(obj)


class JsonResult:
    """Mixin of the result dataclasses: ``to_json()`` is their ``to_dict()`` as JSON text.

    ``to_dict()`` (JSON-ready: NaN as None, arrays as lists), which each
    result class defines, is what a caller inspects; ``to_json()`` is what a
    run writes to a file.
    """

    to_dict: Any  # defined by every result class

    def to_json(self) -> str:
        """:meth:`to_dict` as indented JSON text, ending with a newline."""
        return json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n"
