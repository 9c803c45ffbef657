"""The shipped zoo: the trained default zoo that lives in the repository, its cards, and its hash check.

The default zoo is trained once, by ``crs zoo --retrain --preset default``
on the default phantom, and its weights ship in
``crslib/models/zoo_weights/<name>/`` (``encoder.safetensors``, the trained
float32 state dict, and ``card.json``, its model card). A ``zoo:NAME`` spec
loads them without training; the card's ``checkpoint_sha256`` is checked
first, so a file that changed by one byte is refused with one line naming
the file, the expected hash and ``crs zoo --retrain`` as the way out.

Random-init models are not shipped: they are built from their seed (their
card keeps the SHA-256 of the state that build gives, and loading checks it).

A card of the shipped zoo records, besides the fields of every zoo card
(spec, recipe, training-data hash, probe margin over the initial weights
with its interval, effective rank), ``weights`` (``"shipped"``),
``zoo_data`` (the data spec it trained on), ``trained_commit`` (the commit
whose code trained it) and ``trained_cpu`` (the processor).

Examples
--------
>>> cards = shipped_cards()
>>> sorted(cards)[:1]
['autoencoder-cnn_small-seed0']
>>> all(card["weights"] == "shipped" for card in cards.values())
True
"""

from __future__ import annotations

import json
import platform
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from crslib._io import atomic_write_json, file_sha256
from crslib.errors import ModelError

__all__ = ["SHIPPED_DIR", "cpu_model", "shipped_card", "shipped_cards", "shipped_match", "ship_model",
           "verify_checkpoint"]

# where the shipped zoo lives (one folder per model); a plain comment: the value is this machine's path
SHIPPED_DIR = Path(__file__).resolve().parent / "zoo_weights"
_CARD = "card.json"


def shipped_cards(folder: str | Path | None = None) -> dict[str, dict[str, Any]]:
    """Name -> card of every shipped zoo model, each with its ``path`` (the model's folder)."""
    root = Path(folder) if folder is not None else SHIPPED_DIR
    out: dict[str, dict[str, Any]] = {}
    for card_path in sorted(root.glob(f"*/{_CARD}")) if root.is_dir() else []:
        try:
            card = json.loads(card_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ModelError(f"shipped zoo card {card_path} is unreadable ({exc}); restore it from git") from None
        card["path"] = str(card_path.parent)
        out[str(card["name"])] = card
    return out


def shipped_card(name: str, folder: str | Path | None = None) -> dict[str, Any] | None:
    """The card of one shipped model, or None when ``name`` is not shipped."""
    return shipped_cards(folder).get(name)


def shipped_match(spec: Mapping[str, Any], zoo_data: str, image_size: int,
                  folder: str | Path | None = None) -> dict[str, Any] | None:
    """The shipped card of the model a preset would train, or None.

    A shipped model stands for a spec only when it was trained from the same
    spec (:meth:`~crslib.models.zoo_presets.ZooModelSpec.to_dict`), on the same
    data spec and at the same image size; any other zoo is trained here.
    """
    card = shipped_card(str(spec.get("name")), folder)
    if card is None:
        return None
    same = (card.get("spec") == dict(spec) and str(card.get("zoo_data")) == str(zoo_data)
            and int(card.get("image_size", -1)) == int(image_size))
    return card if same else None


def verify_checkpoint(path: str | Path, card: Mapping[str, Any]) -> str:
    """Check a checkpoint's SHA-256 against its card; return the hash.

    Raises
    ------
    ModelError
        One line naming the file, the expected hash and the way out.
    """
    path = Path(path)
    expected = str(card.get("checkpoint_sha256"))
    try:
        sha = file_sha256(path)
    except OSError as exc:
        raise ModelError(f"zoo weights {path} of {card.get('name')!r} cannot be read ({exc.strerror}); restore the "
                         f"file from git or retrain with `crs zoo --retrain --models {card.get('name')}`") from None
    if sha != expected:
        raise ModelError(f"zoo weights {path} do not match their card: SHA-256 {sha}, expected {expected}; restore "
                         f"the file from git or retrain with `crs zoo --retrain --models {card.get('name')}`")
    return sha


def cpu_model() -> str:
    """The processor's model name (``/proc/cpuinfo`` on Linux, else :func:`platform.processor`).

    Examples
    --------
    >>> isinstance(cpu_model(), str) and len(cpu_model()) > 0
    True
    """
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def ship_model(card: Mapping[str, Any], *, zoo_data: str, commit: str | None,
               folder: str | Path | None = None) -> Path:
    """Copy one trained model from the zoo cache into the shipped zoo.

    Parameters
    ----------
    card : mapping
        A card of :func:`~crslib.models.zoo.train_zoo` (with ``path``; its
        probe recorded on ``card.json``).
    zoo_data : str
        The data spec it was trained on.
    commit : str or None
        The commit whose code trained it.
    folder : path, optional
        Default :data:`SHIPPED_DIR`.

    Returns
    -------
    Path
        The model's shipped folder.
    """
    source = Path(card["path"])
    on_disk = json.loads((source / _CARD).read_text(encoding="utf-8"))
    checkpoint = source / on_disk.get("checkpoint", "encoder.safetensors")
    verify_checkpoint(checkpoint, on_disk)
    from_seed = on_disk.get("objective") == "random_init"
    if not from_seed and not isinstance(on_disk.get("probe"), dict):
        raise ModelError(f"zoo model {on_disk['name']!r} has no probe on its card; train it with probe=True first")
    dest = (Path(folder) if folder is not None else SHIPPED_DIR) / str(on_disk["name"])
    dest.mkdir(parents=True, exist_ok=True)
    if not from_seed:  # a random-init model is built from its seed; its card keeps the hash to check that build
        shutil.copyfile(checkpoint, dest / checkpoint.name)
    shipped = {k: v for k, v in on_disk.items() if k not in ("path", "reused")}
    shipped["built_from_seed"] = from_seed
    shipped.update({"weights": "shipped", "zoo_data": str(zoo_data), "trained_commit": commit,
                    "trained_cpu": on_disk.get("trained_cpu") or cpu_model()})
    atomic_write_json(dest / _CARD, shipped)
    return dest
