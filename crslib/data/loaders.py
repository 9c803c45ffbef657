"""Loaders: everything a user can pass as ``--data``, turned into a manifest.

- :func:`~crslib.data.manifest.read_manifest`: CSV or Parquet manifest files;
- :func:`load_image_folder`: ``root/{train,val,test}/{CLASS}/*`` (incl. the
  Kermany ``chest_xray`` layout, patient ids from
  :func:`~crslib.data.kermany.kermany_patient_id`), ``root/{CLASS}/*`` or a
  plain folder;
- :func:`load_medmnist`: a MedMNIST-format ``.npz`` file, materialised as PNGs;
- :func:`load_dicom_folder`: a folder of DICOM files (headers only);
- :func:`load_data`: the dispatcher behind every ``--data`` flag and notebook
  ``data`` parameter, including the ``"phantom?..."`` spec strings
  (:data:`PHANTOM_DEFAULTS`), which generate the phantom once into the cache.

Every loader returns a validated manifest
(:func:`~crslib.data.manifest.validate_manifest`); files it skipped are listed
in ``attrs["ignored_files"]``.
"""

from __future__ import annotations

import io
import json
import logging
import os
import urllib.parse
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from crslib._io import atomic_write_bytes, atomic_write_json, digest_of, file_sha256
from crslib.config import cache_dir, progress_enabled
from crslib.data.images import IMAGE_SUFFIXES, _has_dicom_magic, _header_text, is_dicom_file, is_image_file
from crslib.data.kermany import _kermany_id, _kermany_scope, kermany_patient_id
from crslib.data.manifest import read_manifest, validate_manifest, write_manifest
from crslib.errors import DataError

logger = logging.getLogger(__name__)

__all__ = [
    "PHANTOM_DEFAULTS",
    "is_phantom_spec",
    "kermany_patient_id",
    "load_data",
    "load_dicom_folder",
    "load_image_folder",
    "load_medmnist",
    "phantom_parameters",
]

#: Keys of a ``"phantom?..."`` spec and their defaults.
PHANTOM_DEFAULTS: dict[str, Any] = {
    "patients": 300,
    "size": 64,
    "seed": 0,
    "shortcut": 0.0,
    "shift": 0.0,
    "kermany": False,
}

_SPLITS = ("train", "val", "test")
_MANIFEST_NAMES = ("manifest.csv", "manifest.parquet")
_PHANTOM_MARKER = ".crs-phantom-complete.json"
_MEDMNIST_MARKER = ".crs-medmnist.json"


# --------------------------------------------------------------------------- files of a folder


def _is_hidden(name: str) -> bool:
    return name.startswith(".") or name == "__MACOSX"


def _walk_files(root: Path) -> list[Path]:
    """All non-hidden files under ``root``, recursively, in sorted order."""
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not _is_hidden(d))
        for name in sorted(filenames):
            if not _is_hidden(name):
                found.append(Path(dirpath) / name)
    return found


def _record_ignored(df: pd.DataFrame, ignored: list[str], root: Path) -> None:
    df.attrs["ignored_files"] = list(ignored)
    if ignored:
        shown = ", ".join(ignored[:5]) + (f" and {len(ignored) - 5} more" if len(ignored) > 5 else "")
        logger.warning("ignored %d file(s) under %s that are not images: %s", len(ignored), root, shown)


def _image_ids(rel_paths: list[str]) -> list[str]:
    """Relative posix paths without suffix; the full relative path where two
    files differ only by suffix."""
    stems = [p.rsplit(".", 1)[0] if "." in Path(p).name else p for p in rel_paths]
    counts: dict[str, int] = {}
    for stem in stems:
        counts[stem] = counts.get(stem, 0) + 1
    return [rel if counts[stem] > 1 else stem for stem, rel in zip(stems, rel_paths)]



# --------------------------------------------------------------------------- image folders


def _split_dirs(root: Path) -> dict[str, Path]:
    found: dict[str, Path] = {}
    try:
        children = sorted(p for p in root.iterdir() if p.is_dir() and not _is_hidden(p.name))
    except OSError:
        return found
    for child in children:
        name = child.name.lower()
        if name in _SPLITS and name not in found:
            found[name] = child
    return found


def _kermany_root(root: Path) -> Path:
    """Descend through ``chest_xray/`` folders (the Kaggle archive nests two)
    until a folder with split subfolders is found."""
    current = root
    for _ in range(3):
        if _split_dirs(current):
            return current
        nested = [p for p in current.iterdir() if p.is_dir() and p.name.lower() == "chest_xray"]
        if not nested:
            return current
        current = nested[0]
    return current


def load_image_folder(root: str | os.PathLike) -> pd.DataFrame:
    """Build a manifest from a folder of images.

    Three layouts are recognised:

    1. ``root/{train,val,test}/{CLASS}/*`` (split names case-insensitive),
       including Kermany's ``chest_xray/{train,val,test}/{NORMAL,PNEUMONIA}``
       (``root`` may be the folder holding ``chest_xray/``): ``split`` from
       the split folder, ``label`` (string) from the class folder. Images
       directly inside a split folder, when the splits have class folders,
       and files in other top-level folders, are ignored and listed.
    2. ``root/{CLASS}/*`` (no image directly in ``root``): ``label`` from the
       class folder, split ``"unspecified"``.
    3. A plain folder (images directly in ``root``, searched recursively):
       no labels, split ``"unspecified"``.

    ``patient_id`` comes from :func:`kermany_patient_id` for Kermany-style
    file names and is the ``image_id`` (relative path without suffix)
    otherwise. Non-image files are ignored and listed in
    ``attrs["ignored_files"]``; hidden files (``.DS_Store``) are skipped
    silently. Rows are sorted by path.

    Parameters
    ----------
    root : path
        The folder.

    Returns
    -------
    DataFrame
        A validated manifest.

    Raises
    ------
    DataError
        The folder does not exist or holds no image.

    Examples
    --------
    >>> m = load_image_folder("chest_xray")  # doctest: +SKIP
    >>> m.groupby(["split", "label"]).size()  # doctest: +SKIP
    """
    root = Path(root).expanduser()
    if not root.is_dir():
        raise DataError(f"no such folder: {root}")
    base = _kermany_root(root)
    splits = _split_dirs(base)
    rows: list[dict[str, Any]] = []
    ignored: list[str] = []

    def add(path: Path, split: str, label: str | None) -> None:
        rows.append({"path": str(path.absolute()), "split": split, "label": label})

    if splits:
        has_classes = any(
            any(c.is_dir() and not _is_hidden(c.name) for c in folder.iterdir()) for folder in splits.values()
        )
        split_names = {folder.name for folder in splits.values()}
        base_abs = base.absolute()
        for path in _walk_files(root):  # files outside the split folders
            try:
                first = path.absolute().relative_to(base_abs).parts[0]
            except ValueError:
                first = None
            if first not in split_names:
                ignored.append(str(path))
        for split, folder in splits.items():
            for path in _walk_files(folder):
                if not is_image_file(path):
                    ignored.append(str(path))
                    continue
                rel = path.relative_to(folder)
                if has_classes:
                    if len(rel.parts) < 2:
                        ignored.append(str(path))
                        continue
                    add(path, split, rel.parts[0])
                else:
                    add(path, split, None)
        layout = "split/class" if has_classes else "split"
    else:
        top_images = [p for p in root.iterdir() if p.is_file() and not _is_hidden(p.name) and is_image_file(p)]
        class_dirs = [p for p in root.iterdir() if p.is_dir() and not _is_hidden(p.name)]
        by_class = not top_images and bool(class_dirs)
        for path in _walk_files(root):
            if not is_image_file(path):
                ignored.append(str(path))
                continue
            add(path, "unspecified", path.relative_to(root).parts[0] if by_class else None)
        layout = "class" if by_class else "plain"

    if not rows:
        raise DataError(
            f"no image files found in {root} (looked for {', '.join(IMAGE_SUFFIXES)} and DICOM files; "
            f"{len(ignored)} other file(s) ignored)"
        )
    rows.sort(key=lambda r: r["path"])
    frame = pd.DataFrame(rows)
    rel = [Path(p).relative_to(base.absolute()).as_posix() if splits else Path(p).relative_to(root.absolute()).as_posix()
           for p in frame["path"]]
    frame.insert(0, "image_id", _image_ids(rel))
    patient_ids = []
    for image_id, path, split in zip(frame["image_id"], frame["path"], frame["split"]):
        found = _kermany_id(Path(path).name)
        patient_ids.append(f"{_kermany_scope(split)}/{found}" if found else image_id)
    frame.insert(2, "patient_id", patient_ids)
    if frame["label"].isna().all():
        frame = frame.drop(columns="label")
    logger.info("loaded %d images from %s (layout: %s)", len(frame), root, layout)
    ignored = sorted(dict.fromkeys(ignored))
    manifest = validate_manifest(frame, root=root)
    _record_ignored(manifest, ignored, root)
    manifest.attrs["layout"] = layout
    return manifest


# --------------------------------------------------------------------------- MedMNIST


def _encode_png(array: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def _npz_header(archive: Any, key: str) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of one array of an open .npz file, without loading it."""
    with archive.zip.open(f"{key}.npy") as handle:
        version = np.lib.format.read_magic(handle)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(handle)
        else:
            shape, _, dtype = np.lib.format.read_array_header_2_0(handle)
    return tuple(shape), np.dtype(dtype)


def _medmnist_plan(npz_path: Path, archive: Any) -> dict[str, tuple[int, np.ndarray]]:
    """Check the keys, image shapes (from the array headers) and labels of a
    MedMNIST .npz; return ``{split: (n_images, labels (N, C) int64)}``."""
    keys = set(archive.files)
    present = [s for s in _SPLITS if f"{s}_images" in keys or f"{s}_labels" in keys]
    if not present:
        raise DataError(
            f"{npz_path} has none of the MedMNIST keys train_images/train_labels, val_images/val_labels, "
            f"test_images/test_labels; keys present: {sorted(keys)}"
        )
    plan: dict[str, tuple[int, np.ndarray]] = {}
    for split in present:
        for key in (f"{split}_images", f"{split}_labels"):
            if key not in keys:
                raise DataError(f"{npz_path} has no {key!r} array (keys present: {sorted(keys)})")
        key = f"{split}_images"
        try:
            shape, dtype = _npz_header(archive, key)
        except Exception as exc:
            raise DataError(f"{npz_path}: cannot read the {key!r} array ({exc})") from None
        if len(shape) == 4 and shape[-1] == 1:
            shape = shape[:3]
        if not (len(shape) == 3 or (len(shape) == 4 and shape[-1] == 3)):
            raise DataError(
                f"{npz_path}: {key!r} must have shape (N, H, W) or (N, H, W, 3), got {shape} "
                "(3-D MedMNIST volumes are not supported)"
            )
        if not (dtype == np.uint8 or np.issubdtype(dtype, np.integer)):
            raise DataError(f"{npz_path}: {key!r} must be uint8 (0-255), got {dtype}")
        key = f"{split}_labels"
        try:
            labels = archive[key]
        except Exception as exc:
            raise DataError(f"{npz_path}: cannot read the {key!r} array ({exc})") from None
        if labels.ndim == 1:
            labels = labels[:, None]
        if labels.ndim != 2 or labels.shape[0] != shape[0]:
            raise DataError(
                f"{npz_path}: {key!r} must have shape (N, 1) or (N, C) with N = {shape[0]} "
                f"images, got {labels.shape}"
            )
        if not np.issubdtype(labels.dtype, np.integer):
            if (np.issubdtype(labels.dtype, np.floating) and np.isfinite(labels).all()
                    and (labels == np.round(labels)).all()):
                labels = labels.astype(np.int64)
            else:
                raise DataError(f"{npz_path}: {key!r} must hold integer labels, got {labels.dtype}")
        if labels.shape[1] > 1 and not np.isin(labels, (0, 1)).all():
            raise DataError(f"{npz_path}: multi-label {key!r} must hold 0 or 1")
        plan[split] = (int(shape[0]), labels.astype(np.int64))
    widths = {labels.shape[1] for _, labels in plan.values()}
    if len(widths) > 1:
        raise DataError(f"{npz_path}: label arrays of the splits have different widths {sorted(widths)}")
    return plan


def _medmnist_images(npz_path: Path, archive: Any, split: str) -> np.ndarray:
    key = f"{split}_images"
    images = archive[key]
    if images.ndim == 4 and images.shape[-1] == 1:
        images = images[..., 0]
    if images.dtype != np.uint8:
        if images.size and (images.min() < 0 or images.max() > 255):
            raise DataError(f"{npz_path}: {key!r} must be uint8 (0-255), got {images.dtype} "
                            f"values {images.min()}..{images.max()}")
        images = images.astype(np.uint8)
    return images


def load_medmnist(npz_path: str | os.PathLike, *, out_dir: str | os.PathLike | None = None) -> pd.DataFrame:
    """Load a MedMNIST-format ``.npz`` file, materialising its images as PNGs.

    Parameters
    ----------
    npz_path : path
        A ``.npz`` file with any of the split pairs ``train_images`` /
        ``train_labels``, ``val_images`` / ``val_labels``, ``test_images`` /
        ``test_labels``. Images: uint8, (N, H, W) grayscale or (N, H, W, 3)
        RGB. Labels: (N, 1) single-label (-> integer ``label`` column) or
        (N, C) multi-label 0/1 (-> ``finding_0`` ... ``finding_{C-1}``).
    out_dir : path, optional
        Where the PNGs and ``manifest.csv`` go. Default:
        ``cache_dir()/medmnist/<sha256 of the npz file>``. A complete earlier
        materialisation of the same file (the manifest is written last, as
        the completion marker) is reused without rewriting.

    Returns
    -------
    DataFrame
        A validated manifest: ``image_id`` like ``train_000123``,
        ``patient_id`` = ``image_id``, ``source`` = the npz file's stem.

    Raises
    ------
    DataError
        The file cannot be read, a key is missing or an array has the wrong shape.

    Examples
    --------
    >>> m = load_medmnist("pneumoniamnist.npz")  # doctest: +SKIP
    >>> m["label"].value_counts()  # doctest: +SKIP
    """
    npz_path = Path(npz_path).expanduser()
    if not npz_path.is_file():
        raise DataError(f"no such .npz file: {npz_path}")
    sha = file_sha256(npz_path)
    out = Path(out_dir).expanduser() if out_dir is not None else cache_dir() / "medmnist" / sha
    manifest_path = out / "manifest.csv"
    marker = out / _MEDMNIST_MARKER
    if manifest_path.is_file() and marker.is_file():
        try:
            if json.loads(marker.read_text(encoding="utf-8")).get("sha256") == sha:
                logger.info("reusing MedMNIST images of %s in %s", npz_path.name, out)
                return read_manifest(manifest_path)
        except (OSError, ValueError):
            pass
        logger.info("materialisation in %s is of another file; rewriting", out)

    try:
        archive = np.load(npz_path, allow_pickle=False)
    except Exception as exc:
        raise DataError(f"cannot read {npz_path} as a .npz file: {exc}") from None
    if not hasattr(archive, "files"):
        raise DataError(f"{npz_path} holds a single array, not a MedMNIST .npz archive of named arrays")
    from tqdm import tqdm

    with archive:
        plan = _medmnist_plan(npz_path, archive)
        total = sum(n for n, _ in plan.values())
        width = max(6, len(str(max(max(n for n, _ in plan.values()) - 1, 0))))
        n_labels = next(iter(plan.values()))[1].shape[1]
        rows: list[dict[str, Any]] = []
        manifest_path.unlink(missing_ok=True)
        atomic_write_json(marker, {"sha256": sha, "source": npz_path.name})
        progress = tqdm(total=total, desc=f"writing {npz_path.name} PNGs", unit="img",
                        disable=not progress_enabled())
        for split, (_, labels) in plan.items():
            images = _medmnist_images(npz_path, archive, split)  # one split in memory at a time
            for index in range(images.shape[0]):
                image_id = f"{split}_{index:0{width}d}"
                path = out / split / f"{image_id}.png"
                atomic_write_bytes(path, _encode_png(images[index]))
                row: dict[str, Any] = {"image_id": image_id, "path": str(path), "patient_id": image_id,
                                       "split": split, "source": npz_path.stem, "view": "unknown",
                                       "modality": "unknown"}
                if n_labels == 1:
                    row["label"] = int(labels[index, 0])
                else:
                    row.update({f"finding_{j}": int(labels[index, j]) for j in range(n_labels)})
                rows.append(row)
                progress.update(1)
            del images
        progress.close()
    manifest = validate_manifest(pd.DataFrame(rows), root=out)
    write_manifest(manifest, manifest_path)
    logger.info("wrote %d MedMNIST images of %s to %s", len(manifest), npz_path.name, out)
    return read_manifest(manifest_path)


# --------------------------------------------------------------------------- DICOM folders


def load_dicom_folder(root: str | os.PathLike) -> pd.DataFrame:
    """Build a manifest from a folder of DICOM files (searched recursively).

    Only headers are read (``stop_before_pixels``): ``PatientID`` ->
    ``patient_id`` (the ``image_id`` when absent), ``ViewPosition`` ->
    ``view``, ``Modality`` -> ``modality``, ``Manufacturer`` -> ``source``
    (``"unknown"`` when absent). Files that are not DICOM, or DICOM files
    without an image (no ``Rows``/``Columns``: reports, plans), are ignored
    and listed in ``attrs["ignored_files"]``.

    Parameters
    ----------
    root : path
        The folder.

    Returns
    -------
    DataFrame
        A validated manifest, split ``"unspecified"``, sorted by path.

    Examples
    --------
    >>> m = load_dicom_folder("dicoms/")  # doctest: +SKIP
    >>> m[["patient_id", "modality"]].head()  # doctest: +SKIP
    """
    import pydicom

    root = Path(root).expanduser()
    if not root.is_dir():
        raise DataError(f"no such folder: {root}")
    rows: list[dict[str, Any]] = []
    ignored: list[str] = []
    for path in _walk_files(root):
        if not is_dicom_file(path):
            ignored.append(str(path))
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ds = pydicom.dcmread(path, stop_before_pixels=True, force=not _has_dicom_magic(path))
        except Exception as exc:
            logger.debug("cannot read DICOM header of %s: %s", path, exc)
            ignored.append(str(path))
            continue
        if "Rows" not in ds or "Columns" not in ds:
            logger.debug("%s is a DICOM file without an image", path)
            ignored.append(str(path))
            continue
        rows.append({
            "path": str(path.absolute()),
            "patient_id": _header_text(ds, "PatientID"),
            "split": "unspecified",
            "source": _header_text(ds, "Manufacturer") or "unknown",
            "view": _header_text(ds, "ViewPosition") or "unknown",
            "modality": _header_text(ds, "Modality") or "unknown",
        })
    if not rows:
        raise DataError(f"no DICOM image files found in {root} ({len(ignored)} other file(s) ignored)")
    frame = pd.DataFrame(rows)
    rel = [Path(p).relative_to(root.absolute()).as_posix() for p in frame["path"]]
    frame.insert(0, "image_id", _image_ids(rel))
    no_pid = frame["patient_id"].isna()
    if no_pid.any():
        logger.warning("%d DICOM file(s) have no PatientID; each is its own patient", int(no_pid.sum()))
        frame.loc[no_pid, "patient_id"] = frame.loc[no_pid, "image_id"]
    manifest = validate_manifest(frame, root=root)
    _record_ignored(manifest, sorted(ignored), root)
    return manifest


# --------------------------------------------------------------------------- dispatcher


def _parse_phantom(spec: str) -> dict[str, Any]:
    parts = urllib.parse.urlsplit(spec)
    if parts.path != "phantom" or parts.scheme or parts.netloc or parts.fragment:
        raise DataError(f"bad phantom spec {spec!r}: write 'phantom' or 'phantom?patients=200&size=64'")
    try:
        pairs = urllib.parse.parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError as exc:
        raise DataError(f"bad phantom spec {spec!r}: {exc}") from None
    params = dict(PHANTOM_DEFAULTS)
    seen: set[str] = set()
    for key, value in pairs:
        if key not in PHANTOM_DEFAULTS:
            raise DataError(
                f"unknown key {key!r} in phantom spec {spec!r}; valid keys: {', '.join(PHANTOM_DEFAULTS)}"
            )
        if key in seen:
            raise DataError(f"key {key!r} is given twice in phantom spec {spec!r}")
        seen.add(key)
        default = PHANTOM_DEFAULTS[key]
        try:
            if isinstance(default, bool):
                lowered = value.strip().lower()
                if lowered not in ("0", "1", "true", "false", "yes", "no"):
                    raise ValueError(value)
                params[key] = lowered in ("1", "true", "yes")
            elif isinstance(default, int):
                params[key] = int(value)
            else:
                params[key] = float(value)
        except ValueError:
            kind = "0 or 1" if isinstance(default, bool) else type(default).__name__
            raise DataError(f"phantom spec {spec!r}: {key}={value!r} is not a valid {kind}") from None
    return params


def _load_phantom(spec: str) -> pd.DataFrame:
    params = _parse_phantom(spec)
    key = digest_of(sorted(params.items()))
    out_dir = cache_dir() / "phantom" / key
    marker = out_dir / _PHANTOM_MARKER
    if not marker.is_file():
        _generate_phantom_once(spec, params, out_dir)
    else:
        logger.info("reusing phantom data set in %s", out_dir)
    manifest = load_data(out_dir)
    manifest.attrs["phantom"] = params
    return manifest


def _generate_phantom_once(spec: str, params: dict[str, Any], out_dir: Path) -> None:
    """Generate a phantom into a private folder, then move it to ``out_dir`` whole.

    Two processes (chapters run side by side) may ask for the same phantom at
    once: each generates into its own folder, the first to finish moves it into
    place and the other's copy is removed, so no reader sees a half-written one.
    """
    import shutil
    import threading

    from crslib.data.phantom import generate_phantom

    private = out_dir.with_name(f".{out_dir.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    shutil.rmtree(private, ignore_errors=True)
    logger.info("generating phantom data set %s in %s", params, out_dir)
    generate_phantom(
        private,
        n_patients=params["patients"],
        image_size=params["size"],
        random_state=params["seed"],
        shortcut_strength=params["shortcut"],
        split_shift=params["shift"],
        kermany_layout=bool(params["kermany"]),
    )
    atomic_write_json(private / _PHANTOM_MARKER, {"spec": spec, "params": params})
    if out_dir.is_dir() and not (out_dir / _PHANTOM_MARKER).is_file():
        shutil.rmtree(out_dir, ignore_errors=True)  # a generation that stopped half-way, before this scheme
    try:
        os.rename(private, out_dir)
    except OSError:
        if not (out_dir / _PHANTOM_MARKER).is_file():
            raise
        shutil.rmtree(private, ignore_errors=True)  # another process finished the same phantom first


def is_phantom_spec(data: Any) -> bool:
    """Whether ``data`` is a phantom spec (``"phantom"`` or ``"phantom?..."``) rather than a path.

    Examples
    --------
    >>> is_phantom_spec("phantom?patients=50"), is_phantom_spec("./phantom")
    (True, False)
    """
    return isinstance(data, str) and (data == "phantom" or data.startswith("phantom?"))


def phantom_parameters(spec: str) -> dict[str, Any]:
    """The parameters of a phantom spec, defaults filled in (:data:`PHANTOM_DEFAULTS`).

    Raises
    ------
    DataError
        If ``spec`` is not a valid phantom spec.

    Examples
    --------
    >>> phantom_parameters("phantom?patients=50&shift=0.5")["shift"]
    0.5
    """
    return _parse_phantom(spec)


def load_data(data: str | os.PathLike) -> pd.DataFrame:
    """Load any supported data set as a validated manifest.

    Parameters
    ----------
    data : str or path
        One of:

        - a manifest file (``.csv`` or ``.parquet``);
        - a folder holding ``manifest.csv`` (preferred) or ``manifest.parquet``;
        - a MedMNIST-format ``.npz`` file (:func:`load_medmnist`);
        - a folder whose subfolders include ``train``/``val``/``test`` (or
          that holds ``chest_xray/``): :func:`load_image_folder`;
        - a folder in which every image file is DICOM: :func:`load_dicom_folder`;
        - any other folder of images: :func:`load_image_folder`;
        - a phantom spec: ``"phantom"`` or
          ``"phantom?patients=200&size=64&seed=0&shortcut=0.8&shift=0.5&kermany=1"``
          (keys and defaults in :data:`PHANTOM_DEFAULTS`). The data set is
          generated once into ``cache_dir()/phantom/<digest of the
          parameters>`` and reused afterwards. A spec string takes precedence
          over a folder named ``phantom``; write ``./phantom`` for the folder.

    Returns
    -------
    DataFrame
        A validated manifest (:func:`validate_manifest`).

    Raises
    ------
    DataError
        The path does not exist, is of an unsupported kind, or its content is invalid.

    Examples
    --------
    >>> m = load_data("phantom?patients=20&size=32")  # doctest: +SKIP
    >>> m = load_data("chest_xray")  # doctest: +SKIP
    """
    if is_phantom_spec(data):
        return _load_phantom(str(data))
    path = Path(data).expanduser()
    if not path.exists():
        raise DataError(
            f"no such file or folder: {data} (expected a manifest .csv/.parquet, a folder, a .npz file, "
            "or 'phantom?...')"
        )
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix in (".csv", ".parquet", ".pq"):
            return read_manifest(path)
        if suffix == ".npz":
            return load_medmnist(path)
        hint = " (a single image: pass its folder instead)" if is_image_file(path) else ""
        raise DataError(
            f"cannot load {path}: expected a manifest .csv/.parquet, a folder, a .npz file, or 'phantom?...'{hint}"
        )
    for name in _MANIFEST_NAMES:
        if (path / name).is_file():
            return read_manifest(path / name)
    if _split_dirs(_kermany_root(path)):
        return load_image_folder(path)
    files = [p for p in _walk_files(path) if is_image_file(p)]
    if files and all(is_dicom_file(p) for p in files):
        return load_dicom_folder(path)
    return load_image_folder(path)
