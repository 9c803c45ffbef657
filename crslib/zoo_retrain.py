"""Retraining the zoo anew and setting each retrained model beside the shipped one (``crs zoo --retrain``).

The zoo's weights ship with crslib (:mod:`crslib.models.zoo_shipped`);
:func:`retrain_zoo` trains the models of a preset again into the cache and
compares each with its shipped model: the probe margin over the initial
weights of both (difference with its patient-grouped interval, on the zoo
data's held-out images), and the mutual k-nearest-neighbour overlap
between the two models' embeddings of those images (1 for identical
neighbourhoods; chance is about ``k / (N - 1)``). Training is bit-for-bit
reproducible on one machine, torch version and thread count, so on the
machine that trained the shipped zoo the overlap is 1; on another CPU the
rounding differs and the retrained model is a new draw of the same recipe.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from crslib.agreement import mutual_knn_overlap
from crslib.config import preset_zoo_data
from crslib.data import load_data
from crslib.embed import embed_models
from crslib.errors import InputError
from crslib.models.zoo import train_zoo, zoo_specs
from crslib.models.zoo_presets import _preset_image_size
from crslib.models.zoo_shipped import shipped_cards

__all__ = ["RETRAIN_COLUMNS", "retrain_zoo"]

#: Columns of :func:`retrain_zoo`'s table.
RETRAIN_COLUMNS = ["name", "objective", "shipped_margin", "shipped_low", "shipped_high", "retrained_margin",
                   "retrained_low", "retrained_high", "retrained_learned", "overlap_with_shipped", "same_weights",
                   "wall_time_s", "key"]


def _select(names: Sequence[str], patterns: Sequence[str] | None) -> list[str]:
    if not patterns:
        return list(names)
    chosen = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    if not chosen:
        raise InputError(f"no zoo model matches {', '.join(patterns)}; the preset's models: {', '.join(names)}")
    return chosen


def retrain_zoo(preset: str = "default", *, models: Sequence[str] | None = None, data: str | None = None,
                k: int = 10, force: bool = False, scheduler: Any = None, device: str | None = None,
                progress: bool | None = None) -> pd.DataFrame:
    """Train a zoo preset's models anew and compare each with its shipped model.

    Parameters
    ----------
    preset : str
        The zoo preset (``quick``, ``default``, ``full``).
    models : sequence of str, optional
        Shell-style patterns of model names (``"contrastive-*"``); default all.
    data : str, optional
        The training data; default the preset's ``zoo_data``.
    k : int
        Neighbours of the overlap.
    force : bool
        Train even when the cache holds a retrained copy.
    scheduler, device, progress
        As in :func:`crslib.models.zoo.train_zoo`.

    Returns
    -------
    DataFrame
        :data:`RETRAIN_COLUMNS`, one row per model. ``retrained_learned`` is
        whether the retrained model's probe interval lies above 0 (NaN for a
        random-init model). The shipped columns are NaN where nothing is
        shipped under that name or it was trained on other data, and so is
        ``overlap_with_shipped`` (the held-out images' mutual kNN overlap,
        computed for trained models only). ``same_weights``: the retrained
        checkpoint's SHA-256 equals the shipped one.
    """
    data = data or preset_zoo_data(preset)
    specs = zoo_specs(preset)
    by_name = {s.name: s for s in specs}
    chosen = [by_name[n] for n in _select(list(by_name), models)]
    manifest = load_data(data)
    cards = train_zoo(manifest, specs=chosen, image_size=_preset_image_size(preset, None), force=force,
                      scheduler=scheduler, device=device, progress=progress)
    shipped = shipped_cards()
    held_out = manifest[manifest["split"].astype(str) != "train"].reset_index(drop=True)
    rows = []
    for card in cards.to_dict("records"):
        name = str(card["name"])
        ship = shipped.get(name)
        ship = ship if ship is not None and str(ship.get("zoo_data")) == str(data) else None
        margin = (ship or {}).get("probe") or {}
        overlap = np.nan
        if ship is not None and card["objective"] != "random_init" and len(held_out) > k:
            X = embed_models(held_out, {"shipped": f"zoo:{name}", "retrained": f"zoo:{name}@{card['key'][:16]}"},
                             progress=progress, device=device)
            overlap = mutual_knn_overlap(X["shipped"], X["retrained"], k=k)
        rows.append({"name": name, "objective": card["objective"],
                     "shipped_margin": margin.get("difference", np.nan), "shipped_low": margin.get("low", np.nan),
                     "shipped_high": margin.get("high", np.nan), "retrained_margin": card.get("probe_difference"),
                     "retrained_low": card.get("probe_low"), "retrained_high": card.get("probe_high"),
                     "retrained_learned": card.get("probe_learned"), "overlap_with_shipped": overlap,
                     "same_weights": ship is not None and ship.get("checkpoint_sha256") == card["checkpoint_sha256"],
                     "wall_time_s": card.get("wall_time_s"), "key": card["key"]})
    return pd.DataFrame(rows, columns=RETRAIN_COLUMNS)
