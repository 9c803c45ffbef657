"""The zoo's training objectives, one class each.

Every objective is a ``torch.nn.Module`` that holds the encoder being
trained (``self.encoder``) and the objective's heads, with a
``loss(x01, y, gen, normalise)`` method (a batch of images in ``[0, 1]``,
its labels or ``None``, the training ``torch.Generator`` for augmentations
and masks, and the pool's normalisation) and an ``after_step(frac)`` hook
called after each optimiser step with the training progress in ``[0, 1]``:

=====================================  ======================================================
``supervised_multilabel``/``_single``  :class:`Supervised`: linear head, BCE or cross-entropy
``contrastive``                        :class:`SimCLR`: NT-Xent between two augmented views
``self_distillation``                  :class:`BYOL` (default) or :class:`DINO`: EMA teacher
``masked_image_modelling``             :class:`SimMIM`: masked-patch pixel reconstruction
``autoencoder``                        :class:`AutoEncoder`: reconstruction through the embedding
=====================================  ======================================================

:func:`_build_objective` picks the class of a
:class:`~crslib.models.zoo.ZooModelSpec`. The order in which each class
creates its modules and draws random numbers is part of the zoo's
reproducibility: a change of it changes the trained weights (bump
``ZOO_FORMAT`` in :mod:`crslib.models.zoo`). This module imports torch; the
zoo imports it only when it trains.

Examples
--------
>>> import crslib, torch
>>> from crslib.models.networks import build_encoder_module
>>> from crslib.models.zoo import ZooModelSpec
>>> _ = torch.manual_seed(0)
>>> model = _build_objective(ZooModelSpec.make("contrastive"), build_encoder_module("cnn_small"), 0, 32)
>>> type(model).__name__
'SimCLR'
>>> loss = model.loss(torch.rand(4, 1, 32, 32), None, torch.Generator().manual_seed(0), lambda x: x)
>>> loss.ndim, bool(loss > 0)
(0, True)
"""

from __future__ import annotations

import copy
from typing import Any

import crslib  # noqa: F401  (applies the torchvision import fix before torch/timm)
import torch
import torch.nn.functional as F
from torch import nn

from crslib.errors import ConfigError
from crslib.models._training import ema_tau, ema_update
from crslib.models.augment import _augment
from crslib.models.networks import _DinoHead, _mlp

__all__ = ["AutoEncoder", "BYOL", "DINO", "Objective", "SimCLR", "SimMIM", "Supervised"]


class Objective(nn.Module):
    """The encoder being trained plus an objective's heads.

    Parameters
    ----------
    encoder : torch.nn.Module
        A zoo encoder (:func:`~crslib.models.networks.build_encoder_module`).
    hp : dict
        The spec's resolved hyperparameters (``augment`` and the
        objective's own).
    """

    def __init__(self, encoder: nn.Module, hp: dict[str, Any]):
        super().__init__()
        self.encoder = encoder
        self.hp = hp

    def augment(self, x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """One augmented view of the batch, at the spec's ``augment`` strength."""
        return _augment(x, gen, self.hp["augment"])

    def after_step(self, frac: float) -> None:
        """Hook after each optimiser step (``frac``: share of the steps done)."""


class Supervised(Objective):
    """A linear head on the embedding: binary cross-entropy on every finding
    (``multilabel``) or cross-entropy on the single label."""

    def __init__(self, encoder: nn.Module, hp: dict[str, Any], n_outputs: int, *, multilabel: bool):
        super().__init__(encoder, hp)
        self.head = nn.Linear(encoder.embedding_dim, n_outputs)
        self.multilabel = multilabel

    def loss(self, x, y, gen, norm):
        logits = self.head(self.encoder(norm(self.augment(x, gen))))
        if self.multilabel:
            return F.binary_cross_entropy_with_logits(logits, y)
        return F.cross_entropy(logits, y)


class SimCLR(Objective):
    """NT-Xent (``temperature``) between two augmented views, through a
    2-layer projection head of ``proj_dim`` outputs."""

    def __init__(self, encoder: nn.Module, hp: dict[str, Any]):
        super().__init__(encoder, hp)
        dim = encoder.embedding_dim
        self.projector = _mlp(dim, dim, int(hp["proj_dim"]))

    def loss(self, x, y, gen, norm):
        v1 = self.augment(x, gen)
        v2 = self.augment(x, gen)
        z = F.normalize(self.projector(self.encoder(norm(torch.cat([v1, v2])))), dim=1)
        n = x.shape[0]
        sim = z @ z.t() / float(self.hp["temperature"])
        sim = sim.masked_fill(torch.eye(2 * n, dtype=torch.bool, device=sim.device), float("-inf"))
        target = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)]).to(sim.device)
        return F.cross_entropy(sim, target)


class BYOL(Objective):
    """An online projector and predictor regress the other view's projection
    by an EMA teacher (``ema_momentum`` -> 1 on a cosine schedule); the online
    projections of each view also pay ``variance_weight`` times
    :func:`_spread_penalty` (against dimensional collapse)."""

    def __init__(self, encoder: nn.Module, hp: dict[str, Any]):
        super().__init__(encoder, hp)
        dim = encoder.embedding_dim
        self.projector = _mlp(dim, int(hp["hidden_dim"]), int(hp["proj_dim"]))
        self.predictor = _mlp(int(hp["proj_dim"]), int(hp["hidden_dim"]), int(hp["proj_dim"]))
        self.teacher = nn.ModuleDict({"encoder": copy.deepcopy(encoder), "projector": copy.deepcopy(self.projector)})
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        self.momentum = float(hp["ema_momentum"])

    def loss(self, x, y, gen, norm):
        v = norm(torch.cat([self.augment(x, gen), self.augment(x, gen)]))
        n = x.shape[0]
        z = self.projector(self.encoder(v))
        p = F.normalize(self.predictor(z), dim=1)
        with torch.no_grad():
            t = F.normalize(self.teacher["projector"](self.teacher["encoder"](v)), dim=1)
        t = torch.cat([t[n:], t[:n]])  # each view regresses the other view's target
        loss = (2 - 2 * (p * t).sum(dim=1)).mean()
        weight = float(self.hp.get("variance_weight", 0.0))
        if weight:
            loss = loss + weight * _spread_penalty(z[:n]) + weight * _spread_penalty(z[n:])
        return loss

    def after_step(self, frac: float) -> None:
        ema_update([(self.encoder, self.teacher["encoder"]), (self.projector, self.teacher["projector"])],
                   ema_tau(self.momentum, frac))


def _spread_penalty(z: torch.Tensor) -> torch.Tensor:
    """VICReg's variance and covariance terms: each projection dimension keeps a standard
    deviation of at least 1 over the batch, and the dimensions stay decorrelated (against the
    collapse to one direction that a few hundred BYOL steps on small images end in)."""
    z = z - z.mean(dim=0)
    std = torch.sqrt(z.var(dim=0) + 1e-4)
    cov = (z.t() @ z) / max(z.shape[0] - 1, 1)
    off = cov - torch.diag(torch.diagonal(cov))
    return F.relu(1.0 - std).mean() + off.pow(2).sum() / z.shape[1]


class DINO(Objective):
    """DINO without multi-crop: the student's prototype scores (temperature
    ``student_temp``) regress the EMA teacher's centred, sharpened
    (``teacher_temp``) scores of the other view; the centre is an EMA of
    the teacher's mean output (``center_momentum``)."""

    def __init__(self, encoder: nn.Module, hp: dict[str, Any]):
        super().__init__(encoder, hp)
        k = int(hp["prototypes"])
        self.head = _DinoHead(encoder.embedding_dim, int(hp["hidden_dim"]), int(hp["proj_dim"]), k)
        self.teacher = nn.ModuleDict({"encoder": copy.deepcopy(encoder), "head": copy.deepcopy(self.head)})
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        self.register_buffer("center", torch.zeros(1, k))
        self.momentum = float(hp["ema_momentum"])

    def loss(self, x, y, gen, norm):
        hp = self.hp
        v = norm(torch.cat([self.augment(x, gen), self.augment(x, gen)]))
        n = x.shape[0]
        s = F.log_softmax(self.head(self.encoder(v)) / float(hp["student_temp"]), dim=1)
        with torch.no_grad():
            t_out = self.teacher["head"](self.teacher["encoder"](v))
            t = F.softmax((t_out - self.center) / float(hp["teacher_temp"]), dim=1)
            self.center.mul_(float(hp["center_momentum"])).add_(
                t_out.mean(dim=0, keepdim=True), alpha=1 - float(hp["center_momentum"]))
        t = torch.cat([t[n:], t[:n]])
        return -(t * s).sum(dim=1).mean()

    def after_step(self, frac: float) -> None:
        ema_update([(self.encoder, self.teacher["encoder"]), (self.head, self.teacher["head"])],
                   ema_tau(self.momentum, frac))


class SimMIM(Objective):
    """``mask_ratio`` of the ``mask_patch``-pixel patches replaced by a
    learned value; a 1x1 convolution and a pixel shuffle reconstruct the
    pixels from the last feature map; L1 loss on the masked pixels, against
    per-patch normalised pixels with ``norm_target`` (:func:`_patch_normalised`)."""

    def __init__(self, encoder: nn.Module, hp: dict[str, Any]):
        super().__init__(encoder, hp)
        stride = encoder.stride
        self.mask_value = nn.Parameter(torch.zeros(1))
        self.decoder = nn.Sequential(nn.Conv2d(encoder.embedding_dim, stride * stride, 1), nn.PixelShuffle(stride))
        self.patch = int(hp["mask_patch"])
        self.ratio = float(hp["mask_ratio"])
        self.norm_target = bool(hp["norm_target"])

    def loss(self, x, y, gen, norm):
        xa = norm(self.augment(x, gen))
        mask = _patch_mask(xa, self.patch, self.ratio, gen)
        inp = xa * (1 - mask) + self.mask_value.view(1, 1, 1, 1) * mask
        rec = self.decoder(self.encoder.forward_features(inp))
        target = _patch_normalised(xa, self.patch) if self.norm_target else xa
        return ((rec - target).abs() * mask).sum() / mask.sum().clamp(min=1.0)


def _patch_mask(x: torch.Tensor, patch: int, ratio: float, gen: torch.Generator) -> torch.Tensor:
    """A ``(B, 1, H, W)`` mask of ones on ``ratio`` of each image's ``patch``-pixel
    patches (at least one), drawn at random."""
    n, _, h, w = x.shape
    gh, gw = h // patch, w // patch
    k = max(1, int(round(ratio * gh * gw)))
    order = torch.argsort(torch.rand(n, gh * gw, generator=gen), dim=1)
    mask = torch.zeros(n, gh * gw)
    mask.scatter_(1, order[:, :k], 1.0)
    # the draw stays on the CPU generator (the same mask on every device); only the mask moves
    return _per_pixel(mask.view(n, 1, gh, gw), patch).to(x.device)


def _per_pixel(blocks: torch.Tensor, patch: int) -> torch.Tensor:
    """One value per ``patch`` x ``patch`` block repeated onto every pixel of the block."""
    return blocks.repeat_interleave(patch, 2).repeat_interleave(patch, 3)


def _patch_normalised(x: torch.Tensor, patch: int) -> torch.Tensor:
    """``x`` with each ``patch`` x ``patch`` block shifted to mean 0 and scaled
    to standard deviation 1 (MAE's normalised pixel target), so that the loss
    rewards local structure rather than each block's overall brightness."""
    mean = F.avg_pool2d(x, patch)
    var = (F.avg_pool2d(x * x, patch) - mean * mean).clamp(min=0.0)
    return (x - _per_pixel(mean, patch)) / _per_pixel((var + 1e-6).sqrt(), patch)


class AutoEncoder(Objective):
    """The pooled embedding is the bottleneck; an upsampling decoder
    reconstructs the whole augmented ``image_size`` image; mean squared
    error. With ``mask_ratio`` > 0 the encoder sees the image with that share
    of its ``mask_patch``-pixel patches set to 0 (a denoising autoencoder)."""

    def __init__(self, encoder: nn.Module, hp: dict[str, Any], image_size: int):
        super().__init__(encoder, hp)
        self.base = image_size // 16
        c = [64, 32, 16, 8]
        self.fc = nn.Linear(encoder.embedding_dim, c[0] * self.base * self.base)
        layers: list[nn.Module] = []
        for cin, cout in zip(c[:-1], c[1:]):
            layers += [nn.Upsample(scale_factor=2, mode="nearest"), nn.Conv2d(cin, cout, 3, padding=1, bias=False),
                       nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]
        layers += [nn.Upsample(scale_factor=2, mode="nearest"), nn.Conv2d(c[-1], 1, 3, padding=1)]
        self.decoder = nn.Sequential(*layers)
        self.c0 = c[0]
        self.mask_ratio = float(hp["mask_ratio"])
        self.mask_patch = int(hp["mask_patch"])

    def loss(self, x, y, gen, norm):
        xa = norm(self.augment(x, gen))
        inp = xa
        if self.mask_ratio > 0:
            # denoising: whole patches are hidden from the encoder, the whole image is the target
            inp = xa * (1 - _patch_mask(xa, self.mask_patch, self.mask_ratio, gen))
        z = self.encoder(inp)
        rec = self.decoder(F.relu(self.fc(z)).view(-1, self.c0, self.base, self.base))
        return F.mse_loss(rec, xa)


def _build_objective(spec, encoder: nn.Module, n_outputs: int, image_size: int) -> Objective:
    """The training module of a :class:`~crslib.models.zoo.ZooModelSpec`: the
    encoder plus the objective's heads, with a ``loss(x01, y, gen, normalise)``
    method and an ``after_step(frac)`` hook."""
    hp = spec.resolved_hparams()
    objective = spec.objective
    if objective == "self_distillation" and hp.get("method", "byol") not in ("byol", "dino"):
        raise ConfigError(f"self_distillation method must be 'byol' or 'dino', got {hp.get('method')!r}")
    builders = {
        "supervised_multilabel": lambda: Supervised(encoder, hp, n_outputs, multilabel=True),
        "supervised_single": lambda: Supervised(encoder, hp, n_outputs, multilabel=False),
        "contrastive": lambda: SimCLR(encoder, hp),
        "self_distillation": lambda: (DINO if hp.get("method", "byol") == "dino" else BYOL)(encoder, hp),
        "masked_image_modelling": lambda: SimMIM(encoder, hp),
        "autoencoder": lambda: AutoEncoder(encoder, hp, image_size),
    }
    return builders[objective]()
