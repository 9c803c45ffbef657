"""The timm backend's model creation and weight loading.

:func:`_create_timm` builds a timm model (at a given input size for models
with a fixed one, such as ViTs); :func:`_load_weights` loads a local weight
file into it, falling back on timm's own checkpoint filter for foreign key
names; :func:`_hf_cached_weights` finds a model's published weights in the
*local* Hugging Face cache without any network access. Used by
:mod:`crslib.models.specs` for ``timm:`` specs.

Examples
--------
>>> import crslib, torch
>>> model = _create_timm("test_resnet", {"num_classes": 0}, None, "timm:test_resnet")
>>> model.eval()(torch.zeros(1, 3, 32, 32)).shape[1] == model.num_features
True
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

import crslib  # noqa: F401  (applies the torchvision import fix before torch/timm)
from crslib.errors import ModelError

log = logging.getLogger(__name__)


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
