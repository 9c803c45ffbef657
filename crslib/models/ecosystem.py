"""Encoders from the ecosystem: Hugging Face ``transformers`` and OpenCLIP.

Two spec forms (parsed in :mod:`crslib.models.specs`) load here, always
offline: weights come from a local folder or file, or from the *local*
Hugging Face cache (``$HF_HUB_CACHE``, default ``~/.cache/huggingface/hub``);
nothing is ever downloaded.

``hf:MODEL_ID_OR_FOLDER[?pooling=cls|mean|pooler|image&size=PX&init=random&seed=INT]``
    A ``transformers`` vision model (``AutoModel``) with its image processor
    (``AutoImageProcessor``) from a folder written by ``save_pretrained`` or a
    repo id whose files are in the local cache. Tested with ViT, DINOv2 (also
    RAD-DINO's architecture), CLIP and SigLIP configs; for CLIP/SigLIP-style
    dual-tower models only the vision tower runs.
    ``pooling``: ``cls`` (the final-layer class token, which is also DINOv2's
    ``pooler_output``), ``mean`` (mean of the patch tokens, class and
    register tokens excluded), ``pooler`` (the model's ``pooler_output``) or
    ``image`` (``get_image_features``: the projected image embedding of a
    dual-tower model). Default: ``image`` for dual-tower models, else ``cls``,
    else (no class token, e.g. a bare SigLIP vision tower) ``pooler`` when the
    model has one, else ``mean``.
``open_clip:ARCH[?weights=PATH|pretrained=TAG&size=PX&init=random&seed=INT]``
    The image tower of an OpenCLIP model; the embedding is ``encode_image``'s
    (unnormalised) output. ``ARCH`` is a name of ``open_clip.list_models()``,
    ``hf-hub:ORG/REPO`` (config and weights from the local HF cache) or
    ``local-dir:FOLDER`` (``open_clip_config.json`` plus weights in a folder).
    A named ARCH without ``weights``/``pretrained`` is randomly initialised
    (seeded), like ``timm:``; ``pretrained=TAG`` resolves the tag's Hugging
    Face weights from the local cache only.

Preprocessing follows the project's rule (:class:`Preprocessing`): the whole
image is resized to the model's square input (antialiased), grayscale is
repeated to three channels, then normalised with the model's mean and std.
The processors' own resize-then-centre-crop (DINOv2: 256 then 224) is not
applied, exactly as for ``timm:`` models.

Examples
--------
>>> import crslib
>>> _hf_pooling_default(dual_tower=True, has_cls=True, has_pooler=True)
'image'
>>> _hf_pooling_default(dual_tower=False, has_cls=False, has_pooler=False)
'mean'
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

import crslib  # noqa: F401  (applies the torchvision import fix before torch/timm)

import torch  # noqa: E402  (this module is imported only when an hf: or open_clip: spec is loaded)
from crslib._io import digest_of
from crslib.errors import ModelError
from crslib.models._options import _parse_int
from crslib.models.encoders import Preprocessing, TorchEncoder, _loaded_or_state, _state_signature, weights_sha256

log = logging.getLogger(__name__)

__all__ = ["EcosystemEncoder", "HF_POOLINGS", "load_hf_encoder", "load_open_clip_encoder"]

#: The ``pooling=`` values of ``hf:`` specs.
HF_POOLINGS = ("cls", "mean", "pooler", "image")
_HF_WEIGHT_PATTERNS = ("model*.safetensors", "pytorch_model*.bin")
_DUAL_TOWER = ("clip", "siglip", "siglip2", "chinese_clip", "altclip", "metaclip_2")


def _hf_cache_dir() -> str:
    from huggingface_hub import constants

    return os.environ.get("HF_HUB_CACHE") or (
        os.path.join(os.environ["HF_HOME"], "hub") if os.environ.get("HF_HOME") else constants.HF_HUB_CACHE
    )


def _import(package: str, pip_name: str, spec: str):
    import importlib

    try:
        return importlib.import_module(package)
    except ImportError as exc:
        raise ModelError(
            f"model spec {spec!r} needs the {package!r} package ({exc}); install it with pip install {pip_name}"
        ) from None


def _cached_file(repo: str, filename: str) -> Path | None:
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo, filename, cache_dir=_hf_cache_dir())
    except Exception:  # noqa: BLE001 - a malformed repo id is simply not in the cache
        return None
    return Path(found) if isinstance(found, str) and os.path.isfile(found) else None


def _not_cached(repo: str, what: str, spec: str) -> ModelError:
    return ModelError(
        f"{what} {repo!r} (from model spec {spec!r}) is not in the local Hugging Face cache {_hf_cache_dir()}; "
        f"on a machine with network run: hf download {repo} (set HF_HUB_CACHE to choose the cache folder), "
        "or give a local folder"
    )


def _looks_like_path(text: str) -> bool:
    return text.startswith(("/", ".", "~")) or text.count("/") > 1 or "\\" in text


def _local_dir(text: str) -> Path:
    path = Path(os.path.expanduser(text))
    return Path(os.path.normpath(path if path.is_absolute() else Path.cwd() / path))


class EcosystemEncoder(TorchEncoder):
    """A ``transformers`` or OpenCLIP image tower (see :func:`load_hf_encoder`,
    :func:`load_open_clip_encoder`).

    The weights' fingerprint is the SHA-256 of the files they were loaded
    from (config included) while the module is unchanged, else the state
    dict's hash; a randomly initialised model is fingerprinted by its state
    dict.
    """

    def __init__(self, module, *, backend: str, name: str, preprocessing: Preprocessing, arch: dict[str, Any],
                 files: list[Path] | None = None, dim: int | None = None):
        super().__init__(module, name=name, preprocessing=preprocessing)
        self.backend = backend
        self.arch = arch
        self.files = list(files or [])
        # a single weight file is the model's provenance in reports (crslib.compare.model_provenance)
        weight_files = [f for f in self.files if not f.name.endswith(".json")]
        self.weights_file = weight_files[0] if len(weight_files) == 1 else None
        self._files_hash: str | None = None
        self._loaded_signature: tuple | None = None
        if self.files:
            try:
                self._files_hash = digest_of([[p.name, weights_sha256(p)] for p in self.files])
            except OSError as exc:
                raise ModelError(f"cannot read weight file of {name}: {exc}") from None
            self._loaded_signature = _state_signature(module.state_dict())
        if dim is not None:
            self._dim = int(dim)

    # Unpickled tensors have new storage, so the loaded-weights signature is
    # renewed when the weights still were the files' (a Dask worker's copy
    # keeps the fingerprint).
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_as_loaded"] = self._loaded_signature is not None and (
            _state_signature(self.module.state_dict()) == self._loaded_signature)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        as_loaded = state.pop("_as_loaded", False)
        self.__dict__.update(state)
        if as_loaded:
            self._loaded_signature = _state_signature(self.module.state_dict())

    def _architecture(self) -> dict[str, Any]:
        return dict(self.arch)

    def _weights_fingerprint(self) -> str:
        return _loaded_or_state(self, None if self._files_hash is None else "files:" + self._files_hash)


def _seeded(seed: int, build):
    import torch

    with torch.random.fork_rng(devices=[]):  # leave the caller's RNG state alone
        torch.manual_seed(seed)
        return build()


def _common_options(options: dict[str, str], spec: str) -> tuple[int | None, bool, int]:
    size = _parse_int(options["size"], "size", spec) if "size" in options else None
    init = options.get("init", "").lower()
    if init not in ("", "random"):
        raise ModelError(f"init={options['init']!r} in {spec!r}: only init=random is supported")
    seed = _parse_int(options.get("seed", "0"), "seed", spec)
    return size, init == "random", seed


# --------------------------------------------------------------------------- transformers


def _hf_pooling_default(*, dual_tower: bool, has_cls: bool, has_pooler: bool) -> str:
    if dual_tower:
        return "image"
    if has_cls:
        return "cls"
    return "pooler" if has_pooler else "mean"


def _hf_folder(target: str, spec: str) -> tuple[Path, str]:
    """The folder holding the model's files, and the name results show."""
    local = _local_dir(target)
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ModelError(f"folder {local} (from model spec {spec!r}) has no config.json; "
                             "it must be a folder written by save_pretrained or a Hugging Face snapshot")
        return local, str(local)
    if _looks_like_path(target) or not re.fullmatch(r"[\w.\-]+(/[\w.\-]+)?", target):
        raise ModelError(f"model folder {local} does not exist (from model spec {spec!r}); check the path")
    config = _cached_file(target, "config.json")
    if config is None:
        raise _not_cached(target, "Hugging Face model", spec)
    return config.parent, target


def _hf_weight_files(folder: Path) -> list[Path]:
    for pattern in _HF_WEIGHT_PATTERNS:
        found = sorted(folder.glob(pattern))
        if found:
            return [folder / "config.json", *found]
    return []


class _HFImageTower(torch.nn.Module):
    """A transformers model as a module mapping pixels ``(B, 3, H, W)`` to pooled embeddings ``(B, D)``
    (defined at module level so that encoders pickle, e.g. to Dask workers)."""

    def __init__(self, model, *, pooling: str, dual_tower: bool, patch_size: int, interpolate: bool):
        super().__init__()
        self.model = model
        self.pooling, self.dual_tower, self.patch_size, self.interpolate = pooling, dual_tower, patch_size, interpolate

    def forward(self, pixel_values):
        kw = {"interpolate_pos_encoding": True} if self.interpolate else {}
        if self.pooling == "image":
            out = self.model.get_image_features(pixel_values=pixel_values, **kw)
            return out if isinstance(out, torch.Tensor) else out.pooler_output
        tower = self.model.vision_model if self.dual_tower else self.model
        out = tower(pixel_values=pixel_values, **kw)
        if self.pooling == "pooler":
            return out.pooler_output
        tokens = out.last_hidden_state
        if self.pooling == "cls":
            return tokens[:, 0]
        prefix = _prefix_tokens(tokens.shape[1], pixel_values.shape[-2:], self.patch_size)
        return tokens[:, prefix:].mean(dim=1)


def _prefix_tokens(n_tokens: int, hw, patch_size: int) -> int:
    """Class and register tokens before the patch tokens (0 when the count does not add up)."""
    patches = (int(hw[0]) // patch_size) * (int(hw[1]) // patch_size)
    extra = n_tokens - patches
    return extra if 0 <= extra <= 16 else 0


def _probe(tower, pre: Preprocessing, interpolate: bool, spec: str) -> tuple[int, bool]:
    """Token count and whether a pooler output exists, from one forward pass of a blank image."""
    import torch

    try:
        with torch.inference_mode():
            out = tower(pixel_values=torch.zeros(1, *pre.input_size),
                        **({"interpolate_pos_encoding": True} if interpolate else {}))
        n_tokens = int(out.last_hidden_state.shape[1])
    except Exception as exc:  # noqa: BLE001 - models that are not image encoders fail in many ways
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"{type(tower).__name__} from {spec!r} does not encode a {pre.input_size} image into "
                         f"tokens ({type(exc).__name__}: {reason[:200]}); hf: takes vision transformers") from None
    return n_tokens, getattr(out, "pooler_output", None) is not None


def _hf_preprocessing(folder: Path, config, size: int | None, spec: str) -> Preprocessing:
    from transformers import AutoImageProcessor

    if not (folder / "preprocessor_config.json").is_file():
        raise ModelError(
            f"model folder {folder} (from model spec {spec!r}) has no preprocessor_config.json; save the "
            "model's image processor there too (AutoImageProcessor.save_pretrained)"
        )
    try:
        proc = AutoImageProcessor.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure means the processor files are unusable
        raise ModelError(f"cannot load the image processor of {spec!r}: {type(exc).__name__}: {exc}") from None
    vision = getattr(config, "vision_config", None) or config

    def _hw(value) -> tuple[int, int] | None:
        if value is None:
            return None
        if isinstance(value, int):
            return value, value
        value = dict(value)
        if "height" in value and "width" in value:
            return int(value["height"]), int(value["width"])
        edge = value.get("shortest_edge")
        return (int(edge), int(edge)) if edge else None

    hw = _hw(getattr(proc, "crop_size", None)) if getattr(proc, "do_center_crop", False) else None
    hw = hw or _hw(getattr(proc, "size", None)) or _hw(getattr(vision, "image_size", None)) or (224, 224)
    if size is not None:
        hw = (size, size)
    if getattr(proc, "do_normalize", True):
        mean, std = tuple(proc.image_mean), tuple(proc.image_std)
    else:
        mean, std = (0.0,), (1.0,)
    resample = int(getattr(proc, "resample", 2) or 2)  # PIL codes: 0 nearest, 2 bilinear, 3 bicubic
    interpolation = {0: "nearest", 3: "bicubic", 1: "bicubic"}.get(resample, "bilinear")
    return Preprocessing(input_size=(3, *hw), mean=mean, std=std, interpolation=interpolation, channels=3)


def load_hf_encoder(target: str, options: dict[str, str], *, spec: str) -> EcosystemEncoder:
    """Load an ``hf:`` spec (see the module docstring).

    Raises
    ------
    ModelError
        Missing folder, a repo id not in the local cache, an architecture
        ``transformers`` does not know, missing weights, an unsupported
        pooling, or ``transformers`` not installed.
    """
    _import("transformers", "transformers", spec)
    from transformers import AutoConfig, AutoModel

    size, random_init, seed = _common_options(options, spec)
    pooling = options.get("pooling", "").lower() or None
    if pooling is not None and pooling not in HF_POOLINGS:
        raise ModelError(f"pooling={pooling!r} in {spec!r}: use one of {', '.join(HF_POOLINGS)}")
    folder, shown = _hf_folder(target, spec)
    try:
        config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - unknown model_type and malformed configs alike
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"unknown or unreadable architecture in {folder / 'config.json'} "
                         f"(from model spec {spec!r}): {reason[:300]}") from None
    if config.model_type == "siglip2":
        raise ModelError(f"{spec!r} is a NaFlex SigLIP 2 model (model_type siglip2, variable-size patch sequences), "
                         "which hf: does not run; use a fixed-resolution SigLIP 2 checkpoint such as "
                         "google/siglip2-base-patch16-224 (model_type siglip)")
    dual = config.model_type in _DUAL_TOWER or (
        hasattr(config, "vision_config") and getattr(config, "text_config", None) is not None)
    pre = _hf_preprocessing(folder, config, size, spec)
    files = [] if random_init else _hf_weight_files(folder)
    if not random_init and not files:
        raise ModelError(f"model folder {folder} (from model spec {spec!r}) holds no weights "
                         f"({' or '.join(_HF_WEIGHT_PATTERNS)}); use ?init=random for a random network")
    from transformers.utils import logging as hf_logging

    bar, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    # a "Loading weights" bar and a multi-line load report per model; missing weights are our own error below
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        if random_init:
            model = _seeded(seed, lambda: AutoModel.from_config(config, dtype=torch.float32))
        else:
            model, info = AutoModel.from_pretrained(str(folder), local_files_only=True, dtype=torch.float32,
                                                    output_loading_info=True)
    except (ValueError, KeyError, OSError, RuntimeError, TypeError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"cannot create the transformers model of {spec!r}: {reason[:300]}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
        if bar:
            hf_logging.enable_progress_bar()
    model.eval()
    vision = getattr(config, "vision_config", None) or config
    patch = int(getattr(vision, "patch_size", 16) or 16)
    native = getattr(vision, "image_size", None)
    interpolate = "interpolate_pos_encoding" in inspect.signature(
        (model.vision_model if dual else model).forward).parameters and (pre.input_size[1], pre.input_size[2]) != (
        native, native)
    n_tokens, has_pooler = _probe(model.vision_model if dual else model, pre, interpolate, spec)
    has_cls = _prefix_tokens(n_tokens, pre.input_size[1:], patch) >= 1
    if pooling is None:
        pooling = _hf_pooling_default(dual_tower=dual, has_cls=has_cls, has_pooler=has_pooler)
    if pooling == "image" and not hasattr(model, "get_image_features"):
        raise ModelError(f"pooling=image in {spec!r}: {type(model).__name__} has no image projection; use cls, mean "
                         "or pooler")
    if pooling == "cls" and not has_cls:
        raise ModelError(f"pooling=cls in {spec!r}: {config.model_type} has no class token; use mean or pooler")
    if pooling == "pooler" and not has_pooler:
        raise ModelError(f"pooling=pooler in {spec!r}: {type(model).__name__} returns no pooler_output")
    if not random_init:
        missing = [k for k in info.get("missing_keys", []) if pooling == "pooler" or "pooler" not in k]
        if missing and all("pooler" in k for k in missing):
            raise ModelError(f"pooling=pooler in {spec!r}: the checkpoint has no pooler weights "
                             f"({', '.join(sorted(missing)[:3])}); use cls or mean")
        if missing:
            raise ModelError(f"weights in {folder} lack {len(missing)} parameters of {type(model).__name__} "
                             f"(e.g. {', '.join(sorted(missing)[:3])}); check that the folder is complete")
    module = _HFImageTower(model, pooling=pooling, dual_tower=dual, patch_size=patch, interpolate=interpolate)
    import transformers

    arch = {"model_type": config.model_type, "class": type(model).__name__, "pooling": pooling,
            "config": json.loads(config.to_json_string(use_diff=False)) if random_init else None,
            "transformers": transformers.__version__}
    canon = dict(options, pooling=pooling)
    canon.pop("seed", None)
    if random_init:
        canon["seed"] = str(seed)
    return EcosystemEncoder(module, backend="hf", name=_name("hf", shown, canon), preprocessing=pre, arch=arch,
                            files=files)


def _name(backend: str, target: str, options: dict[str, Any]) -> str:
    opts = "&".join(f"{k}={options[k]}" for k in sorted(options))
    return f"{backend}:{target}" + (f"?{opts}" if opts else "")


# --------------------------------------------------------------------------- OpenCLIP


def _open_clip_source(arch: str, options: dict[str, str], random_init: bool, spec: str):
    """The model config, its preprocessing config, the weight file (None for
    random init) and the name results show."""
    import open_clip
    from open_clip.factory import get_model_config

    if arch.startswith("hf-hub:"):
        repo = arch[len("hf-hub:"):]
        config_file = _cached_file(repo, "open_clip_config.json")
        if config_file is None:
            raise _not_cached(repo, "OpenCLIP model", spec)
        full = json.loads(config_file.read_text())
        weights = None
        if not random_init:
            for filename in ("open_clip_model.safetensors", "open_clip_pytorch_model.bin"):
                weights = weights or _cached_file(repo, filename)
            if weights is None:
                raise _not_cached(repo, "weights of OpenCLIP model", spec)
        return full.get("model_cfg", full), full.get("preprocess_cfg", {}), weights, [config_file], arch
    if arch.startswith("local-dir:"):
        folder = _local_dir(arch[len("local-dir:"):])
        config_file = folder / "open_clip_config.json"
        if not config_file.is_file():
            raise ModelError(f"OpenCLIP folder {folder} has no open_clip_config.json (from model spec {spec!r}); "
                             "check the path")
        full = json.loads(config_file.read_text())
        weights = None
        if not random_init:
            found = [folder / f for f in ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")
                     if (folder / f).is_file()]
            if not found:
                raise ModelError(f"OpenCLIP folder {folder} holds no open_clip_model.safetensors or "
                                 f"open_clip_pytorch_model.bin (from model spec {spec!r})")
            weights = found[0]
        return full.get("model_cfg", full), full.get("preprocess_cfg", {}), weights, [config_file], \
            f"local-dir:{folder}"
    cfg = get_model_config(arch)
    if cfg is None:
        import difflib

        close = difflib.get_close_matches(arch, open_clip.list_models(), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ModelError(f"no OpenCLIP architecture named {arch!r} (in model spec {spec!r}); "
                         f"see open_clip.list_models(), or use hf-hub:ORG/REPO or local-dir:FOLDER{hint}")
    weights, pre_cfg = None, {}
    if "weights" in options and not random_init:
        weights = _local_dir(options["weights"])
        if not weights.is_file():
            raise ModelError(f"weight file {weights} does not exist (from model spec {spec!r}); check the path")
    elif "pretrained" in options and not random_init:
        tag = options["pretrained"]
        pcfg = open_clip.get_pretrained_cfg(arch, tag)
        if not pcfg:
            tags = [t for a, t in open_clip.list_pretrained() if a == arch]
            raise ModelError(f"OpenCLIP {arch!r} has no pretrained tag {tag!r} (in model spec {spec!r}); "
                             f"tags: {', '.join(tags) or 'none'}")
        pre_cfg = {k: pcfg[k] for k in ("mean", "std", "interpolation") if pcfg.get(k)}
        hub = (pcfg.get("hf_hub") or "").rstrip("/")
        if not hub:
            raise ModelError(f"OpenCLIP {arch}/{tag} has no Hugging Face weights; download the checkpoint "
                             f"yourself and use open_clip:{arch}?weights=PATH")
        parts = hub.split("/")
        repo, filename = "/".join(parts[:2]), "/".join(parts[2:])
        candidates = [filename] if filename else ["open_clip_model.safetensors", "open_clip_pytorch_model.bin"]
        for filename in candidates:
            weights = weights or _cached_file(repo, filename)
        if weights is None:
            raise _not_cached(repo, f"weights of OpenCLIP {arch}/{tag}:", spec)
    return cfg, pre_cfg, weights, [], arch


def _open_clip_state(path: Path, spec: str) -> dict[str, Any]:
    from open_clip.factory import load_state_dict

    try:
        state = load_state_dict(str(path), weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure means the file is unusable
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"cannot read OpenCLIP weight file {path}: {reason[:300]}") from None
    visual = {k[len("visual."):]: v for k, v in state.items() if k.startswith("visual.")}
    if not visual:
        raise ModelError(f"weight file {path} has no image-tower keys (visual.*); it is not an OpenCLIP checkpoint")
    return visual


def load_open_clip_encoder(arch: str, options: dict[str, str], *, spec: str) -> EcosystemEncoder:
    """Load an ``open_clip:`` spec (see the module docstring).

    Raises
    ------
    ModelError
        Unknown architecture, missing file or folder, a tag or hub repo not in
        the local cache, weights that do not fit, or ``open_clip`` not
        installed.
    """
    _import("open_clip", "open-clip-torch", spec)
    from open_clip.model import _build_vision_tower

    size, random_init, seed = _common_options(options, spec)
    if "weights" in options and "pretrained" in options:
        raise ModelError(f"model spec {spec!r} gives both weights= and pretrained=; use one")
    cfg, pre_cfg, weights, config_files, shown = _open_clip_source(arch, options, random_init, spec)
    vision_cfg = dict(cfg.get("vision_cfg", {}))
    vision_cfg["timm_model_pretrained"] = False  # weights come from the checkpoint, never a download
    if size is not None:
        vision_cfg["image_size"] = size
    quick_gelu = bool(cfg.get("quick_gelu", False))
    try:
        visual = _seeded(seed, lambda: _build_vision_tower(int(cfg["embed_dim"]), vision_cfg, quick_gelu))
    except (TypeError, KeyError, ValueError, RuntimeError, AssertionError) as exc:
        raise ModelError(f"cannot create the OpenCLIP image tower of {spec!r}: {type(exc).__name__}: {exc}") from None
    if weights is not None:
        state = _open_clip_state(weights, spec)
        try:
            visual.load_state_dict(state, strict=True)
        except RuntimeError as exc:
            lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
            raise ModelError(f"weight file {weights} does not fit OpenCLIP {arch!r}"
                             f"{' at size ' + str(size) if size else ''}: {'; '.join(lines[1:3])[:400]}") from None
    visual.eval()
    from open_clip.constants import OPENAI_DATASET_MEAN, OPENAI_DATASET_STD

    image_size = vision_cfg.get("image_size", 224)
    hw = tuple(image_size) if isinstance(image_size, (list, tuple)) else (int(image_size),) * 2
    mean = tuple(pre_cfg.get("mean") or vision_cfg.get("image_mean") or OPENAI_DATASET_MEAN)
    std = tuple(pre_cfg.get("std") or vision_cfg.get("image_std") or OPENAI_DATASET_STD)
    interp = str(pre_cfg.get("interpolation") or vision_cfg.get("image_interpolation") or "bicubic")
    pre = Preprocessing(input_size=(3, *hw), mean=mean, std=std,
                        interpolation=interp if interp in ("bilinear", "bicubic") else "bicubic", channels=3)
    import open_clip

    canon = {k: v for k, v in options.items() if k in ("size", "init")}
    if weights is None:
        canon["seed"] = str(seed)
    elif "weights" in options:
        canon["weights"] = str(weights)
    elif "pretrained" in options:
        canon["pretrained"] = options["pretrained"]
    arch_record = {"model_cfg": dict(cfg, vision_cfg=vision_cfg), "open_clip": open_clip.__version__}
    files = [*config_files, weights] if weights is not None else []
    return EcosystemEncoder(visual, backend="open_clip", name=_name("open_clip", shown, canon), preprocessing=pre,
                            arch=arch_record, files=files, dim=int(cfg["embed_dim"]))
