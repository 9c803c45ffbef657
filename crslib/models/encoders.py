"""Image encoders behind one interface, selected by a model spec string.

Every encoder turns a float image in ``[0, 1]`` of shape ``(H, W, C)`` into a
fixed-length embedding. It carries its preprocessing (input size, mean, std,
interpolation, channels) and a :meth:`Encoder.fingerprint` that changes when
the weights, the architecture or the preprocessing change, so the embedding
cache (:mod:`crslib.embed`) is keyed by content, never by a name alone.

Model spec strings
------------------
A notebook parameter or the ``--model`` flag of ``crs`` names an encoder with
one string::

    timm:NAME[?OPTIONS]
    onnx:PATH[#OUTPUT][?OPTIONS]
    zoo:NAME[@KEY]

``OPTIONS`` are ``key=value`` pairs joined by ``&``; list values are comma
separated (``mean=104,117,123``). Paths may be relative (to the working
directory) and may start with ``~``; ``%XX`` escapes are decoded, so a path
containing ``&`` or ``#`` can be written with ``%26`` / ``%23``.

``timm:NAME``
    A timm architecture (``timm.list_models()``), optionally with a pretrained
    tag (``resnet18.a1_in1k``), created with ``num_classes=0`` so that it
    returns pooled features; the embedding dimension is ``model.num_features``.
    Preprocessing comes from the model's own data config
    (``timm.data.resolve_model_data_config``). Options:

    ``seed=INT``
        Random initialisation (the default, without ``weights`` or
        ``pretrained``) is seeded with this value (default 0): the same spec
        always gives the same weights.
    ``weights=PATH``
        Load weights from a local ``.pth``, ``.pt``, ``.bin`` or
        ``.safetensors`` file (a plain state dict, or a checkpoint holding one
        under ``state_dict``/``model``/``state_dict_ema``). Classifier-head
        keys are dropped; any other parameter the model has and the file lacks
        is an error.
    ``pretrained=hf``
        The model's published weights from the *local* Hugging Face cache
        (``$HF_HUB_CACHE``, default ``~/.cache/huggingface/hub``). Nothing is
        downloaded: when the weights are not in the cache the spec fails at
        once and says how to put them there.
    ``size=INT``
        Square input size in pixels, overriding the data config.
    ``in_chans=INT``
        Number of input channels (1 for grayscale stems), default 3.

    Examples: ``timm:resnet18``, ``timm:resnet18?seed=1&size=64``,
    ``timm:resnet50?weights=~/models/rad_resnet50.safetensors``,
    ``timm:convnext_tiny.fb_in22k?pretrained=hf``.

``onnx:PATH#OUTPUT``
    An ONNX model run by onnxruntime on the CPU. ``OUTPUT`` names the tensor
    to read the embedding from (default: the first graph output); it may be an
    intermediate tensor such as ``/ReduceMean_output_0``, which is then added
    to the graph outputs in memory. An output of shape ``(B, C, H, W)`` is
    global-average pooled, ``(B, N, D)`` is averaged over ``N``; anything else
    is flattened to ``(B, D)``. Options:

    ``size=INT``
        Square input size; needed only when the model's input shape is
        dynamic (a fixed input shape is used as is). Default 224.
    ``layout=nchw|nhwc``
        Input layout; by default read from the input shape (channel axis of
        length 1 or 3), else ``nchw``.
    ``bgr=1``
        Feed channels in BGR order (``mean``/``std`` are then given in BGR
        order too).
    ``scale=FLOAT``
        Multiply the ``[0, 1]`` image by this before normalising (``255`` for
        models trained on 0-255 pixel values).
    ``mean=A,B,C`` / ``std=A,B,C``
        Normalisation ``(x * scale - mean) / std``, in the units of the
        scaled image. When ``scale`` is not given and a mean or std value
        exceeds 1, the values are read as 0-255 units (``scale=255``). The
        default is no normalisation (mean 0, std 1). One value applies to
        every channel.

    Example (Yahoo Open-NSFW, ResNet-50-thin, pooled features)::

        onnx:/path/open_nsfw.onnx#/ReduceMean_output_0?bgr=1&mean=104,117,123&layout=nhwc

``zoo:NAME[@KEY]``
    A small encoder trained by :mod:`crslib.zoo` (``crs zoo``), loaded with
    :func:`crslib.zoo.load_zoo_encoder`, e.g.
    ``zoo:contrastive-cnn_small-seed0``.

Plain torch modules have no spec string: wrap them with
:class:`TorchEncoder`, e.g.
``TorchEncoder(model, name="zoo:simclr-seed0", preprocessing=Preprocessing(...))``.

Examples
--------
>>> import crslib
>>> from crslib.encoders import load_encoder
>>> enc = load_encoder("timm:resnet18?size=64")
>>> enc.embedding_dim
512
>>> import numpy as np
>>> x = enc.preprocess(np.zeros((32, 32, 1), dtype=np.float32))
>>> tuple(x.shape)
(3, 64, 64)
>>> enc.encode(x[None]).shape
(1, 512)
"""

from __future__ import annotations

import abc
import hashlib
import logging
import math
import os
import re
import threading
import time
import weakref
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import numpy as np

import crslib  # noqa: F401  (applies the torchvision import fix before torch/timm)
from crslib._io import digest_of, file_sha256
from crslib.errors import ModelError

log = logging.getLogger(__name__)

__all__ = [
    "Encoder",
    "OnnxEncoder",
    "Preprocessing",
    "TimmEncoder",
    "TorchEncoder",
    "load_encoder",
    "parse_spec",
    "weights_sha256",
]

SPEC_FORMS = (
    "timm:NAME[?seed=INT&size=INT&in_chans=INT]",
    "timm:NAME?weights=PATH(.pth|.pt|.bin|.safetensors)[&size=INT]",
    "timm:NAME?pretrained=hf[&size=INT]",
    "onnx:PATH[#OUTPUT][?size=INT&mean=A,B,C&std=A,B,C&bgr=1&layout=nchw|nhwc&scale=255]",
    "zoo:NAME[@KEY]",
    "public:efficientnet_lite0|open_nsfw[?size=INT]",
)
_TIMM_OPTIONS = ("seed", "weights", "pretrained", "size", "in_chans")
_ONNX_OPTIONS = ("size", "mean", "std", "bgr", "layout", "scale")
_WEIGHT_SUFFIXES = (".pth", ".pt", ".bin", ".safetensors")
_INTERPOLATIONS = ("bilinear", "bicubic", "nearest", "area")


def _forms() -> str:
    return "accepted forms: " + "; ".join(SPEC_FORMS)


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


# --------------------------------------------------------------------------- interface


class Encoder(abc.ABC):
    """An image encoder: preprocessing, a forward pass, and a fingerprint.

    Attributes
    ----------
    name : str
        Canonical spec string (or the name a :class:`TorchEncoder` was given).
    embedding_dim : int
        Length ``D`` of one embedding.
    preprocessing : Preprocessing
        How :meth:`preprocess` turns an image into model input.
    """

    name: str
    preprocessing: Preprocessing
    backend: str = "abstract"

    @property
    @abc.abstractmethod
    def embedding_dim(self) -> int:
        """Length of one embedding."""

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

        was_training = self.module.training
        self.module.eval()
        try:
            with torch.inference_mode():
                out = self.module(batch)
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
        if self._file_hash is not None and _state_signature(self.module.state_dict()) == self._loaded_signature:
            return "file:" + self._file_hash
        return "state_dict:" + _state_dict_sha256(self.module)


class OnnxEncoder(Encoder):
    """An ONNX model run with onnxruntime (CPU); see :func:`load_encoder`."""

    backend = "onnx"

    def __init__(self, path: Path, output: str | None, *, name: str, options: dict[str, str]):
        import onnx
        import onnxruntime as ort

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
            return ort.InferenceSession(self._model_bytes, so, providers=["CPUExecutionProvider"])
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
        self.session = self._make_session()

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


def _feature_candidates(graph, limit: int = 10) -> list[str]:
    kinds = ("GlobalAveragePool", "ReduceMean", "Flatten", "AveragePool", "Gemm", "MatMul")
    found = [node.output[0] for node in graph.node if node.op_type in kinds and node.output]
    return found[-limit:]


# --------------------------------------------------------------------------- spec parsing


def _parse_int(value: str, key: str, spec: str) -> int:
    try:
        number = int(str(value))
    except ValueError:
        raise ModelError(f"option {key}={value!r} in {spec!r} must be an integer") from None
    if number < (0 if key == "seed" else 1):
        raise ModelError(f"option {key}={value!r} in {spec!r} is out of range")
    return number


def _parse_float(value: str, key: str, spec: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise ModelError(f"option {key}={value!r} in {spec!r} must be a number") from None
    if not math.isfinite(number) or number <= 0:
        raise ModelError(f"option {key}={value!r} in {spec!r} must be a positive number")
    return number


def _parse_floats(value: str, key: str, spec: str) -> tuple[float, ...]:
    parts = [p for p in re.split(r"[,;\s]+", str(value).strip()) if p]
    try:
        numbers = tuple(float(p) for p in parts)
    except ValueError:
        raise ModelError(f"option {key}={value!r} in {spec!r} must be a comma-separated list of numbers") from None
    if not numbers or not all(math.isfinite(v) for v in numbers):
        raise ModelError(f"option {key}={value!r} in {spec!r} must be a comma-separated list of numbers")
    return numbers


def _parse_bool(value: str, key: str, spec: str) -> bool:
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ModelError(f"option {key}={value!r} in {spec!r} must be 0 or 1")


def _parse_options(text: str, allowed: tuple[str, ...], spec: str) -> dict[str, str]:
    options: dict[str, str] = {}
    for part in text.split("&"):
        if not part:
            continue
        if "=" not in part:
            raise ModelError(f"option {part!r} in model spec {spec!r} must be key=value; {_forms()}")
        key, value = part.split("=", 1)
        key = key.strip().lower()
        if key not in allowed:
            raise ModelError(
                f"unknown option {key!r} in model spec {spec!r}; options: {', '.join(allowed)}; {_forms()}"
            )
        if key in options:
            raise ModelError(f"option {key!r} given twice in model spec {spec!r}")
        options[key] = unquote(value.strip())
    return options


@dataclass(frozen=True)
class ParsedSpec:
    """A model spec split into its parts (see :func:`parse_spec`)."""

    backend: str
    target: str
    output: str | None = None
    options: dict[str, str] = field(default_factory=dict)


def parse_spec(spec: str) -> ParsedSpec:
    """Split a model spec string into backend, target, output and options.

    Raises
    ------
    ModelError
        When the string is not one of the accepted forms.

    Examples
    --------
    >>> parse_spec("timm:resnet18?size=64").options
    {'size': '64'}
    >>> parse_spec("onnx:m.onnx#feat?bgr=1").output
    'feat'
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ModelError(f"model spec must be a non-empty string, got {spec!r}; {_forms()}")
    text = spec.strip()
    if ":" not in text:
        raise ModelError(f"model spec {spec!r} lacks a backend prefix (timm:, onnx: or zoo:); {_forms()}")
    backend, rest = text.split(":", 1)
    backend = backend.strip().lower()
    if backend == "zoo":
        name = rest.strip()
        if not name:
            raise ModelError(f"model spec {spec!r} has no zoo model name; {_forms()}")
        return ParsedSpec("zoo", name)
    if backend == "public":
        name = rest.strip()
        if not name:
            raise ModelError(f"model spec {spec!r} has no public encoder name; {_forms()}")
        return ParsedSpec("public", name)
    if backend == "torch":
        raise ModelError(
            f"model spec {spec!r}: torch modules have no spec string; wrap the module with "
            "crslib.encoders.TorchEncoder(module, name=..., preprocessing=...)"
        )
    if backend == "timm":
        name, _, opt_text = rest.partition("?")
        name = name.strip()
        if not name or "#" in name or not re.fullmatch(r"[A-Za-z0-9_.\-]+", name):
            raise ModelError(f"model spec {spec!r} has no valid timm model name; {_forms()}")
        return ParsedSpec("timm", name, None, _parse_options(opt_text, _TIMM_OPTIONS, spec))
    if backend == "onnx":
        output = None
        if "#" in rest:
            path_part, frag = rest.split("#", 1)
            if "?" in frag:
                output, opt_text = frag.split("?", 1)
            else:
                output, opt_text = frag, ""
                if "?" in path_part:
                    path_part, opt_text = path_part.split("?", 1)
            output = unquote(output.strip()) or None
        else:
            path_part, _, opt_text = rest.partition("?")
        path_part = unquote(path_part.strip())
        if not path_part:
            raise ModelError(f"model spec {spec!r} has no ONNX file path; {_forms()}")
        return ParsedSpec("onnx", path_part, output, _parse_options(opt_text, _ONNX_OPTIONS, spec))
    raise ModelError(f"unknown backend {backend!r} in model spec {spec!r}; {_forms()}")


def _canonical(parsed: ParsedSpec, options: dict[str, Any]) -> str:
    opts = "&".join(f"{k}={options[k]}" for k in sorted(options))
    base = f"{parsed.backend}:{parsed.target}"
    if parsed.output:
        base += f"#{parsed.output}"
    return base + (f"?{opts}" if opts else "")


def _resolve_file(text: str, what: str, spec: str) -> Path:
    path = Path(os.path.expanduser(text))
    if not path.is_absolute():
        path = Path.cwd() / path
    path = Path(os.path.normpath(path))
    if not path.is_file():
        raise ModelError(
            f"{what} {path} does not exist (from model spec {spec!r}); check the path or copy the file there"
        )
    return path


# --------------------------------------------------------------------------- loading


def load_encoder(spec: str) -> Encoder:
    """Create the encoder a model spec string names.

    Parameters
    ----------
    spec : str
        ``timm:NAME[?OPTIONS]`` or ``onnx:PATH[#OUTPUT][?OPTIONS]``; see the
        module docstring for the options.

    Returns
    -------
    Encoder

    Raises
    ------
    ModelError
        Malformed spec, unknown model, missing or unreadable weights, weights
        not in the local Hugging Face cache.

    Examples
    --------
    >>> import crslib
    >>> load_encoder("timm:resnet18?size=64").name
    'timm:resnet18?seed=0&size=64'
    """
    parsed = parse_spec(spec)
    if parsed.backend == "timm":
        return _load_timm(parsed, spec)
    if parsed.backend == "zoo":
        from crslib.zoo import load_zoo_encoder

        return load_zoo_encoder(parsed.target)
    if parsed.backend == "public":
        from crslib.zoo import load_public_encoder

        return load_public_encoder(parsed.target)
    return _load_onnx(parsed, spec)


def random_init_spec(spec: str) -> str | None:
    """The spec of a randomly initialised network of the same architecture.

    The floor a trained encoder's agreement should clear (CRS-Bench compares
    every model with a random network). ``timm`` specs keep the architecture,
    input size and channels and drop the weights; ``public:efficientnet_lite0``
    maps to its timm architecture; ``zoo`` models to the zoo's untrained model
    of the same architecture. ONNX files carry no separable architecture, so
    they have no reference (``None``).

    Examples
    --------
    >>> random_init_spec("timm:resnet18?weights=/w/r18.pth&size=64")
    'timm:resnet18?seed=0&size=64'
    """
    parsed = parse_spec(spec)
    if parsed.backend == "timm":
        keep = {k: v for k, v in parsed.options.items() if k in ("size", "in_chans")}
        keep["seed"] = "0"
        return _canonical(ParsedSpec("timm", parsed.target), keep)
    if parsed.backend == "public":
        name, _, query = parsed.target.partition("?")
        if name == "efficientnet_lite0":
            return "timm:tf_efficientnet_lite0" + ("?" + query + "&seed=0" if query else "?seed=0")
        return None
    if parsed.backend == "zoo":
        # Zoo names follow "{objective}-{architecture}-seed{seed}" (crslib.zoo.ZooModelSpec.make).
        match = re.fullmatch(r"[a-z_]+-(?P<arch>[a-z0-9_]+)-seed\d+(@\w+)?", parsed.target)
        return f"zoo:random_init-{match['arch']}-seed0" if match else None
    return None


def _load_onnx(parsed: ParsedSpec, spec: str) -> OnnxEncoder:
    path = _resolve_file(parsed.target, "ONNX model file", spec)
    options = dict(parsed.options)
    canonical = _canonical(ParsedSpec("onnx", str(path), parsed.output, {}), options)
    return OnnxEncoder(path, parsed.output, name=canonical, options=options)


def _load_timm(parsed: ParsedSpec, spec: str) -> TimmEncoder:
    import timm
    import torch

    name = parsed.target
    opts = parsed.options
    if not timm.is_model(name):
        import difflib

        close = difflib.get_close_matches(name.split(".")[0], timm.list_models(), n=3, cutoff=0.75)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ModelError(f"no timm model named {name!r} (in model spec {spec!r}); see timm.list_models(){hint}")
    if "weights" in opts and "pretrained" in opts:
        raise ModelError(f"model spec {spec!r} gives both weights= and pretrained=; use one")
    seed = _parse_int(opts.get("seed", "0"), "seed", spec)
    size = _parse_int(opts["size"], "size", spec) if "size" in opts else None
    in_chans = _parse_int(opts["in_chans"], "in_chans", spec) if "in_chans" in opts else 3
    if in_chans not in (1, 3):
        raise ModelError(f"in_chans={in_chans} in {spec!r}: only 1 or 3 channels are supported")

    weights_file: Path | None = None
    canon: dict[str, Any] = {}
    if "weights" in opts:
        weights_file = _resolve_file(opts["weights"], "weight file", spec)
        if not weights_file.name.lower().endswith(_WEIGHT_SUFFIXES):
            raise ModelError(
                f"weight file {weights_file} must end in one of {', '.join(_WEIGHT_SUFFIXES)}"
            )
        canon["weights"] = str(weights_file)
    elif "pretrained" in opts:
        source = opts["pretrained"].lower()
        if source != "hf":
            raise ModelError(f"pretrained={opts['pretrained']!r} in {spec!r}: only pretrained=hf is supported")
        weights_file = _hf_cached_weights(name, spec)
        canon["pretrained"] = "hf"
    else:
        canon["seed"] = seed
    if size is not None:
        canon["size"] = size
    if in_chans != 3:
        canon["in_chans"] = in_chans

    kwargs: dict[str, Any] = {"num_classes": 0}
    if in_chans != 3:
        kwargs["in_chans"] = in_chans
    t0 = time.perf_counter()
    with torch.random.fork_rng(devices=[]):  # leave the caller's RNG state alone
        torch.manual_seed(seed)
        model = _create_timm(name, kwargs, size, spec)
    report: dict[str, Any] = {}
    if weights_file is not None:
        model, report = _load_weights(model, name, kwargs, size, weights_file, spec)
    model.eval()
    log.debug("created timm model %s in %.2f s", name, time.perf_counter() - t0)

    cfg = timm.data.resolve_model_data_config(model)
    _, h, w = cfg["input_size"]
    if size is not None:
        h = w = size
    mean, std = tuple(cfg["mean"]), tuple(cfg["std"])
    if in_chans == 1 and len(mean) == 3:
        mean, std = (float(np.mean(mean)),), (float(np.mean(std)),)
    pre = Preprocessing(
        input_size=(in_chans, h, w), mean=mean, std=std,
        interpolation=_timm_interpolation(cfg.get("interpolation")), channels=in_chans,
    )
    arch = {"model": name, "num_classes": 0, "in_chans": in_chans, "img_size": getattr(model, "_crs_img_size", None),
            "timm": timm.__version__}
    return TimmEncoder(
        model, name=_canonical(ParsedSpec("timm", name), canon), preprocessing=pre, arch=arch,
        weights_file=weights_file, load_report=report,
    )


def _build_timm(name: str, kwargs: dict[str, Any], size: int | None, **extra):
    """Create a timm model; models with a fixed input size (ViTs) are built
    for ``size`` when one is given. timm's own exceptions pass through."""
    import timm

    if size is not None:
        try:
            model = timm.create_model(name, img_size=size, **kwargs, **extra)
            model._crs_img_size = size
            return model
        except TypeError:
            pass  # the architecture takes any input size
    return timm.create_model(name, **kwargs, **extra)


def _create_timm(name: str, kwargs: dict[str, Any], size: int | None, spec: str, **extra):
    """:func:`_build_timm` with timm's errors turned into a ModelError naming the spec."""
    try:
        return _build_timm(name, kwargs, size, **extra)
    except (RuntimeError, ValueError, KeyError, TypeError, AssertionError) as exc:
        raise ModelError(f"cannot create timm model {name!r} from {spec!r}: {exc}") from None


def _hf_cached_weights(name: str, spec: str) -> Path:
    """Path of the model's weights in the local Hugging Face cache, found
    without any network access."""
    from huggingface_hub import constants, try_to_load_from_cache
    from timm.models import get_pretrained_cfg

    cfg = get_pretrained_cfg(name)
    repo = getattr(cfg, "hf_hub_id", None) if cfg is not None else None
    if not repo:
        raise ModelError(
            f"timm model {name!r} has no Hugging Face weights; download weights yourself and use "
            f"timm:{name}?weights=PATH"
        )
    cache = os.environ.get("HF_HUB_CACHE") or (
        os.path.join(os.environ["HF_HOME"], "hub") if os.environ.get("HF_HOME") else constants.HF_HUB_CACHE
    )
    filenames = [cfg.hf_hub_filename] if getattr(cfg, "hf_hub_filename", None) else [
        "model.safetensors", "pytorch_model.bin",
    ]
    for filename in filenames:
        found = try_to_load_from_cache(repo, filename, cache_dir=cache)
        if isinstance(found, str) and os.path.isfile(found):
            return Path(found)
    raise ModelError(
        f"weights of timm model {name!r} (Hugging Face repo {repo}) are not in the local HF cache {cache}; "
        f"on a machine with network run: hf download {repo} {filenames[0]} "
        f"(set HF_HUB_CACHE to choose the cache folder), or use timm:{name}?weights=PATH with a local file"
    )


def _read_state_dict(path: Path, spec: str) -> dict[str, Any]:
    import torch
    from timm.models import load_state_dict

    try:
        state = load_state_dict(str(path), use_ema=True, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure means the file is unusable
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(
            f"cannot read weight file {path} ({type(exc).__name__}: {reason[:300]}); "
            "it must be a torch state dict (.pth/.pt/.bin) or a .safetensors file"
        ) from None
    if not isinstance(state, dict) or not any(isinstance(v, torch.Tensor) for v in state.values()):
        raise ModelError(f"weight file {path} holds no state dict of tensors (got {type(state).__name__})")
    return state


def _head_keys(model) -> set[str]:
    heads = model.pretrained_cfg.get("classifier") if getattr(model, "pretrained_cfg", None) else None
    if heads is None:
        return set()
    if isinstance(heads, str):
        heads = (heads,)
    return {f"{h}.{suffix}" for h in heads for suffix in ("weight", "bias")}


def _load_weights(model, name: str, kwargs: dict[str, Any], size: int | None, path: Path, spec: str):
    """Load a local weight file into ``model``; report missing and unexpected
    keys, and fail when the model would keep randomly initialised parameters."""
    state = _read_state_dict(path, spec)
    own = model.state_dict()
    heads = _head_keys(model)
    dropped = sorted(k for k in state if k in heads and k not in own)
    candidate = {k: v for k, v in state.items() if k not in dropped}
    fits = all(k in candidate and tuple(candidate[k].shape) == tuple(own[k].shape) for k in own)
    if fits:
        unexpected = sorted(set(candidate) - set(own))
        model.load_state_dict({k: candidate[k] for k in own}, strict=True)
        missing: list[str] = []
    else:
        # Foreign key names or shapes (e.g. original DINO/ViT checkpoints, a
        # different size): let timm's own checkpoint filter convert them.
        model, missing, unexpected = _load_via_timm(name, kwargs, size, path, spec)
    if missing:
        head = ", ".join(missing[:5])
        sample = ", ".join(list(state)[:3])
        raise ModelError(
            f"weight file {path} does not fit timm model {name!r}: {len(missing)} of its parameters are "
            f"missing from the file (e.g. {head}); the file's keys look like {sample}. "
            "Check that the file belongs to this architecture"
        )
    if unexpected:
        log.warning(
            "weight file %s has %d keys timm model %s does not use (ignored): %s%s",
            path, len(unexpected), name, ", ".join(unexpected[:5]), " ..." if len(unexpected) > 5 else "",
        )
    return model, {"dropped_head_keys": dropped, "unexpected_keys": unexpected, "missing_keys": missing}


class _Capture(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _load_via_timm(name: str, kwargs: dict[str, Any], size: int | None, path: Path, spec: str):
    import torch

    logger = logging.getLogger("timm.models._builder")
    handler = _Capture()
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = _build_timm(name, kwargs, size, pretrained=True,
                                pretrained_cfg_overlay={"file": str(path)})
    except ModelError:
        raise
    except Exception as exc:  # noqa: BLE001
        lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
        detail = [ln for ln in lines if ln.startswith(("size mismatch", "Missing key", "Unexpected key"))]
        reason = "; ".join((detail or lines or [type(exc).__name__])[:2])
        raise ModelError(
            f"weight file {path} does not fit timm model {name!r}: {reason[:400]}. "
            "Check that the file belongs to this architecture"
        ) from None
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    missing: list[str] = []
    unexpected: list[str] = []
    for message in handler.messages:
        m = re.match(r"Missing keys \((.*)\) discovered", message)
        if m:
            missing = [k.strip() for k in m.group(1).split(",") if k.strip()]
        m = re.match(r"Unexpected keys \((.*)\) found", message)
        if m:
            unexpected = [k.strip() for k in m.group(1).split(",") if k.strip()]
    return model, missing, unexpected
