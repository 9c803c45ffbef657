"""The zoo's networks: the encoder CNN at two widths, and the heads and MLPs
the training objectives put on top of it.

torch is imported inside the functions, so importing this module (and
:mod:`crslib.models`) stays fast.

Examples
--------
>>> import crslib, torch
>>> net = build_encoder_module("cnn_wide")
>>> net.embedding_dim, net.stride
(256, 16)
>>> _mlp(8, 16, 4)(torch.zeros(2, 8)).shape
torch.Size([2, 4])
"""

from __future__ import annotations

from typing import Any

import crslib  # noqa: F401  (applies the torchvision import fix before torch/timm)
from crslib.errors import ModelError

__all__ = ["ARCHITECTURES", "build_encoder_module"]

#: Architectures: a stride-16 CNN at two widths (the one "size" factor).
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "cnn_small": {"family": "cnn", "width": 16, "in_chans": 1},
    "cnn_wide": {"family": "cnn", "width": 32, "in_chans": 1},
}


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
