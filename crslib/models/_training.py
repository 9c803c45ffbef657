"""What the training code of crslib.models shares: the deterministic training
context, the learning-rate schedule and the EMA teacher update.

Both the zoo (:mod:`crslib.models.trainer`) and fine-tuning
(:mod:`crslib.models.finetune`) train under :func:`training_context` with
:data:`ZOO_THREADS` threads and follow :func:`warmup_cosine_lr`; the two
self-distillation objectives (BYOL, DINO in :mod:`crslib.models.objectives`)
move their teacher with :func:`ema_update`. torch is imported inside the
functions.

Examples
--------
>>> [round(warmup_cosine_lr(1.0, step, warmup=2, total=6), 3) for step in range(6)]
[0.5, 1.0, 1.0, 0.854, 0.5, 0.146]
>>> ema_tau(0.99, 0.0), ema_tau(0.99, 1.0)
(0.99, 1.0)
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator
from typing import Any

import crslib  # noqa: F401  (applies the torchvision import fix before torch/timm)

#: torch threads used while training (bitwise reproducibility holds per thread count).
ZOO_THREADS = 2


@contextlib.contextmanager
def training_context(threads: int) -> Iterator[None]:
    """Train deterministically: ``threads`` torch threads,
    ``torch.use_deterministic_algorithms(True)``, and the caller's global RNG
    state restored afterwards; the previous settings come back on exit."""
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


def warmup_cosine_lr(base_lr: float, step: int, *, warmup: int, total: int) -> float:
    """Learning rate at ``step`` (0-based): a linear warm-up over ``warmup``
    steps to ``base_lr``, then a cosine decay over the remaining
    ``total - warmup`` steps."""
    return base_lr * (
        (step + 1) / warmup if step < warmup
        else 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))
    )


def set_lr(optimizer: Any, lr: float) -> None:
    """Set every parameter group's learning rate to ``lr`` times its ``lr_mult``."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group["lr_mult"]


def ema_tau(momentum: float, frac: float) -> float:
    """EMA teacher momentum at training progress ``frac`` in ``[0, 1]``: from
    ``momentum`` up to 1 on a cosine schedule (BYOL)."""
    return 1 - (1 - momentum) * (math.cos(math.pi * frac) + 1) / 2


def ema_update(pairs: Iterable[tuple[Any, Any]], tau: float) -> None:
    """Move each teacher module towards its online module: parameters
    ``teacher = tau * teacher + (1 - tau) * online``; buffers (BatchNorm
    statistics) copied. ``pairs`` holds ``(online, teacher)`` modules of the
    same structure."""
    import torch

    with torch.no_grad():
        for online, target in pairs:
            for po, pt in zip(online.parameters(), target.parameters()):
                pt.mul_(tau).add_(po.detach(), alpha=1 - tau)
            for bo, bt in zip(online.buffers(), target.buffers()):
                bt.copy_(bo)
