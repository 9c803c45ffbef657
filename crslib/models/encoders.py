"""The Encoder interface and its backends: plain torch modules, timm models
and ONNX graphs.

Every encoder turns a float image in ``[0, 1]`` of shape ``(H, W, C)`` into a
fixed-length embedding. It carries its preprocessing (input size, mean, std,
interpolation, channels) and a :meth:`Encoder.fingerprint` that changes when
the weights, the architecture or the preprocessing change, so the embedding
cache (:mod:`crslib.embed`) is keyed by content, never by a name alone.

Encoders are usually created from a model spec string by
:func:`crslib.models.load_encoder` (see :mod:`crslib.models.specs` for the
spec forms). Plain torch modules have no spec string: wrap them with
:class:`TorchEncoder`, e.g.
``TorchEncoder(model, name="zoo:simclr-seed0", preprocessing=Preprocessing(...))``.

Weight files are hashed with :func:`weights_sha256`, memoised per file stamp;
state dicts of modules with :func:`_state_dict_sha256`, memoised until a
tensor changes.

Examples
--------
>>> import crslib, torch
>>> from crslib.models.encoders import Preprocessing, TorchEncoder
>>> pre = Preprocessing((3, 32, 32), (0.5,) * 3, (0.25,) * 3, "bilinear", 3)
>>> enc = TorchEncoder(torch.nn.Conv2d(3, 8, 3), name="tiny", preprocessing=pre)
>>> import numpy as np
>>> x = enc.preprocess(np.zeros((16, 16, 1), dtype=np.float32))
>>> tuple(x.shape)
(3, 32, 32)
>>> enc.encode(x[None]).shape
(1, 8)
"""

from __future__ import annotations

import abc
import hashlib
import logging
import math
import os
import threading
import time
import weakref
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

import crslib  # noqa: F401  (applies the torchvision import fix before torch/timm)
from crslib._io import digest_of, file_sha256
from crslib.errors import ModelError
from crslib.models._options import _parse_bool, _parse_float, _parse_floats, _parse_int

log = logging.getLogger(__name__)

__all__ = [
    "Encoder",
    "OnnxEncoder",
    "Preprocessing",
    "TimmEncoder",
    "TorchEncoder",
    "weights_sha256",
]

_INTERPOLATIONS = ("bilinear", "bicubic", "nearest", "area")


# --------------------------------------------------------------------------- preprocessing


@dataclass(frozen=True)
class Preprocessing:
    """How an image becomes a model input.

    Parameters
    ----------
    input_size : tuple of int
        ``(C, H, W)`` of the model input.
    mean, std : tuple of float
        Per-channel normalisation ``(x * scale - mean) / std``, in the model's
        channel order.
    interpolation : str
        ``"bilinear"``, ``"bicubic"``, ``"nearest"`` or ``"area"``; resizing
        is antialiased where the mode supports it.
    channels : int
        Number of input channels, 1 or 3 (grayscale images are repeated to
        three channels, colour images converted to luminance for one).
    bgr : bool
        Feed colour channels in BGR order.
    scale : float
        Factor applied to the ``[0, 1]`` image before normalising.

    Examples
    --------
    >>> p = Preprocessing((3, 64, 64), (0.5,) * 3, (0.5,) * 3, "bilinear", 3)
    >>> p.to_dict()["input_size"]
    [3, 64, 64]
    """

    input_size: tuple[int, int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    interpolation: str = "bilinear"
    channels: int = 3
    bgr: bool = False
    scale: float = 1.0

    def __post_init__(self) -> None:
        size = tuple(int(v) for v in self.input_size)
        if len(size) != 3 or min(size) < 1:
            raise ModelError(f"preprocessing input_size must be (C, H, W) of positive ints, got {self.input_size!r}")
        if int(self.channels) not in (1, 3):
            raise ModelError(f"preprocessing channels must be 1 or 3, got {self.channels!r}")
        mean = tuple(float(v) for v in np.atleast_1d(self.mean))
        std = tuple(float(v) for v in np.atleast_1d(self.std))
        for label, values in (("mean", mean), ("std", std)):
            if len(values) not in (1, int(self.channels)):
                raise ModelError(
                    f"preprocessing {label} has {len(values)} values for {self.channels} channels"
                )
        if any(v == 0 or not math.isfinite(v) for v in std) or not all(math.isfinite(v) for v in mean):
            raise ModelError(f"preprocessing std must be finite and non-zero, got {std}")
        if self.interpolation not in _INTERPOLATIONS:
            raise ModelError(
                f"unknown interpolation {self.interpolation!r}: use one of {', '.join(_INTERPOLATIONS)}"
            )
        object.__setattr__(self, "input_size", size)
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "std", std)
        object.__setattr__(self, "channels", int(self.channels))
        object.__setattr__(self, "bgr", bool(self.bgr))
        object.__setattr__(self, "scale", float(self.scale))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, used in cache keys and run records."""
        d = asdict(self)
        d["input_size"] = list(self.input_size)
        d["mean"] = list(self.mean)
        d["std"] = list(self.std)
        return d

    def apply(self, image: np.ndarray):
        """Turn one ``(H, W, C)`` float image in ``[0, 1]`` into a ``(C, H, W)``
        float32 tensor ready for the model (see :meth:`Encoder.preprocess`)."""
        return self.apply_batch([image])[0]

    def apply_batch(self, images: list[np.ndarray]):
        """Preprocess several images at once; images of equal shape are
        resized together, which is faster than one at a time.

        Channel matching, scaling and normalisation run in NumPy (single
        threaded): torch's multi-threaded element-wise kernels cost more in
        synchronisation than they save on images this small, and they compete
        with the model's threads. Resizing uses torch (antialiased).

        Returns
        -------
        torch.Tensor
            ``(B, C, H, W)`` float32.
        """
        import torch

        c, h, w = self.input_size
        n = len(images)
        out = np.empty((n, c, h, w), dtype=np.float32)
        groups: dict[tuple[int, ...], list[int]] = {}
        arrays = []
        for i, image in enumerate(images):
            arr = _as_hwc(image)
            arrays.append(arr)
            groups.setdefault(arr.shape, []).append(i)
        gains = [self.scale / self.std[k % len(self.std)] for k in range(c)]
        offsets = [self.mean[k % len(self.mean)] / self.std[k % len(self.std)] for k in range(c)]
        for shape, idx in groups.items():
            batch = np.stack([arrays[i] for i in idx]).transpose(0, 3, 1, 2)  # (b, C_in, H, W) view
            if batch.shape[1] == 3 and c == 1:
                lum = np.float32([0.299, 0.587, 0.114]).reshape(1, 3, 1, 1)
                batch = (batch * lum).sum(axis=1, keepdims=True, dtype=np.float32)
            elif batch.shape[1] not in (1, c):
                raise ModelError(f"cannot turn {batch.shape[1]}-channel images into {c}-channel model input")
            if batch.shape[-2:] != (h, w):
                batch = _resize(torch.from_numpy(np.ascontiguousarray(batch)), (h, w), self.interpolation).numpy()
            dst = out if len(idx) == n else np.empty((len(idx), c, h, w), dtype=np.float32)
            for k in range(c):
                src = 0 if batch.shape[1] == 1 else (c - 1 - k if self.bgr else k)
                np.multiply(batch[:, src], np.float32(gains[k]), out=dst[:, k])
                if offsets[k]:
                    dst[:, k] -= np.float32(offsets[k])
            if dst is not out:
                out[idx] = dst
        return torch.from_numpy(out)


def _as_hwc(image: np.ndarray) -> np.ndarray:
    arr = np.asarray(image)
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if arr.ndim != 3 or arr.shape[2] not in (1, 2, 3, 4) or arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ModelError(f"expected an image of shape (H, W, C) with C in 1-4, got shape {arr.shape}")
    if arr.shape[2] == 2:  # gray + alpha
        arr = arr[:, :, :1]
    elif arr.shape[2] == 4:  # RGBA
        arr = arr[:, :, :3]
    if arr.dtype != np.float32:
        if arr.dtype == np.uint8:
            arr = arr.astype(np.float32) / 255.0
        elif arr.dtype == np.uint16:
            arr = arr.astype(np.float32) / 65535.0
        else:
            arr = arr.astype(np.float32)
    return np.ascontiguousarray(arr)


def _resize(batch, size: tuple[int, int], interpolation: str):
    import torch.nn.functional as F

    if interpolation in ("bilinear", "bicubic"):
        out = F.interpolate(batch, size=size, mode=interpolation, align_corners=False, antialias=True)
        if interpolation == "bicubic":
            out = out.clamp_(0.0, 1.0)
        return out
    if interpolation == "area":
        return F.interpolate(batch, size=size, mode="area")
    return F.interpolate(batch, size=size, mode="nearest-exact")


def _timm_interpolation(value: str | None) -> str:
    value = (value or "bilinear").lower()
    if value in ("bicubic", "lanczos"):
        return "bicubic"
    if value == "nearest":
        return "nearest"
    return "bilinear"


# --------------------------------------------------------------------------- hashes


_FILE_HASHES: dict[tuple[str, int, int, int, int, int], str] = {}
_FILE_HASHES_LOCK = threading.Lock()
#: A file's stat stamp is trusted for the memo only when the file last changed
#: this long before it was hashed: file-system timestamps are coarse (a kernel
#: tick, or seconds), so a rewrite soon after hashing could leave every field
#: of the stamp unchanged ("racy" stamps, as in git's index).
_STAMP_SETTLED_NS = 2_000_000_000


def _file_stamp(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """Identity of a file's current content as far as ``stat`` can tell:
    ``ctime`` changes on every write and cannot be set by users, unlike
    ``mtime`` (restored by ``cp -p``, ``rsync -t`` or ``os.utime``)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def weights_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a weight file's bytes, memoised so repeated calls cost one
    ``stat``.

    The memo is keyed by the real path and the file's stamp (device, inode,
    size, mtime and ctime in nanoseconds), and only files that had not changed
    for :data:`_STAMP_SETTLED_NS` when they were hashed are memoised; a file
    rewritten in place with the same size and a restored mtime is hashed
    again.

    Parameters
    ----------
    path : str or PathLike
        The weight file.

    Returns
    -------
    str
        Hex digest of the file's content.

    Examples
    --------
    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "w.bin"); _ = open(p, "wb").write(b"x")
    >>> weights_sha256(p)[:8]
    '2d711642'
    """
    real = os.path.realpath(path)
    started_ns = time.time_ns()
    stamp = _file_stamp(os.stat(real))
    memo_key = (real, *stamp)
    with _FILE_HASHES_LOCK:
        hit = _FILE_HASHES.get(memo_key)
    if hit is not None:
        return hit
    value = file_sha256(real)
    settled = started_ns - max(stamp[3], stamp[4]) > _STAMP_SETTLED_NS
    if settled and _file_stamp(os.stat(real)) == stamp:  # unchanged while it was read
        with _FILE_HASHES_LOCK:
            _FILE_HASHES[memo_key] = value
    return value


_STATE_HASHES: "weakref.WeakKeyDictionary[Any, tuple[tuple, str]]" = weakref.WeakKeyDictionary()


def _state_signature(state) -> tuple:
    """Cheap identity of a state dict's content: storage pointers and
    autograd version counters change whenever a tensor is replaced or modified
    in place (optimiser steps, ``load_state_dict``, ``add_`` under no_grad)."""
    import torch

    sig = []
    for key, t in state.items():
        if isinstance(t, torch.Tensor):
            sig.append((key, t.data_ptr(), t._version, tuple(t.shape), str(t.dtype), t.device.type))
        else:
            sig.append((key, repr(t)))
    return tuple(sig)


def _module_device(module) -> str:
    """Device of a module's first tensor (``"cpu"`` for a module without any)."""
    for t in module.state_dict().values():
        if hasattr(t, "device"):
            return "cpu" if t.device.type == "cpu" else str(t.device)
    return "cpu"


def _state_dict_sha256(module) -> str:
    """SHA-256 of a module's state dict (names, dtypes, shapes, bytes),
    memoised per module until one of its tensors changes."""
    import torch

    state = module.state_dict()
    signature = _state_signature(state)
    try:
        memo = _STATE_HASHES.get(module)
    except TypeError:  # not weak-referenceable
        memo = None
    if memo is not None and memo[0] == signature:
        return memo[1]
    digest = hashlib.sha256()
    for key in sorted(state):
        tensor = state[key]
        if not isinstance(tensor, torch.Tensor):
            digest.update(f"{key}:{tensor!r}".encode())
            continue
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{key}:{t.dtype}:{tuple(t.shape)}".encode())
        if t.numel():
            if t.dtype == torch.bool:
                t = t.to(torch.uint8)
            digest.update(t.reshape(-1).view(torch.uint8).numpy().data)
    value = digest.hexdigest()
    try:
        _STATE_HASHES[module] = (signature, value)
    except TypeError:
        pass
    return value


def _loaded_or_state(encoder, files_fingerprint: str | None) -> str:
    """The weight files' fingerprint while the module still holds the weights loaded from them
    (``encoder._loaded_signature``), else the hash of its current state dict."""
    if files_fingerprint is not None and (
            _state_signature(encoder.module.state_dict()) == encoder._loaded_signature):
        return files_fingerprint
    return "state_dict:" + _state_dict_sha256(encoder.module)


# --------------------------------------------------------------------------- interface


class Encoder(abc.ABC):
    """An image encoder: preprocessing, a forward pass, and a fingerprint.

    The length of one embedding is the property :attr:`embedding_dim`.

    Attributes
    ----------
    name : str
        Canonical spec string (or the name a :class:`TorchEncoder` was given).
    preprocessing : Preprocessing
        How :meth:`preprocess` turns an image into model input.
    """

    name: str
    preprocessing: Preprocessing
    backend: str = "abstract"
    #: Where :meth:`encode` computes (set by :meth:`to`); never part of the fingerprint.
    device: str = "cpu"
    #: Mixed precision in :meth:`encode` (set by :meth:`to`); changes the numbers.
    amp: bool = False

    def to(self, device: str = "cpu", *, amp: bool = False) -> Encoder:
        """Compute on ``device`` (see :func:`crslib.device.resolve_device`),
        in mixed precision when ``amp``; returns the encoder. This base
        backend computes on the CPU in full precision whatever is asked
        (and logs so)."""
        from crslib.device import resolve_device

        dev = resolve_device(device)
        if dev != "cpu" or amp:
            log.warning("%s encoders run on the CPU in float32; ignoring device=%r amp=%r", self.backend, dev, amp)
        return self

    @property
    @abc.abstractmethod
    def embedding_dim(self) -> int:
        """Length ``D`` of one embedding (an int)."""

    @abc.abstractmethod
    def _weights_fingerprint(self) -> str:
        """Hash of the weights' content."""

    def _architecture(self) -> dict[str, Any]:
        return {}

    def fingerprint(self) -> str:
        """Content hash of backend, architecture, weights and preprocessing.

        Two encoders with equal fingerprints give the same embeddings; any
        change of the weight file's bytes, the architecture or the
        preprocessing changes it.
        """
        return digest_of(
            [
                "crslib-encoder",
                self.backend,
                self._architecture(),
                self._weights_fingerprint(),
                self.preprocessing.to_dict(),
            ]
        )

    def preprocess(self, image: np.ndarray):
        """One ``(H, W, C)`` float image in ``[0, 1]`` -> ``(C, H, W)`` float32
        tensor: channels matched (grayscale repeated to three channels, or
        colour to luminance), resized to the input size (antialiased), scaled
        and normalised."""
        return self.preprocessing.apply(image)

    def preprocess_batch(self, images: list[np.ndarray]):
        """Several images -> ``(B, C, H, W)`` float32 tensor (faster than
        :meth:`preprocess` one at a time)."""
        return self.preprocessing.apply_batch(images)

    @abc.abstractmethod
    def encode(self, batch) -> np.ndarray:
        """``(B, C, H, W)`` preprocessed batch -> ``(B, D)`` float32 embeddings
        (no gradients, eval mode)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, dim={self.embedding_dim})"


def _pool_output(out: np.ndarray | Any, *, layout_hint: str = "nchw"):
    """Reduce a model output to ``(B, D)``."""
    if out.ndim == 2:
        return out
    if out.ndim == 4:
        axes = (2, 3) if layout_hint == "nchw" else (1, 2)
        return out.mean(axes)
    if out.ndim == 3:
        return out.mean(1)
    return out.reshape(out.shape[0], -1)


class TorchEncoder(Encoder):
    """Wrap any ``torch.nn.Module`` as an :class:`Encoder`.

    The module must map a ``(B, C, H, W)`` batch to ``(B, D)`` embeddings or
    ``(B, C', H', W')`` feature maps (global-average pooled here); a tuple or
    list output uses its first element.

    Parameters
    ----------
    module : torch.nn.Module
        The model; :meth:`encode` runs it in eval mode without gradients and
        restores its previous train/eval mode afterwards.
    name : str
        Name shown in results (e.g. ``"zoo:simclr-seed0"``).
    preprocessing : Preprocessing
        Input size, normalisation and channels the module expects.
    fingerprint : str, optional
        Content hash of the weights to use instead of hashing the state dict
        (e.g. the checkpoint file's SHA-256). It stands for the weights only
        while the module's tensors are unchanged: after an in-place change
        (an optimiser step) the state dict is hashed instead.

    Examples
    --------
    >>> import crslib, torch
    >>> net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU())
    >>> pre = Preprocessing((3, 32, 32), (0.5,) * 3, (0.25,) * 3, "bilinear", 3)
    >>> enc = TorchEncoder(net, name="tiny", preprocessing=pre)
    >>> enc.encode(torch.zeros(2, 3, 32, 32)).shape
    (2, 8)
    """

    backend = "torch"

    def __init__(self, module, *, name: str, preprocessing: Preprocessing, fingerprint: str | None = None):
        import torch

        if not isinstance(module, torch.nn.Module):
            raise ModelError(f"TorchEncoder needs a torch.nn.Module, got {type(module).__name__}")
        if not isinstance(preprocessing, Preprocessing):
            raise ModelError("TorchEncoder needs preprocessing=Preprocessing(...)")
        self.module = module
        self.name = str(name)
        self.preprocessing = preprocessing
        self._given_fingerprint = fingerprint
        self._given_signature = _state_signature(module.state_dict()) if fingerprint is not None else None
        self._dim: int | None = None
        self.device = _module_device(module)
        self.amp = False

    def to(self, device: str = "cpu", *, amp: bool = False) -> TorchEncoder:
        """Move the module to ``device`` and run :meth:`encode` there (batches
        are moved too), under autocast when ``amp`` (float16 on a GPU,
        bfloat16 on the CPU).

        The fingerprint does not change: the weights are the same numbers on
        any device. In float32, embeddings computed on a GPU equal the CPU's
        up to rounding (other kernels, other summation order); the tolerance
        crslib holds them to is a max absolute deviation of 1e-3 times the
        largest absolute embedding value (``bench/bench_device.py`` checks
        it where a GPU is present; TF32 is switched off while encoding, see
        :func:`crslib.device.autocast`).
        """
        from crslib.device import resolve_device

        dev = resolve_device(device)
        if dev != self.device:
            self._move_module(dev)
        self.device = dev
        self.amp = bool(amp)
        return self

    def _move_module(self, dev: str) -> None:
        """``module.to(dev)`` keeping the weights' identity: a given or file
        fingerprint that described the module still describes it (the
        tensors' storage moved, their values did not)."""
        before = _state_signature(self.module.state_dict())
        held = [a for a in ("_given_signature", "_loaded_signature") if getattr(self, a, None) == before]
        try:
            memo = _STATE_HASHES.get(self.module)
        except TypeError:
            memo = None
        self.module.to(dev)
        after = _state_signature(self.module.state_dict())
        for attr in held:
            setattr(self, attr, after)
        if memo is not None and memo[0] == before:
            _STATE_HASHES[self.module] = (after, memo[1])

    @property
    def model(self):
        return self.module

    def _architecture(self) -> dict[str, Any]:
        return {"name": self.name, "class": f"{type(self.module).__module__}.{type(self.module).__qualname__}"}

    def _weights_fingerprint(self) -> str:
        if self._given_fingerprint is not None and (
            _state_signature(self.module.state_dict()) == self._given_signature
        ):
            return "given:" + str(self._given_fingerprint)
        return "state_dict:" + _state_dict_sha256(self.module)

    @property
    def embedding_dim(self) -> int:
        if self._dim is None:
            import torch

            c, h, w = self.preprocessing.input_size
            self._dim = int(self._forward(torch.zeros(1, c, h, w)).shape[1])
        return self._dim

    def _forward(self, batch):
        import torch

        from crslib.device import autocast

        was_training = self.module.training
        self.module.eval()
        try:
            with torch.inference_mode(), autocast(self.device, self.amp):
                out = self.module(batch.to(self.device, non_blocking=True))
        finally:
            if was_training:
                self.module.train()
        if isinstance(out, (tuple, list)):
            out = out[0]
        if isinstance(out, dict):
            raise ModelError(f"model {self.name} returns a dict; wrap it so that it returns a tensor")
        if not isinstance(out, torch.Tensor) or out.ndim not in (2, 4):
            shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ModelError(
                f"model {self.name} must return (B, D) embeddings or (B, C, H, W) feature maps, got {shape}"
            )
        out = out.float()  # a no-op in float32; pools autocast outputs in float32
        if out.ndim == 4:
            out = out.mean(dim=(2, 3))
        return out

    def encode(self, batch) -> np.ndarray:
        import torch

        if not isinstance(batch, torch.Tensor):
            batch = torch.as_tensor(np.asarray(batch, dtype=np.float32))
        out = self._forward(batch.float())
        if self._dim is None:
            self._dim = int(out.shape[1])
        return out.detach().cpu().numpy().astype(np.float32, copy=False)


class TimmEncoder(TorchEncoder):
    """A timm model created with ``num_classes=0`` (see :func:`load_encoder`)."""

    backend = "timm"

    def __init__(self, module, *, name: str, preprocessing: Preprocessing, arch: dict[str, Any],
                 weights_file: Path | None = None, load_report: dict[str, Any] | None = None):
        super().__init__(module, name=name, preprocessing=preprocessing)
        self.arch = arch
        self.weights_file = weights_file
        self.load_report = load_report or {}
        self._dim = int(module.num_features)
        self._file_hash: str | None = None
        self._loaded_signature: tuple | None = None
        if weights_file is not None:
            # Hash the file as loaded, and remember the weights' identity: if
            # the module is later modified (fine-tuned in place), the file hash
            # no longer describes it and the state dict is hashed instead.
            try:
                self._file_hash = weights_sha256(weights_file)
            except OSError as exc:
                raise ModelError(f"cannot read weight file {weights_file}: {exc}") from None
            self._loaded_signature = _state_signature(module.state_dict())

    def _architecture(self) -> dict[str, Any]:
        return dict(self.arch)

    def _weights_fingerprint(self) -> str:
        return _loaded_or_state(self, None if self._file_hash is None else "file:" + self._file_hash)


class OnnxEncoder(Encoder):
    """An ONNX model run with onnxruntime; see :func:`load_encoder`.

    On the CPU by default; :meth:`to` with a CUDA device uses onnxruntime's
    ``CUDAExecutionProvider`` when the installed onnxruntime has it (the
    ``onnxruntime-gpu`` package), else it stays on the CPU and logs why.
    """

    backend = "onnx"

    def __init__(self, path: Path, output: str | None, *, name: str, options: dict[str, str]):
        import onnx
        import onnxruntime  # noqa: F401  (fail here, before parsing, when it is not installed)

        self.path = path
        self.name = name
        try:
            self._file_hash = weights_sha256(path)  # the bytes this session is built from
            model = onnx.load(str(path))
        except Exception as exc:  # noqa: BLE001 - any parse failure is a bad file
            raise ModelError(f"cannot load ONNX model {path}: {type(exc).__name__}: {exc}") from None
        graph = model.graph
        initializers = {init.name for init in graph.initializer}
        inputs = [i for i in graph.input if i.name not in initializers]
        if len(inputs) != 1:
            raise ModelError(
                f"ONNX model {path} has {len(inputs)} inputs ({', '.join(i.name for i in inputs)}); "
                "only single-input image models are supported"
            )
        self.input_name = inputs[0].name
        dims = [d.dim_value if d.HasField("dim_value") else None for d in inputs[0].type.tensor_type.shape.dim]
        if len(dims) != 4:
            raise ModelError(f"ONNX model {path} input {self.input_name!r} has shape {dims}; expected 4 dimensions")
        self.fixed_batch = dims[0]

        graph_outputs = [o.name for o in graph.output]
        if not output:
            output = graph_outputs[0]
        self.output = output
        if output not in graph_outputs:
            produced = {name for node in graph.node for name in node.output}
            if output not in produced:
                raise ModelError(
                    f"ONNX model {path} has no tensor named {output!r}; graph outputs: "
                    f"{', '.join(graph_outputs)}; pooled-feature candidates: "
                    f"{', '.join(_feature_candidates(graph)) or 'none found'}"
                )
            vi = onnx.ValueInfoProto()
            vi.name = output
            graph.output.append(vi)

        layout = options.get("layout")
        if layout is None:
            if dims[3] in (1, 3) and dims[1] not in (1, 3):
                layout = "nhwc"
            else:
                layout = "nchw"
        layout = layout.lower()
        if layout not in ("nchw", "nhwc"):
            raise ModelError(f"layout must be nchw or nhwc, got {layout!r} in {name}")
        self.layout = layout
        c_dim, h_dim, w_dim = (dims[1], dims[2], dims[3]) if layout == "nchw" else (dims[3], dims[1], dims[2])
        channels = c_dim if c_dim is not None else 3
        if channels not in (1, 3):
            raise ModelError(
                f"ONNX model {path} expects {channels} channels with layout {layout}; "
                "set layout=nchw or layout=nhwc to match its input"
            )
        size_opt = options.get("size")
        size = _parse_int(size_opt, "size", name) if size_opt is not None else None
        if h_dim is not None and w_dim is not None:
            if size is not None and (size, size) != (h_dim, w_dim):
                raise ModelError(
                    f"ONNX model {path} has a fixed input size {h_dim}x{w_dim}; size={size} cannot be used"
                )
            hw = (h_dim, w_dim)
        else:
            s = size if size is not None else 224
            hw = (h_dim or s, w_dim or s)

        mean = _parse_floats(options.get("mean"), "mean", name) if "mean" in options else (0.0,)
        std = _parse_floats(options.get("std"), "std", name) if "std" in options else (1.0,)
        if "scale" in options:
            scale = _parse_float(options["scale"], "scale", name)
        else:
            scale = 255.0 if max(mean + std) > 1.0 else 1.0
        bgr = _parse_bool(options.get("bgr", "0"), "bgr", name)
        for label, values in (("mean", mean), ("std", std)):
            if len(values) not in (1, channels):
                raise ModelError(f"{label} needs 1 or {channels} values in {name}, got {len(values)}")
        self.preprocessing = Preprocessing(
            input_size=(channels, *hw), mean=mean, std=std, interpolation="bilinear",
            channels=channels, bgr=bgr, scale=scale,
        )

        self._model_bytes = model.SerializeToString()
        self.providers = ["CPUExecutionProvider"]
        self.session = self._make_session()
        input_type = inputs[0].type.tensor_type.elem_type
        self._input_dtype = np.float16 if input_type == onnx.TensorProto.FLOAT16 else np.float32
        self._dim: int | None = None

    def _make_session(self):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.inter_op_num_threads = 1
        try:
            import torch

            so.intra_op_num_threads = max(1, torch.get_num_threads())
        except Exception:  # noqa: BLE001
            pass
        try:
            return ort.InferenceSession(self._model_bytes, so, providers=list(self.providers))
        except Exception as exc:  # noqa: BLE001
            raise ModelError(f"onnxruntime cannot run {self.path} (output {self.output!r}): {exc}") from None

    # An onnxruntime session does not pickle; the model bytes do, so a Dask
    # worker (crslib.cluster) rebuilds the same session from them.
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("session", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        # a worker without the GPU provider runs the same graph on its CPU
        available = _onnx_providers()
        wanted = state.get("providers", ["CPUExecutionProvider"])
        self.providers = [p for p in wanted if (p[0] if isinstance(p, tuple) else p) in available]
        if len(self.providers) == 1:
            self.device = "cpu"
        self.session = self._make_session()

    def to(self, device: str = "cpu", *, amp: bool = False) -> OnnxEncoder:
        """Run on ``device``: CUDA through onnxruntime's CUDA provider when it
        is installed, otherwise (and for MPS) on the CPU, logged. ``amp`` is
        ignored (the graph runs in its own precision), so :attr:`amp` stays
        False and the cache key does not change."""
        from crslib.device import resolve_device

        dev = resolve_device(device)
        wanted = ["CPUExecutionProvider"]
        if dev.startswith("cuda"):
            if "CUDAExecutionProvider" in _onnx_providers():
                index = int(dev.partition(":")[2] or 0)
                wanted = [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]
            else:
                log.warning("onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu); "
                            "running %s on the CPU", self.name)
        elif dev != "cpu":
            log.warning("onnxruntime has no provider for %s here; running %s on the CPU", dev, self.name)
        if amp:
            log.warning("amp does not apply to ONNX models; %s runs in its own precision", self.name)
        if wanted != self.providers:
            self.providers = wanted
            self.session = self._make_session()
        self.device = dev if len(wanted) > 1 else "cpu"
        return self

    def _architecture(self) -> dict[str, Any]:
        import onnxruntime

        return {"output": self.output, "layout": self.layout, "onnxruntime": onnxruntime.__version__}

    def _weights_fingerprint(self) -> str:
        return "file:" + self._file_hash

    @property
    def embedding_dim(self) -> int:
        if self._dim is None:
            c, h, w = self.preprocessing.input_size
            self._dim = int(self.encode(np.zeros((1, c, h, w), dtype=np.float32)).shape[1])
        return self._dim

    def _run(self, x: np.ndarray) -> np.ndarray:
        return self.session.run([self.output], {self.input_name: x})[0]

    def encode(self, batch) -> np.ndarray:
        x = batch.detach().cpu().numpy() if hasattr(batch, "detach") else np.asarray(batch)
        x = x.astype(self._input_dtype, copy=False)
        if self.layout == "nhwc":
            x = x.transpose(0, 2, 3, 1)
        x = np.ascontiguousarray(x)
        try:
            if self.fixed_batch and x.shape[0] != self.fixed_batch:
                step = self.fixed_batch
                parts = []
                for i in range(0, x.shape[0], step):
                    chunk = x[i:i + step]
                    n = chunk.shape[0]
                    if n < step:
                        chunk = np.concatenate([chunk, np.zeros((step - n, *chunk.shape[1:]), chunk.dtype)])
                    parts.append(self._run(chunk)[:n])
                out = np.concatenate(parts)
            else:
                out = self._run(x)
        except Exception as exc:  # noqa: BLE001
            raise ModelError(f"onnxruntime failed on {self.name}: {exc}") from None
        out = _pool_output(np.asarray(out, dtype=np.float32))
        if self._dim is None:
            self._dim = int(out.shape[1])
        return np.ascontiguousarray(out, dtype=np.float32)


def _onnx_providers() -> list[str]:
    import onnxruntime as ort

    return list(ort.get_available_providers())


def _feature_candidates(graph, limit: int = 10) -> list[str]:
    kinds = ("GlobalAveragePool", "ReduceMean", "Flatten", "AveragePool", "Gemm", "MatMul")
    found = [node.output[0] for node in graph.node if node.op_type in kinds and node.output]
    return found[-limit:]

