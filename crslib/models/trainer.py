"""Training one zoo model: the training pool and the seeded training loop.

:func:`_load_pool` reads the manifest's training images (``split ==
"train"``) once into a tensor ordered by content hash, :func:`_labels_for`
gives the labels an objective learns from, :func:`_data_hash` the digest of
both that keys the zoo's cache. :func:`_train_one` trains one
:class:`~crslib.models.zoo.ZooModelSpec` on the pool, deterministically
(:func:`~crslib.models._training.training_context`): the same spec and data
give bit-for-bit the same weights on the same machine, torch version and
thread count. :mod:`crslib.models.zoo` caches what it returns and writes the
model card.

Examples
--------
>>> import tempfile
>>> import crslib
>>> from crslib.data.phantom import generate_phantom
>>> from crslib.models.zoo import ZooModelSpec
>>> manifest = generate_phantom(tempfile.mkdtemp(), n_patients=8, image_size=32, random_state=0)
>>> pool = _load_pool(manifest, 16, False)
>>> tuple(pool.images.shape), len(pool.hashes)
((15, 1, 16, 16), 15)
>>> columns, labels, classes = _labels_for("supervised_single", pool.rows)
>>> columns, classes
(['label'], [0, 1])
>>> state, result = _train_one(ZooModelSpec.make("supervised_single", epochs=1, batch_size=8), pool, labels, 2,
...                            False)
>>> result["steps"], len(result["loss_curve"])
(1, 1)
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

import crslib  # noqa: F401  (applies the torchvision import fix before torch/timm)
from crslib._io import digest_of, file_sha256
from crslib.errors import DataError, InputError, ModelError
from crslib.models._training import ZOO_THREADS, set_lr, training_context, warmup_cosine_lr
from crslib.models.networks import build_encoder_module


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
    from crslib.models.encoders import Preprocessing

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


def _patient_half(pool: _Pool, half: int) -> _Pool:
    """The rows of one of two disjoint patient halves of the pool (normalisation kept from the whole pool,
    so that the two halves' models see their inputs on one scale)."""
    import torch

    from crslib.splits import grouped_partition

    if "patient_id" not in pool.rows.columns:
        raise DataError("training on a patient half needs a patient_id column in the manifest")
    try:
        rows = grouped_partition(pool.rows["patient_id"].astype(str).to_numpy(), (0.5, 0.5), random_state=0)[half]
    except InputError as exc:
        raise DataError(f"cannot halve the training patients: {exc}") from None
    return _Pool(pool.images[torch.as_tensor(rows)], pool.rows.iloc[rows].reset_index(drop=True),
                 [pool.hashes[i] for i in rows], pool.image_size, pool.mean, pool.std)


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



def _train_one(spec: crslib.models.zoo.ZooModelSpec, pool: _Pool, labels: np.ndarray | None, n_outputs: int,
               show: bool, device: str = "cpu") -> tuple[dict[str, Any], dict[str, Any]]:
    """Train one model on ``device`` (a resolved device string); returns
    (encoder state dict on the CPU, card fields).

    Everything random (initialisation, batch order, augmentation) is drawn on
    the CPU from the same seeded generators whatever the device, and only
    the normalised views enter the device, so on the CPU the weights are
    bit-for-bit those of a run without ``device``; on a GPU they differ by
    floating-point rounding (other kernels), which training can amplify.
    """
    import torch
    from tqdm import tqdm

    from crslib.device import deterministic_gpu_setup
    from crslib.models.objectives import _build_objective  # imports torch: only when training

    hp = spec.resolved_hparams()
    t0 = time.perf_counter()
    c0 = time.process_time()
    deterministic_gpu_setup(device)
    with training_context(ZOO_THREADS):
        torch.manual_seed(spec.seed)
        encoder = build_encoder_module(spec.architecture, spec.init)
        if spec.objective == "random_init":
            state = {k: v.detach().clone() for k, v in encoder.state_dict().items()}
            spread, rank = _embedding_spread(encoder.to(device), pool)
            return state, {"initial_loss": None, "final_loss": None, "loss_curve": [], "steps": 0,
                           "wall_time_s": time.perf_counter() - t0, "cpu_time_s": time.process_time() - c0,
                           "embedding_spread": spread, "embedding_effective_rank": rank}
        model = _build_objective(spec, encoder, n_outputs, pool.image_size).to(device)
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

        def norm(x):  # the objectives normalise right before the encoder: the views enter the device here
            return ((x - mean) / std).to(device)

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
                y = None if y_all is None else y_all[idx].to(device)
                set_lr(opt, warmup_cosine_lr(float(hp["lr"]), step, warmup=warmup, total=total))
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
        state = {k: v.detach().cpu().clone().contiguous() for k, v in encoder.state_dict().items()}
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
    device = next(encoder.parameters()).device
    with torch.inference_mode():
        parts = [encoder(((pool.images[i:i + 256] - pool.mean) / pool.std).to(device)).cpu()
                 for i in range(0, len(pool.images), 256)]
        z = torch.cat(parts).double()
    total = float(z.var(dim=0, unbiased=False).sum())
    power = float((z * z).sum(dim=1).mean())
    spread = math.sqrt(total / power) if power > 0 else 0.0
    eig = torch.linalg.eigvalsh(torch.cov(z.t())).clamp(min=0) if z.shape[0] > 1 else torch.zeros(1)
    p = eig / eig.sum() if float(eig.sum()) > 0 else eig
    rank = float(torch.exp(-(p[p > 0] * p[p > 0].log()).sum())) if float(eig.sum()) > 0 else 0.0
    return round(spread, 6), round(rank, 3)

