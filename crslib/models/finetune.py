"""Fine-tuning a whole encoder with a linear head (the "fine-tuned" policy of
study 2).

:func:`finetune_classifier` runs four named steps: check the manifest and
derive the 0/1 labels (:func:`_finetune_labels`), key the result by content
(:func:`_finetune_key`) and reuse a cached copy (:func:`_cached_probs`), else
train and predict (:func:`_train_and_predict`, its epochs in
:func:`_finetune_epochs`) and write the result. Training shares the zoo's
deterministic context and schedule (:mod:`crslib.models._training`); the
encoder comes from any torch-backed model spec (:func:`crslib.models.load_encoder`).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import crslib  # noqa: F401  (applies the torchvision import fix before torch/timm)
from crslib._io import atomic_write_json, atomic_write_text, digest_of, file_sha256
from crslib.config import cache_dir, progress_enabled
from crslib.device import resolve_device
from crslib.errors import DataError, InputError, ModelError
from crslib.models._training import ZOO_THREADS, set_lr, training_context, warmup_cosine_lr
from crslib.models.encoders import TorchEncoder
from crslib.models.specs import load_encoder
from crslib.models.zoo_shipped import cpu_model

log = logging.getLogger(__name__)

__all__ = ["FINETUNE_FORMAT", "SHIPPED_FINETUNE_DIR", "finetune_classifier"]

#: Bumped when a change of the fine-tuning code changes the predictions it produces.
FINETUNE_FORMAT = 1
# Shipped fine-tuning results of the recorded runs of the quick and default books (same key, same files as
# the cache's ``finetune/`` folder): the book's fine-tuned backbones are read from here, not trained.
# (A plain comment, not a doc comment: the API page would show this machine's path.)
SHIPPED_FINETUNE_DIR = Path(__file__).resolve().parent / "finetune_results"


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
    label_column: str = "label",
    train_split: str = "train",
    epochs: int = 5,
    random_state: int = 0,
    lr: float = 1e-3,
    head_lr_mult: float = 10.0,
    weight_decay: float = 1e-4,
    batch_size: int = 64,
    cache_root: str | os.PathLike | None = None,
    progress: bool | None = None,
    device: str | None = None,
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
    The results of the book's own fine-tunings ship in
    :data:`SHIPPED_FINETUNE_DIR` under the same keys, so the quick and
    default books read them instead of training; any other backbone, data
    or schedule is trained here (``attrs["source"]``: ``"shipped"``,
    ``"cache"`` or ``"trained"``).

    Parameters
    ----------
    manifest : DataFrame
        With ``image_id``, ``path``, ``split`` and the ``label`` column (two
        classes; the sorted second one is the positive class).
    spec : str
        Any torch-backed model spec (``zoo:``, ``timm:``, ``public:efficientnet_lite0``).
    label_column : str
        The label column.
    train_split : str
        Rows trained on.
    epochs, random_state, lr, head_lr_mult, weight_decay, batch_size
        The schedule (``random_state`` seeds the head and the batch order).
    cache_root : path, optional
        Default ``<crslib cache>``.
    progress : bool, optional
        A tqdm bar per epoch (default: when stderr is a terminal).
    device : {"auto", "cpu", "cuda", "mps"}, optional
        Where to train (:func:`crslib.device.resolve_device`); ``None``: the
        CPU. Not part of the cache key: on the CPU the probabilities are
        bit-for-bit those of a run without it; on a GPU they differ by
        rounding, amplified by training (``bench/bench_device.py``: after
        3 epochs of a ResNet-18 on 1,001 phantom images, up to 0.15 on an
        NVIDIA H200, test AUROC 0.804 against the CPU's 0.813), and a
        cached result from either device is reused.

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
    >>> from crslib.data.phantom import generate_phantom
    >>> m = generate_phantom(tempfile.mkdtemp(), n_patients=8, image_size=32, random_state=0)
    >>> out = finetune_classifier(m, "timm:test_resnet?size=32", epochs=1, cache_root=tempfile.mkdtemp(),
    ...                           progress=False)
    >>> out.columns.tolist(), len(out) == len(m), out["prob"].dtype
    (['image_id', 'split', 'y_true', 'prob'], True, dtype('float64'))
    >>> bool(out["prob"].between(0, 1).all()), out["y_true"].tolist() == m["label"].tolist()
    (True, True)
    """
    from crslib.data import read_image

    train_mask, y_train, y_all = _finetune_labels(manifest, label_column, train_split, epochs, batch_size)
    dev = "cpu" if device is None else resolve_device(device)
    encoder = load_encoder(spec)
    if not isinstance(encoder, TorchEncoder):
        raise ModelError(
            f"cannot fine-tune {spec!r}: it is a {encoder.backend} model; only torch models (zoo:, timm:, "
            "public:efficientnet_lite0) can be fine-tuned, use the frozen policy for it"
        )
    # "seed" names the random_state in the cache key, as it always has (keys stay stable)
    hparams = {"epochs": int(epochs), "seed": int(random_state), "lr": float(lr), "head_lr_mult": float(head_lr_mult),
               "weight_decay": float(weight_decay), "batch_size": int(batch_size), "train_split": train_split}
    key = _finetune_key(encoder, manifest, y_all, hparams)
    root = Path(cache_root) if cache_root is not None else cache_dir()
    out_path = root / "finetune" / f"{key[:32]}.csv"
    card_path = out_path.with_suffix(".json")
    info = {"spec": spec, "key": key, "hparams": hparams}

    shipped_path = SHIPPED_FINETUNE_DIR / out_path.name
    for where, csv_path in (("cache", out_path), ("shipped", shipped_path)):
        cached = _cached_probs(csv_path, csv_path.with_suffix(".json"), manifest, key, quiet=where == "shipped")
        if cached is not None:
            probs, seconds, final_loss = cached
            frame = _finetune_frame(manifest, y_all, probs, info, hit=True, seconds=seconds, final_loss=final_loss)
            frame.attrs["source"] = where
            return frame

    show = progress_enabled(progress)
    t0 = time.perf_counter()
    log.info("fine-tuning %s: %d training images, %d epochs (no shipped or cached result for these inputs)", spec,
             int(train_mask.sum()), int(epochs))
    images = [read_image(p) for p in manifest["path"].astype(str)]
    x_all = encoder.preprocess_batch(images).float()
    probs_np, final_loss = _train_and_predict(
        encoder, x_all, train_mask, y_train, spec=spec, epochs=int(epochs), seed=int(random_state), lr=float(lr),
        head_lr_mult=float(head_lr_mult), weight_decay=float(weight_decay), batch_size=int(batch_size), show=show,
        device=dev,
    )
    seconds = time.perf_counter() - t0
    frame = _finetune_frame(manifest, y_all, probs_np, info, hit=False, seconds=seconds, final_loss=final_loss)
    atomic_write_text(out_path, frame.to_csv(index=False, float_format="%.17g"))
    atomic_write_json(card_path, {"key": key, "spec": spec, "hparams": hparams, "seconds": seconds,
                                  "final_loss": final_loss, "encoder_fingerprint": encoder.fingerprint(),
                                  "trained_cpu": cpu_model(), "device": dev})
    frame.attrs["source"] = "trained"
    return frame


def _finetune_labels(manifest: pd.DataFrame, label: str, train_split: str, epochs: int,
                     batch_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Check the manifest and the schedule; return the training-row mask, the
    training rows' 0/1 labels and every row's 0/1 label (positive: the
    second of the training rows' two sorted classes)."""
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
    return train_mask, y_train, y_all


def _finetune_key(encoder: TorchEncoder, manifest: pd.DataFrame, y_all: np.ndarray, hparams: dict[str, Any]) -> str:
    """Cache key: the encoder's fingerprint, every image's content hash,
    split and label, the hyperparameters, thread count and torch version."""
    import torch

    hashes = [file_sha256(p) for p in manifest["path"].astype(str)]
    return digest_of(["crslib-finetune", FINETUNE_FORMAT, encoder.fingerprint(), hashes,
                      manifest["split"].astype(str).tolist(), y_all.tolist(), hparams, ZOO_THREADS,
                      torch.__version__])


def _finetune_frame(manifest: pd.DataFrame, y_all: np.ndarray, probs: np.ndarray, info: dict[str, Any], *,
                    hit: bool, seconds: float, final_loss: float | None) -> pd.DataFrame:
    """The result table, with ``spec``, ``seconds``, ``cache_hit``,
    ``final_loss``, ``key`` and ``hparams`` in its ``attrs``."""
    frame = pd.DataFrame({"image_id": manifest["image_id"].astype(str).to_numpy(),
                          "split": manifest["split"].astype(str).to_numpy(),
                          "y_true": y_all.astype(int), "prob": probs.astype(np.float64)})
    frame.attrs.update({"spec": info["spec"], "seconds": seconds, "cache_hit": hit, "final_loss": final_loss,
                        "key": info["key"], "hparams": info["hparams"]})
    return frame


def _cached_probs(out_path: Path, card_path: Path, manifest: pd.DataFrame, key: str, *,
                  quiet: bool = False) -> tuple[np.ndarray, float, float | None] | None:
    """``(probs, seconds, final_loss)`` of a cached result for this key and
    these rows, else None (a stale or unreadable cache is logged unless ``quiet``)."""
    if not (out_path.is_file() and card_path.is_file()):
        return None
    try:
        cached = pd.read_csv(out_path)
        card = json.loads(card_path.read_text(encoding="utf-8"))
        if cached["image_id"].astype(str).tolist() == manifest["image_id"].astype(str).tolist() \
                and card.get("key") == key and np.isfinite(cached["prob"]).all():
            return cached["prob"].to_numpy(), float(card.get("seconds", 0.0)), card.get("final_loss")
    except (OSError, ValueError, KeyError):
        pass
    if not quiet:
        log.warning("fine-tuning cache %s is unreadable or stale; recomputing", out_path)
    return None


def _train_and_predict(encoder: TorchEncoder, x_all, train_mask: np.ndarray, y_train: np.ndarray, *, spec: str,
                       epochs: int, seed: int, lr: float, head_lr_mult: float, weight_decay: float,
                       batch_size: int, show: bool, device: str = "cpu") -> tuple[np.ndarray, float | None]:
    """Fine-tune a copy of the encoder's module with a one-output linear head
    on the training rows, deterministically, on ``device``; return every
    row's probability (float64) and the last epoch's mean loss. The head is
    initialised on the CPU (same numbers on every device), then moved."""
    import torch

    from crslib.device import deterministic_gpu_setup

    deterministic_gpu_setup(device)
    x_train = x_all[torch.from_numpy(train_mask.copy())].to(device)
    t_train = torch.from_numpy(y_train).to(device)
    with training_context(ZOO_THREADS):
        torch.manual_seed(seed)
        backbone = copy.deepcopy(encoder.module).to(device)
        dim = encoder.embedding_dim
        head = torch.nn.Linear(dim, 1).to(device)

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
             {"params": list(head.parameters()), "lr_mult": head_lr_mult}],
            lr=lr, weight_decay=weight_decay,
        )
        backbone.train()
        head.train()
        final_loss = _finetune_epochs(logits, opt, x_train, t_train, spec=spec, epochs=epochs, seed=seed, lr=lr,
                                      batch_size=batch_size, show=show)
        backbone.eval()
        head.eval()
        with torch.inference_mode():
            probs = torch.cat([torch.sigmoid(logits(x_all[i:i + 256].to(device))).cpu()
                               for i in range(0, x_all.shape[0], 256)])
    return probs.double().numpy(), final_loss


def _finetune_epochs(logits, opt, x_train, t_train, *, spec: str, epochs: int, seed: int, lr: float,
                     batch_size: int, show: bool) -> float | None:
    """The training epochs: seeded batch order, a one-epoch linear warm-up
    then a cosine schedule, binary cross-entropy; returns the last epoch's
    mean loss."""
    import torch
    from tqdm import tqdm

    gen = torch.Generator().manual_seed(seed)
    n = x_train.shape[0]
    batch = min(batch_size, n)
    n_batches = max(1, n // batch)
    total = n_batches * epochs
    warmup = n_batches
    loss_fn = torch.nn.BCEWithLogitsLoss()
    step, final_loss = 0, None
    # one bar tick per step, so the bar's estimate of the time left is live from the first step on
    bar = tqdm(total=total, desc=f"fine-tune {spec}", unit="step", disable=not show, leave=False)
    t0 = time.perf_counter()
    for _epoch in range(epochs):
        order = torch.randperm(n, generator=gen)
        losses = []
        for b in range(n_batches):
            idx = order[b * batch:(b + 1) * batch]
            set_lr(opt, warmup_cosine_lr(lr, step, warmup=warmup, total=total))
            loss = loss_fn(logits(x_train[idx]), t_train[idx])
            if not torch.isfinite(loss):
                raise ModelError(f"fine-tuning {spec} diverged (loss {float(loss)} at step {step}); lower lr")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            bar.update(1)
            if step == 1:
                log.info("fine-tuning %s: %d steps, about %.0f s from the first step's time", spec, total,
                         total * (time.perf_counter() - t0))
            losses.append(float(loss.detach()))
        final_loss = float(np.mean(losses))
    bar.close()
    return final_loss
