"""Batched image augmentation for zoo training, without horizontal flips.

Chest radiographs have laterality (heart on the left, laterality markers),
so the augmentations are random resized crops and small rotations (one
affine warp per image) plus brightness, contrast and noise, at three
strengths (:data:`_AUG`): ``weak`` for the supervised objectives,
``contrastive``, the autoencoder and masked image modelling, ``strong`` for
``self_distillation``; ``medium`` on request. All randomness comes from the given
``torch.Generator``, in a fixed order.

Examples
--------
>>> import crslib, torch
>>> x = torch.full((4, 1, 16, 16), 0.5)
>>> out = _augment(x, torch.Generator().manual_seed(0), "medium")
>>> tuple(out.shape), bool(((out >= 0) & (out <= 1)).all())
((4, 1, 16, 16), True)
"""

from __future__ import annotations

import math

import crslib  # noqa: F401  (applies the torchvision import fix before torch/timm)

#: Augmentation strengths: area and aspect of the crop, rotation (degrees), brightness, contrast, noise sigma.
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

