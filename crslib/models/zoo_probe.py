"""The zoo's known answer: did a trained model learn more than its own
random initialisation?

A zoo model is evidence about its *objective* only if training added
something. :func:`probe_zoo` embeds the zoo data's held-out images
(``split != "train"``: images no model trained on) with each trained model
and with the same network at its initial weights (the same architecture
and seed, before the first step), fits a linear probe on both
(:func:`crslib.probes.probe_margin`) and records on the model card the
probe AUROC, the paired difference to the initial weights and its
patient-grouped interval. A model whose interval does not clear 0 gets a
``flag`` on its card, which chapter 02 shows next to its objective.

What is probed is what the model was asked to learn: a supervised model
is probed on the labels it trained on (``labels_used`` on its card: every
finding for ``supervised_multilabel``, the one ``label`` for
``supervised_single``), a self-supervised model on every finding. A model
trained on one label learns that label and may give up the features of the
others (on the default phantom, ``supervised_single`` seed 2 gained +0.18
AUROC on its label and +0.04, interval below 0, on the mean over the eight
findings), so the mean over all findings would flag a model that learned
exactly what it was taught. The ``target`` column says which labels each
row was probed on.

The result is stored in ``card.json`` under ``probe`` with a digest of the
held-out images, the model's probe targets and their phrase, and recomputed
only when those change.

Examples
--------
>>> import tempfile
>>> import crslib
>>> from crslib.data.phantom import generate_phantom
>>> from crslib.models.zoo import ZooModelSpec, train_zoo
>>> manifest = generate_phantom(tempfile.mkdtemp(), n_patients=80, image_size=32, random_state=0)
>>> spec = ZooModelSpec.make("supervised_multilabel", epochs=1, batch_size=16)
>>> cards = train_zoo(manifest, specs=[spec], image_size=16, cache_root=tempfile.mkdtemp(), progress=False)
>>> table = probe_zoo(manifest, cards, n_resamples=100)
>>> table.columns.tolist()[:4], table["name"].tolist()
(['name', 'objective', 'architecture', 'seed'], ['supervised_multilabel-cnn_small-seed0'])
>>> bool(table.loc[0, "learned"]) == bool(table.loc[0, "low"] > 0)
True
>>> import json, pathlib
>>> card = json.loads((pathlib.Path(cards.loc[0, "path"]) / "card.json").read_text())
>>> card["probe"]["learned"] == bool(table.loc[0, "learned"]), card["probe"]["reference"]
(True, 'initial weights (seed 0)')
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import crslib  # noqa: F401  (applies the torchvision import fix before torch/timm)
from crslib import probes
from crslib._io import atomic_write_json, digest_of, file_sha256
from crslib.errors import DataError, InputError

__all__ = ["PROBE_COLUMNS", "probe_zoo"]

#: Columns of :func:`probe_zoo`'s table.
PROBE_COLUMNS = ["name", "objective", "architecture", "seed", "target", "auroc", "reference_auroc", "difference",
                 "low", "high", "learned", "flag", "n_test_patients"]
_PROBE_FORMAT = 2


def _held_out(manifest: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, str | None]:
    """Held-out rows, their probe targets, and why there is no probe (or None)."""
    if "split" not in manifest.columns or "patient_id" not in manifest.columns:
        return manifest.iloc[:0], pd.DataFrame(), "the manifest has no split or patient_id column"
    rows = manifest[manifest["split"].astype(str) != "train"].reset_index(drop=True)
    if rows["patient_id"].nunique() < 10:
        return rows, pd.DataFrame(), (f"{rows['patient_id'].nunique()} held-out patients (split != 'train'); "
                                      "the probe needs at least 10")
    targets, left_out = probes.probe_targets(rows)
    if targets.shape[1] == 0:
        return rows, targets, "no probe target on the held-out images: " + "; ".join(left_out.values())
    return rows, targets, None


def _model_targets(card: dict[str, Any], rows: pd.DataFrame, targets: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The probe targets of one model, and a phrase saying what they are.

    The labels a supervised model trained on (``labels_used``) that the
    held-out images can be probed on; every target when it trained on none,
    or on none of those. Models probed on the same columns get the same phrase.
    """
    used = [str(c) for c in card.get("labels_used") or []]
    findings = [c for c in rows.columns if str(c).startswith("finding_")]
    if used == ["label"] and "label" in rows.columns and len(card.get("classes") or []) == 2:
        own, _ = probes.probe_targets(rows[["label", "patient_id"]])
        if own.shape[1]:
            return own, f"its training label ({own.columns[0]})"
    own = targets[[c for c in targets.columns if c in used]]
    if 0 < own.shape[1] < targets.shape[1]:
        return own, f"its training labels ({own.shape[1]} of {len(used)} findings)"
    unprobed = own.shape[1] == 0 and used
    reason = f"; its training label{'s' if len(used) > 1 else ''} cannot be probed here" if unprobed else ""
    if not findings:
        return targets, "the manifest's label (" + ", ".join(map(str, targets.columns)) + ")" + reason
    if targets.shape[1] == len(findings):
        return targets, f"every finding ({len(findings)})" + reason
    return targets, f"the findings that can be probed ({targets.shape[1]} of {len(findings)})" + reason


def _embed(module, images, mean: float, std: float) -> np.ndarray:
    import torch

    module.eval()
    with torch.inference_mode():
        parts = [module((images[i:i + 256] - mean) / std) for i in range(0, len(images), 256)]
    return torch.cat(parts).double().numpy()


def _networks(card: dict[str, Any]):
    """The trained network of a card and the same network at its initial weights."""
    import torch
    from safetensors.torch import load_file

    from crslib.models._training import ZOO_THREADS, training_context
    from crslib.models.networks import build_encoder_module

    with training_context(ZOO_THREADS):
        torch.manual_seed(int(card["seed"]))  # as the trainer does before building the network
        initial = build_encoder_module(card["architecture"], card.get("init_weights", "random"))
    trained = build_encoder_module(card["architecture"])
    trained.load_state_dict(load_file(str(Path(card["path"]) / card.get("checkpoint", "encoder.safetensors"))))
    return trained, initial


def _reference(card: dict[str, Any]) -> str:
    """What the card's probe compares the trained model with."""
    if card.get("init_weights", "random") == "imagenet":
        return "initial weights (ImageNet)"
    return f"initial weights (seed {card['seed']})"


def _flag(margin: dict[str, Any]) -> str | None:
    if margin["learned"]:
        return None
    return (f"probe AUROC {margin['auroc']:.3f} vs {margin['reference_auroc']:.3f} at its initial weights: "
            f"difference {margin['difference']:+.3f} [{margin['low']:+.3f}, {margin['high']:+.3f}] does not clear 0, "
            "so it is no evidence about its objective")


def probe_zoo(manifest: pd.DataFrame, cards: pd.DataFrame, *, n_resamples: int = 1000, confidence: float = 0.95,
              random_state: int = 0, force: bool = False) -> pd.DataFrame:
    """Probe each zoo model against its own initial weights and record it on its card.

    Parameters
    ----------
    manifest : DataFrame
        The data the zoo was trained on; its held-out rows (``split !=
        "train"``, with ``patient_id`` and ``finding_*`` or a two-class
        ``label``) are probed.
    cards : DataFrame
        Model cards with ``path`` (from :func:`~crslib.models.zoo.train_zoo`
        or :func:`~crslib.models.zoo.list_zoo`).
    n_resamples, confidence : int, float
        The patient-grouped bootstrap of the difference.
    random_state : int
        The probe's split and the bootstrap.
    force : bool
        Recompute even when the card holds a probe of the same data.

    Returns
    -------
    DataFrame
        :data:`PROBE_COLUMNS`, one row per trained model (``random_init``
        models are their own reference and get no row). ``target`` says
        what each model was probed on (the module docstring says how it is
        chosen); ``flag`` says why a model whose interval does not clear 0
        is no evidence about its objective. Empty with an
        ``attrs["skipped"]`` reason when the manifest has nothing to probe.
    """
    import torch

    from crslib.data import read_image
    from crslib.models.encoders import Preprocessing

    if not isinstance(cards, pd.DataFrame) or "path" not in cards.columns:
        raise InputError("cards must be the DataFrame of train_zoo or list_zoo (with a path column)")
    table = pd.DataFrame(columns=PROBE_COLUMNS)
    rows, targets, skipped = _held_out(manifest)
    if skipped:
        table.attrs["skipped"] = skipped
        return table
    hashes = []
    for path in rows["path"].astype(str):
        try:
            hashes.append(file_sha256(path))
        except OSError as exc:
            raise DataError(f"cannot read held-out image {path}: {exc}") from None
    groups = rows["patient_id"].astype(str).to_numpy()
    out, images = [], {}
    for _, row in cards.iterrows():
        if row["objective"] == "random_init":
            continue
        folder = Path(row["path"])
        card = json.loads((folder / "card.json").read_text(encoding="utf-8"))
        card["path"] = str(folder)
        size, pre = int(card["image_size"]), card["preprocessing"]
        model_targets, target = _model_targets(card, rows, targets)
        key = digest_of(["crslib-zoo-probe", _PROBE_FORMAT, size, hashes, groups.tolist(), target,
                         model_targets.columns.tolist(), model_targets.fillna(-1).to_numpy().tolist(), n_resamples,
                         confidence, random_state])
        margin = card.get("probe")
        if force or not isinstance(margin, dict) or margin.get("key") != key:
            if size not in images:
                reader = Preprocessing((1, size, size), (0.0,), (1.0,), "bilinear", 1)
                images[size] = reader.apply_batch([read_image(p) for p in rows["path"]]).clamp_(0.0, 1.0)
            trained, initial = _networks(card)
            with torch.random.fork_rng(devices=[]):
                X, X0 = (_embed(m, images[size], float(pre["mean"][0]), float(pre["std"][0]))
                         for m in (trained, initial))
            result = probes.probe_margin(X, X0, model_targets, groups=groups, n_resamples=n_resamples,
                                         confidence=confidence, random_state=random_state)
            margin = result.to_dict() | {"key": key, "reference": _reference(card), "target": target,
                                         "data": "held-out images (split != 'train')"}
            card["probe"], card["flag"] = margin, _flag(margin)
            atomic_write_json(folder / "card.json", {k: v for k, v in card.items() if k != "path"})
        measured = ("target", "auroc", "reference_auroc", "difference", "low", "high", "learned")
        out.append({"name": card["name"], "objective": card["objective"], "architecture": card["architecture"],
                    "seed": int(card["seed"]), **{c: margin[c] for c in measured},
                    "flag": _flag(margin), "n_test_patients": margin["n_test_patients"]})
    if out:
        table = pd.DataFrame(out, columns=PROBE_COLUMNS)
    return table
