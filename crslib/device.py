"""Where torch work runs: the ``--device`` option and mixed precision.

:func:`resolve_device` turns the user's choice (``"auto"``, ``"cpu"``,
``"cuda"``, ``"mps"``, or ``"cuda:N"``) into the device string every
computing function uses: ``"auto"`` takes a CUDA GPU when torch sees one,
else Apple's MPS, else the CPU; an explicit GPU that torch does not see is a
one-line :class:`~crslib.errors.InputError` (the ``crs`` command exits 2).

The device never enters a cache key: the embedding cache, the zoo and the
fine-tuning cache are keyed by content, and a GPU computes the same numbers
as the CPU up to floating-point rounding (stated per function). Mixed
precision (:func:`autocast`) does change the numbers, so it is part of the
embedding cache key when it is on.

Examples
--------
>>> resolve_device("cpu")
'cpu'
>>> resolve_device("tpu")
Traceback (most recent call last):
...
crslib.errors.InputError: device must be one of auto, cpu, cuda, mps (or cuda:N), got 'tpu'
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import crslib  # noqa: F401  (applies the torchvision import fix before torch)
from crslib.errors import InputError

__all__ = ["DEVICES", "autocast", "autocast_dtype", "resolve_device"]

#: The choices of ``--device``.
DEVICES = ("auto", "cpu", "cuda", "mps")


def _mps_available(torch) -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def resolve_device(device: str | None = "auto") -> str:
    """The torch device to compute on.

    Parameters
    ----------
    device : {"auto", "cpu", "cuda", "mps"} or "cuda:N"
        ``"auto"`` (or None): ``"cuda"`` when ``torch.cuda.is_available()``,
        else ``"mps"`` when available, else ``"cpu"``.

    Returns
    -------
    str
        ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"mps"``.

    Raises
    ------
    InputError
        An unknown name, or a GPU that torch does not see (one line naming
        what to use instead).

    Examples
    --------
    >>> resolve_device("cpu")
    'cpu'
    """
    import torch

    value = "auto" if device is None else str(device).strip().lower()
    base, _, index = value.partition(":")
    if base not in DEVICES or (index and (base != "cuda" or not index.isdigit())):
        raise InputError(f"device must be one of {', '.join(DEVICES)} (or cuda:N), got {device!r}")
    if base == "auto":
        if torch.cuda.is_available():
            return "cuda"
        return "mps" if _mps_available(torch) else "cpu"
    if base == "cuda":
        if not torch.cuda.is_available():
            raise InputError(
                f"device {value!r} was requested but torch sees no CUDA GPU "
                f"(torch {torch.__version__}, built {'with' if torch.version.cuda else 'without'} CUDA); "
                "use --device cpu or auto"
            )
        if index and int(index) >= torch.cuda.device_count():
            raise InputError(
                f"device {value!r} was requested but torch sees {torch.cuda.device_count()} CUDA GPU(s); "
                f"use cuda:0 .. cuda:{torch.cuda.device_count() - 1}, cpu or auto"
            )
        return value
    if base == "mps" and not _mps_available(torch):
        raise InputError("device 'mps' was requested but torch sees no Apple MPS device; use --device cpu or auto")
    return base


def is_gpu(device: str) -> bool:
    """Whether a resolved device string names a GPU."""
    return not str(device).startswith("cpu")


@contextlib.contextmanager
def autocast(device: str, enabled: bool) -> Iterator[None]:
    """The precision of inference on ``device``.

    ``enabled``: mixed precision, float16 on CUDA and MPS, bfloat16 on the
    CPU (the CPU's autocast type). Not enabled: float32, and on CUDA true
    float32 for the duration (TF32 off for matmul and cuDNN convolutions,
    which torch otherwise allows for convolutions), so GPU embeddings match
    the CPU's within the tolerance stated in
    :meth:`crslib.models.TorchEncoder.to`.
    """
    import torch

    kind = str(device).split(":")[0]
    if enabled:
        with torch.autocast(device_type=kind, dtype=getattr(torch, autocast_dtype(device))):
            yield
        return
    if kind != "cuda":
        yield
        return
    old = (torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision())
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = old[0]
        torch.set_float32_matmul_precision(old[1])


def deterministic_gpu_setup(device: str) -> None:
    """Let ``torch.use_deterministic_algorithms(True)`` run cuBLAS on a GPU:
    it needs a fixed workspace, set before the first cuBLAS call (a user's
    own setting is kept)."""
    if str(device).startswith("cuda"):
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def autocast_dtype(device: str) -> str:
    """Name of the type :func:`autocast` computes in on ``device``."""
    return "bfloat16" if str(device).startswith("cpu") else "float16"
