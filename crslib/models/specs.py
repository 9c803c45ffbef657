"""Model spec strings: parsing them and creating the encoder they name.

This module is the only place that reads a model spec string and dispatches
it to a backend (:mod:`crslib.models.encoders`): :func:`parse_spec`,
:func:`load_encoder`, :func:`random_init_spec`, :data:`SPEC_FORMS`.
Backends never call back into it: ``public:`` names resolve to a ``timm:`` or
``onnx:`` spec in :mod:`crslib.models.public`, ``zoo:`` names to a checkpoint
in :mod:`crslib.models.zoo`.

Model spec strings
------------------
A notebook parameter or the ``--model`` flag of ``crs`` names an encoder with
one string::

    timm:NAME[?OPTIONS]
    onnx:PATH[#OUTPUT][?OPTIONS]
    zoo:NAME[@KEY]
    public:NAME[?size=INT]

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
    A small encoder trained by :mod:`crslib.models.zoo` (``crs zoo``), loaded
    with :func:`crslib.models.zoo.load_zoo_encoder`, e.g.
    ``zoo:contrastive-cnn_small-seed0``.

``public:NAME[?size=INT]``
    A public pretrained reference that works offline
    (:data:`crslib.models.public.PUBLIC_ENCODERS`), loaded with
    :func:`load_public_encoder`: ``public:efficientnet_lite0``,
    ``public:open_nsfw?size=64``.

``hf:MODEL_ID_OR_FOLDER[?pooling=cls|mean|pooler|image&size=INT&init=random&seed=INT]``
    A Hugging Face ``transformers`` vision model from a ``save_pretrained``
    folder or a repo id in the local HF cache (never downloaded), e.g.
    ``hf:facebook/dinov2-base``. ``open_clip:ARCH[?weights=PATH|pretrained=TAG]``
    (``ARCH`` may be ``hf-hub:ORG/REPO`` or ``local-dir:FOLDER``): the image
    tower of an OpenCLIP model. Both are loaded by
    :mod:`crslib.models.ecosystem`, which documents the options and the
    default pooling.

Plain torch modules have no spec string: wrap them with
:class:`~crslib.models.encoders.TorchEncoder`, e.g.
``TorchEncoder(model, name="zoo:simclr-seed0", preprocessing=Preprocessing(...))``.

Examples
--------
>>> import crslib
>>> from crslib.models import load_encoder
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

import logging
import numbers
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import numpy as np

import crslib  # noqa: F401  (applies the torchvision import fix before torch/timm)
from crslib.errors import ModelError
from crslib.models._options import _parse_int
from crslib.models.encoders import Encoder, OnnxEncoder, Preprocessing, TimmEncoder, _timm_interpolation
from crslib.models.public import public_spec
from crslib.models.timm_weights import _create_timm, _hf_cached_weights, _load_weights

log = logging.getLogger(__name__)

__all__ = [
    "SPEC_FORMS",
    "ParsedSpec",
    "load_encoder",
    "load_public_encoder",
    "is_random_init",
    "parse_spec",
    "random_init_spec",
    "with_image_size",
]

SPEC_FORMS = (
    "timm:NAME[?seed=INT&size=INT&in_chans=INT]",
    "timm:NAME?weights=PATH(.pth|.pt|.bin|.safetensors)[&size=INT]",
    "timm:NAME?pretrained=hf[&size=INT]",
    "onnx:PATH[#OUTPUT][?size=INT&mean=A,B,C&std=A,B,C&bgr=1&layout=nchw|nhwc&scale=255]",
    "zoo:NAME[@KEY]",
    "public:efficientnet_lite0|open_nsfw[?size=INT]",
    "hf:MODEL_ID_OR_FOLDER[?pooling=cls|mean|pooler|image&size=INT&init=random&seed=INT]",
    "open_clip:ARCH|hf-hub:ORG/REPO|local-dir:FOLDER[?weights=PATH|pretrained=TAG&size=INT&init=random&seed=INT]",
)
_TIMM_OPTIONS = ("seed", "weights", "pretrained", "size", "in_chans")
_ONNX_OPTIONS = ("size", "mean", "std", "bgr", "layout", "scale")
_HF_OPTIONS = ("pooling", "size", "init", "seed")
_OPEN_CLIP_OPTIONS = ("weights", "pretrained", "size", "init", "seed")
_WEIGHT_SUFFIXES = (".pth", ".pt", ".bin", ".safetensors")


def _forms() -> str:
    return "accepted forms: " + "; ".join(SPEC_FORMS)


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
            "crslib.models.TorchEncoder(module, name=..., preprocessing=...)"
        )
    if backend == "timm":
        name, _, opt_text = rest.partition("?")
        name = name.strip()
        if not name or "#" in name or not re.fullmatch(r"[A-Za-z0-9_.\-]+", name):
            raise ModelError(f"model spec {spec!r} has no valid timm model name; {_forms()}")
        return ParsedSpec("timm", name, None, _parse_options(opt_text, _TIMM_OPTIONS, spec))
    if backend in ("hf", "open_clip"):
        target, _, opt_text = rest.partition("?")
        target = unquote(target.strip())
        if not target or target in ("hf-hub:", "local-dir:"):
            raise ModelError(f"model spec {spec!r} names no model; {_forms()}")
        allowed = _HF_OPTIONS if backend == "hf" else _OPEN_CLIP_OPTIONS
        return ParsedSpec(backend, target, None, _parse_options(opt_text, allowed, spec))
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
        from crslib.models.zoo import load_zoo_encoder  # pandas and the zoo only when needed

        return load_zoo_encoder(parsed.target)
    if parsed.backend == "public":
        return load_public_encoder(parsed.target)
    if parsed.backend == "hf":
        from crslib.models.ecosystem import load_hf_encoder  # transformers only when needed

        return load_hf_encoder(parsed.target, parsed.options, spec=spec)
    if parsed.backend == "open_clip":
        from crslib.models.ecosystem import load_open_clip_encoder  # open_clip only when needed

        return load_open_clip_encoder(parsed.target, parsed.options, spec=spec)
    return _load_onnx(parsed, spec)


def with_image_size(spec: str, size: int) -> str:
    """A ``public:`` spec without options, set to run at ``size`` pixels; any other spec as it is.

    The public encoders were trained at 224 px; on small images (the 64 px
    phantom) the book runs them at the data's size. A spec that already has
    options, or that is not ``public:``, is the user's choice and is kept.

    Examples
    --------
    >>> with_image_size("public:open_nsfw", 64)
    'public:open_nsfw?size=64'
    >>> with_image_size("public:open_nsfw?size=128", 64), with_image_size("zoo:dino-cnn_small-seed0", 64)
    ('public:open_nsfw?size=128', 'zoo:dino-cnn_small-seed0')
    """
    if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 1:
        raise ModelError(f"size must be a positive number of pixels, got {size!r}")
    return f"{spec}?size={int(size)}" if spec.startswith("public:") and "?" not in spec else spec


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
    >>> random_init_spec("zoo:contrastive-effnet_lite0-seed0-imagenet")
    'zoo:random_init-effnet_lite0-seed0'
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
        # Zoo names follow "{objective}-{architecture}-seed{seed}", then the factor variants' suffixes
        # such as "-imagenet", "-half0" or "-long" (crslib.models.zoo_presets.ZooModelSpec.make).
        match = re.fullmatch(r"[a-z_]+-(?P<arch>[a-z0-9_]+)-seed\d+(-[a-z0-9]+)*(@\w+)?", parsed.target)
        return f"zoo:random_init-{match['arch']}-seed0" if match else None
    if parsed.backend in ("hf", "open_clip"):
        keep = {k: v for k, v in parsed.options.items() if k in ("size", "pooling")}
        named_arch = parsed.backend == "open_clip" and not parsed.target.startswith(("hf-hub:", "local-dir:"))
        keep.update({"seed": "0"} if named_arch else {"init": "random", "seed": "0"})
        return _canonical(ParsedSpec(parsed.backend, parsed.target), keep)
    return None


def is_random_init(spec: str) -> bool:
    """Whether a spec names a randomly initialised network (no trained weights).

    A ``timm`` spec without ``weights=`` or ``pretrained=`` is a seeded
    random network, and so is a zoo ``random_init`` model: either serves as
    the random floor of an agreement study itself. Public and ONNX models
    carry trained weights.

    Examples
    --------
    >>> is_random_init("timm:resnet18?size=64"), is_random_init("timm:resnet18?weights=/w/r18.pth")
    (True, False)
    >>> is_random_init("zoo:random_init-cnn_small-seed1"), is_random_init("public:efficientnet_lite0")
    (True, False)
    """
    parsed = parse_spec(spec)
    if parsed.backend == "timm":
        return not {"weights", "pretrained"} & set(parsed.options)
    if parsed.backend == "zoo":
        return parsed.target.startswith("random_init-")
    if parsed.backend in ("hf", "open_clip"):
        named_arch = parsed.backend == "open_clip" and not parsed.target.startswith(("hf-hub:", "local-dir:"))
        return parsed.options.get("init", "").lower() == "random" or (
            named_arch and not {"weights", "pretrained"} & set(parsed.options))
    return False


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



def load_public_encoder(name: str, *, size: int | None = None, cache_root: str | os.PathLike | None = None) -> Encoder:
    """A public pretrained reference encoder that works offline.

    Parameters
    ----------
    name : str
        One of :data:`~crslib.models.public.PUBLIC_ENCODERS`:
        ``"efficientnet_lite0"`` or ``"open_nsfw"``, optionally prefixed
        ``public:`` and followed by ``?size=INT`` (``public:open_nsfw?size=64``).
    size : int, optional
        Square input size (default 224, the size both were trained at).
    cache_root : path, optional
        Where converted weight files go; default ``<crslib cache>/zoo``.

    Returns
    -------
    Encoder
        ``efficientnet_lite0``: ``load_encoder("timm:tf_efficientnet_lite0?weights=<converted>")``
        (1280-d); ``open_nsfw``: ``load_encoder("onnx:<file>#/ReduceMean_output_0?bgr=1&mean=104,117,123&scale=255&layout=nhwc")``
        (1024-d). Both repeat grayscale images to three channels. The spec
        string comes from :func:`crslib.models.public.public_spec`.

    Examples
    --------
    >>> enc = load_public_encoder("open_nsfw", size=64)  # doctest: +SKIP
    >>> enc.embedding_dim  # doctest: +SKIP
    1024
    """
    return load_encoder(public_spec(name, size=size, cache_root=cache_root))
