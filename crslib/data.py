"""Data: the manifest schema, loaders for every kind of ``--data``, and robust
image reading.

A data set is a *manifest*: a :class:`pandas.DataFrame` with one row per image
and at least the columns of :data:`MANIFEST_COLUMNS`. Targets are a single
``label`` column and/or multi-label ``finding_*`` columns holding 0/1 integers;
continuous targets (``age``) and any other columns are kept as they are.

Loaders turn what a user has into a manifest:

- :func:`read_manifest` / :func:`write_manifest`: CSV or Parquet files whose
  ``path`` column is relative to the manifest's folder, so a data folder can be
  moved or copied;
- :func:`load_image_folder`: ``root/{train,val,test}/{CLASS}/*`` (incl. the
  Kermany ``chest_xray`` layout), ``root/{CLASS}/*`` or a plain folder;
- :func:`load_medmnist`: a MedMNIST-format ``.npz`` file, materialised as PNGs;
- :func:`load_dicom_folder`: a folder of DICOM files (headers only);
- :func:`load_data`: the dispatcher behind every ``--data`` flag and notebook
  ``data`` parameter, including the ``"phantom?..."`` spec strings.

:func:`read_image` reads one file (PNG/JPEG/TIFF/BMP or DICOM) into a float32
array in [0, 1] of shape (H, W, C), C = 1 or 3, and raises
:class:`~crslib.errors.ImageReadError` with a short reason on any failure.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import threading
import urllib.parse
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from crslib._io import atomic_write_bytes, atomic_write_json, atomic_write_text, digest_of, file_sha256
from crslib.config import cache_dir, progress_enabled
from crslib.errors import DataError, ImageReadError, InputError

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "FILE_PROPERTY_COLUMNS",
    "IMAGE_SUFFIXES",
    "MANIFEST_COLUMNS",
    "PHANTOM_DEFAULTS",
    "check_files",
    "file_properties",
    "is_dicom_file",
    "is_image_file",
    "kermany_patient_id",
    "load_data",
    "load_dicom_folder",
    "load_image_folder",
    "load_medmnist",
    "read_image",
    "read_images",
    "read_manifest",
    "select_examples",
    "summarize_manifest",
    "validate_manifest",
    "write_manifest",
]

#: Columns every validated manifest has, in this order (other columns follow).
MANIFEST_COLUMNS = ("image_id", "path", "patient_id", "split", "source", "view", "modality")

#: File suffixes read as images (case-insensitive). Files without one of these
#: suffixes are still read as DICOM when they carry the ``DICM`` magic at byte 128.
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".dcm")

#: Largest image :func:`read_image` decodes, in pixels (width x height).
DEFAULT_MAX_PIXELS = 200_000_000
# Part of every embedding cache key: bump it whenever read_image decodes any file differently.
READER_VERSION = 1

#: Keys of a ``"phantom?..."`` spec and their defaults.
PHANTOM_DEFAULTS: dict[str, Any] = {
    "patients": 300,
    "size": 64,
    "seed": 0,
    "shortcut": 0.0,
    "shift": 0.0,
    "kermany": False,
}

_REQUIRED = ("image_id", "path")
_FILL_DEFAULTS = {"split": "unspecified", "source": "unknown", "view": "unknown", "modality": "unknown"}
_SPLITS = ("train", "val", "test")
_MANIFEST_NAMES = ("manifest.csv", "manifest.parquet")
_PHANTOM_MARKER = ".crs-phantom-complete.json"
_MEDMNIST_MARKER = ".crs-medmnist.json"
_NA_STRINGS = ["", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND",
               "1.#QNAN", "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"]
_STRING_COLUMNS = MANIFEST_COLUMNS
_PIL_LOCK = threading.Lock()


# --------------------------------------------------------------------------- file kinds


def _is_hidden(name: str) -> bool:
    return name.startswith(".") or name == "__MACOSX"


def _has_dicom_magic(path: str | os.PathLike) -> bool:
    try:
        with open(path, "rb") as handle:
            head = handle.read(132)
    except OSError:
        return False
    return len(head) == 132 and head[128:132] == b"DICM"


def is_dicom_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a DICOM file: suffix ``.dcm`` or ``DICM`` at byte 128.

    Examples
    --------
    >>> is_dicom_file("scan.dcm")
    True
    """
    if Path(path).suffix.lower() == ".dcm":
        return True
    return _has_dicom_magic(path)


def is_image_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an image file crslib reads: a suffix from
    :data:`IMAGE_SUFFIXES` (case-insensitive) or a DICOM file without suffix
    (``DICM`` magic at byte 128).

    Examples
    --------
    >>> is_image_file("a/IM-0115-0001.JPEG"), is_image_file("notes.txt")
    (True, False)
    """
    suffix = Path(path).suffix.lower()
    if suffix in IMAGE_SUFFIXES:
        return True
    return _has_dicom_magic(path)


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


# --------------------------------------------------------------------------- manifest


def _rows_named(df: pd.DataFrame, mask: np.ndarray | pd.Series, limit: int = 5) -> str:
    """'row 3 (image_id 'a'), row 7 (...)' for the first offending rows."""
    positions = np.flatnonzero(np.asarray(mask, dtype=bool))
    parts = []
    has_id = "image_id" in df.columns
    for pos in positions[:limit]:
        if has_id:
            parts.append(f"row {pos} (image_id {df['image_id'].iloc[pos]!r})")
        else:
            parts.append(f"row {pos}")
    more = f" and {len(positions) - limit} more" if len(positions) > limit else ""
    return ", ".join(parts) + more


def _is_blank(series: pd.Series) -> pd.Series:
    blank = series.isna()
    as_text = series.astype(str).str.strip()
    return blank | (as_text == "")


def validate_manifest(df: pd.DataFrame, *, root: str | os.PathLike | None = None) -> pd.DataFrame:
    """Check a manifest and return a validated copy.

    Parameters
    ----------
    df : DataFrame
        One row per image. Required columns: ``image_id`` and ``path``.
        Optional: ``patient_id``, ``split``, ``source``, ``view``,
        ``modality``, a ``label`` column, ``finding_*`` columns (0/1), any
        others (kept).
    root : path, optional
        Folder that relative paths are resolved against (the manifest's
        folder). Default: ``df.attrs["root"]`` when set, else the current
        working directory.

    Returns
    -------
    DataFrame
        A copy with the columns of :data:`MANIFEST_COLUMNS` first, string
        identifiers, absolute paths, ``split`` lower-cased, ``finding_*`` as
        ints. Missing optional columns are filled (``patient_id`` from
        ``image_id``, ``split`` with ``"unspecified"``, ``source``/``view``/
        ``modality`` with ``"unknown"``), and their names recorded in
        ``attrs["filled_columns"]``; ``attrs["root"]`` is the folder paths
        were resolved against. File existence is not checked here (see
        :func:`check_files`).

    Raises
    ------
    DataError
        A required column is missing; an ``image_id`` is duplicated; an
        ``image_id``, ``path`` or ``patient_id`` is empty; a ``finding_*``
        value is not 0/1; a ``label`` is missing.

    Examples
    --------
    >>> import pandas as pd
    >>> m = validate_manifest(pd.DataFrame({"image_id": ["a"], "path": ["a.png"]}), root="/data")
    >>> m.loc[0, "path"], m.loc[0, "split"], m.attrs["filled_columns"]
    ('/data/a.png', 'unspecified', ['patient_id', 'split', 'source', 'view', 'modality'])
    """
    if not isinstance(df, pd.DataFrame):
        raise DataError(f"a manifest must be a pandas DataFrame, got {type(df).__name__}")
    out = df.copy()
    out.attrs = dict(df.attrs)
    for column in _REQUIRED:
        if column not in out.columns:
            raise DataError(
                f"manifest has no {column!r} column; columns present: {list(map(str, out.columns))}. "
                f"Add {column!r} (image_id: a unique name per image; path: the image file, "
                "absolute or relative to the manifest's folder)"
            )
    if len(out) == 0:
        raise DataError("manifest has no rows: it must list at least one image")

    for column in _REQUIRED:
        blank = _is_blank(out[column])
        if blank.any():
            raise DataError(
                f"manifest column {column!r} is empty in {int(blank.sum())} row(s): "
                f"{_rows_named(out, blank.to_numpy())}; fill it in or drop those rows"
            )
    out["image_id"] = out["image_id"].astype(str).str.strip()
    dup = out["image_id"].duplicated(keep=False).to_numpy()
    if dup.any():
        values = list(dict.fromkeys(out.loc[dup, "image_id"]))
        raise DataError(
            f"manifest column 'image_id' has {len(values)} duplicated value(s): {values[:5]!r}"
            f"{' ...' if len(values) > 5 else ''} in {_rows_named(out, dup)}; every image needs a unique image_id"
        )

    filled: list[str] = []
    if "patient_id" not in out.columns:
        out["patient_id"] = out["image_id"]
        filled.append("patient_id")
    else:
        blank = _is_blank(out["patient_id"])
        if blank.any():
            raise DataError(
                f"manifest column 'patient_id' is empty in {int(blank.sum())} row(s): "
                f"{_rows_named(out, blank.to_numpy())}; fill it in, or drop the column to treat each image "
                "as its own patient"
            )
        out["patient_id"] = out["patient_id"].astype(str).str.strip()
    filled_values: dict[str, int] = {}
    for column, default in _FILL_DEFAULTS.items():
        if column not in out.columns:
            out[column] = default
            filled.append(column)
            continue
        blank = _is_blank(out[column])
        if blank.any():
            filled_values[column] = int(blank.sum())
            logger.warning("manifest column %r is empty in %d row(s); filled with %r",
                           column, int(blank.sum()), default)
        out[column] = out[column].where(~blank, default).astype(str).str.strip()
    out["split"] = out["split"].str.lower()

    finding_columns = [c for c in out.columns if str(c).startswith("finding_")]
    for column in finding_columns:
        values = pd.to_numeric(out[column], errors="coerce")
        bad = ~(values.isin([0, 1])).to_numpy()
        if bad.any():
            shown = out.loc[bad, column].head(3).tolist()
            raise DataError(
                f"manifest column {column!r} must hold 0 or 1, but {int(bad.sum())} row(s) do not "
                f"(values {shown!r}): {_rows_named(out, bad)}. Map uncertain (-1) and blank labels to 0 or 1 "
                "first (e.g. the U-zeros or U-ones policy)"
            )
        out[column] = values.astype(np.int64)
    if "label" in out.columns:
        blank = out["label"].isna().to_numpy()
        if blank.any():
            raise DataError(
                f"manifest column 'label' is missing in {int(blank.sum())} row(s): {_rows_named(out, blank)}; "
                "fill in the labels or drop those rows"
            )

    if root is None:
        root = out.attrs.get("root") or os.getcwd()
    root_path = Path(root).expanduser().absolute()
    out["path"] = [
        os.path.normpath(os.path.join(root_path, os.path.expanduser(str(p).strip()))) for p in out["path"]
    ]

    ordered = list(MANIFEST_COLUMNS) + [c for c in out.columns if c not in MANIFEST_COLUMNS]
    out = out[ordered].reset_index(drop=True)
    out.attrs = dict(df.attrs)
    out.attrs["root"] = str(root_path)
    out.attrs["filled_columns"] = filled
    if filled_values:
        out.attrs["filled_values"] = filled_values
    if filled:
        logger.info("manifest had no %s column(s); filled with defaults", ", ".join(filled))
    return out


def check_files(df: pd.DataFrame) -> None:
    """Raise :class:`DataError` when image files of a manifest do not exist.

    Parameters
    ----------
    df : DataFrame
        A manifest with absolute ``path`` values (see :func:`validate_manifest`).

    Raises
    ------
    DataError
        Lists the first 5 missing files and how many are missing.

    Examples
    --------
    >>> import pandas as pd
    >>> check_files(pd.DataFrame({"image_id": ["a"], "path": ["/nonexistent/a.png"]}))
    ... # doctest: +ELLIPSIS
    Traceback (most recent call last):
    crslib.errors.DataError: 1 of 1 image file(s) listed in the manifest do not exist: /nonexistent/a.png ...
    """
    if "path" not in df.columns:
        raise DataError(f"manifest has no 'path' column; columns present: {list(map(str, df.columns))}")
    paths = [str(p) for p in df["path"]]
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        shown = ", ".join(missing[:5]) + (f" (and {len(missing) - 5} more)" if len(missing) > 5 else "")
        raise DataError(
            f"{len(missing)} of {len(paths)} image file(s) listed in the manifest do not exist: {shown} ... "
            "check the 'path' column (relative paths are resolved against the manifest's folder)"
        )


def _manifest_format(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return "csv"
    if suffix in (".parquet", ".pq"):
        return "parquet"
    raise DataError(f"manifest {path} must be a .csv or .parquet file")


def read_manifest(path: str | os.PathLike) -> pd.DataFrame:
    """Read a manifest from a ``.csv`` or ``.parquet`` file.

    Relative ``path`` values are resolved against the manifest's folder, so a
    data folder with its manifest can be moved or copied.

    Parameters
    ----------
    path : path
        The manifest file.

    Returns
    -------
    DataFrame
        The validated manifest (see :func:`validate_manifest`).

    Examples
    --------
    >>> m = read_manifest("data/manifest.csv")  # doctest: +SKIP
    """
    path = Path(path).expanduser()
    kind = _manifest_format(path)
    if not path.is_file():
        raise DataError(f"no such manifest file: {path}")
    try:
        if kind == "csv":
            header = pd.read_csv(path, nrows=0).columns
            na_values = {c: ([""] if c in _STRING_COLUMNS else _NA_STRINGS) for c in header}
            dtypes = {c: str for c in header if c in _STRING_COLUMNS}
            df = pd.read_csv(path, dtype=dtypes, keep_default_na=False, na_values=na_values)
        else:
            df = pd.read_parquet(path)
    except DataError:
        raise
    except Exception as exc:  # parser errors of pandas/pyarrow, bad encodings
        raise DataError(f"cannot read manifest {path}: {exc}") from None
    df.attrs = {}
    return validate_manifest(df, root=path.parent)


def _relative_path(path: str, folder: Path) -> str:
    absolute = Path(os.path.normpath(os.path.abspath(path)))
    try:
        return absolute.relative_to(folder).as_posix()
    except ValueError:
        return str(absolute)


def write_manifest(df: pd.DataFrame, path: str | os.PathLike) -> Path:
    """Write a manifest atomically as ``.csv`` or ``.parquet``.

    Paths of images inside the manifest's folder are written relative to it
    (posix separators), so the folder can be moved; paths outside it stay
    absolute.

    Parameters
    ----------
    df : DataFrame
        A manifest; it is validated first.
    path : path
        Destination ``.csv`` or ``.parquet`` file.

    Returns
    -------
    Path
        The written file.

    Examples
    --------
    >>> write_manifest(manifest, "data/manifest.csv")  # doctest: +SKIP
    """
    path = Path(path).expanduser()
    kind = _manifest_format(path)
    manifest = validate_manifest(df)
    folder = Path(os.path.normpath(path.parent.absolute()))
    out = manifest.copy()
    out["path"] = [_relative_path(p, folder) for p in manifest["path"]]
    out.attrs = {}
    if kind == "csv":
        atomic_write_text(path, out.to_csv(index=False))
    else:
        buffer = io.BytesIO()
        out.to_parquet(buffer, index=False)
        atomic_write_bytes(path, buffer.getvalue())
    logger.debug("wrote manifest of %d rows to %s", len(out), path)
    return path


def summarize_manifest(manifest: pd.DataFrame) -> pd.DataFrame:
    """One row per split (and ``"all"``): counts of images, patients,
    sources and views, counts per ``label`` value, prevalence of each
    ``finding_*`` column.

    Parameters
    ----------
    manifest : DataFrame
        A manifest (it is validated first).

    Returns
    -------
    DataFrame
        Indexed by split (``"all"`` last). Columns ``images``, ``patients``,
        ``sources``, ``views``, then ``label=<value>`` (image counts), then
        one column per finding (share of images with the finding, 0-1).

    Examples
    --------
    >>> import pandas as pd
    >>> m = pd.DataFrame({"image_id": ["a", "b", "c"], "path": ["a.png", "b.png", "c.png"],
    ...                   "split": ["train", "train", "test"], "label": [0, 1, 1]})
    >>> summarize_manifest(m)[["images", "label=1"]].loc["all"].tolist()
    [3, 2]
    """
    m = validate_manifest(manifest)
    findings = [c for c in m.columns if str(c).startswith("finding_")]
    groups = [(str(s), m[m["split"] == s]) for s in sorted(m["split"].unique())] + [("all", m)]
    labels = sorted(m["label"].unique(), key=str) if "label" in m.columns else []
    rows = []
    for name, part in groups:
        row: dict[str, Any] = {
            "images": len(part),
            "patients": int(part["patient_id"].nunique()),
            "sources": int(part["source"].nunique()),
            "views": int(part["view"].nunique()),
        }
        for value in labels:
            row[f"label={value}"] = int((part["label"] == value).sum())
        for column in findings:
            row[column] = float(part[column].mean()) if len(part) else float("nan")
        rows.append(row)
    table = pd.DataFrame(rows, index=pd.Index([g for g, _ in groups], name="split"))
    return table


def select_examples(
    manifest: pd.DataFrame,
    *,
    by: str | Sequence[str],
    n_per_group: int = 4,
    seed: int = 0,
) -> pd.DataFrame:
    """Draw a few example rows per group, reproducibly (for image grids).

    Parameters
    ----------
    manifest : DataFrame
        A manifest.
    by : str or sequence of str
        A column name: up to ``n_per_group`` rows for each of its values
        (sorted). A list of 0/1 columns (e.g. the ``finding_*`` columns): up
        to ``n_per_group`` rows with the value 1 for each column; an image
        can appear under several columns.
    n_per_group : int
        Rows drawn per group (fewer when a group is smaller).
    seed : int
        Seed of the draw.

    Returns
    -------
    DataFrame
        The drawn rows (all manifest columns) plus ``group``: the column's
        value as a string, or the column name for a list of columns.

    Examples
    --------
    >>> import pandas as pd
    >>> m = pd.DataFrame({"image_id": list("abcd"), "path": list("abcd"), "view": ["PA", "PA", "AP", "PA"]})
    >>> select_examples(m, by="view", n_per_group=1)["group"].tolist()
    ['AP', 'PA']
    """
    if n_per_group < 1:
        raise InputError(f"n_per_group must be at least 1, got {n_per_group}")
    columns = [by] if isinstance(by, str) else list(by)
    missing = [c for c in columns if c not in manifest.columns]
    if missing:
        raise DataError(f"manifest has no column(s) {missing}; columns present: {list(map(str, manifest.columns))}")
    rng = np.random.default_rng(seed)
    parts = []

    def draw(rows: pd.DataFrame, group: str) -> None:
        if len(rows) == 0:
            return
        take = np.sort(rng.choice(len(rows), size=min(n_per_group, len(rows)), replace=False))
        parts.append(rows.iloc[take].assign(group=group))

    if isinstance(by, str):
        values = manifest[by]
        for value in sorted(values.dropna().unique(), key=str):
            draw(manifest[values == value], str(value))
    else:
        for column in columns:
            draw(manifest[pd.to_numeric(manifest[column], errors="coerce") == 1], str(column))
    if not parts:
        return manifest.iloc[:0].assign(group=pd.Series(dtype=str))
    out = pd.concat(parts).reset_index(drop=True)
    out.attrs = {}
    return out


# --------------------------------------------------------------------------- image folders

_KERMANY_PERSON = re.compile(r"^(person\d+)_", re.IGNORECASE)
_KERMANY_IM = re.compile(r"^(?:NORMAL\d*-)?(IM-\d+)-\d+", re.IGNORECASE)


def _kermany_id(filename: str) -> str | None:
    stem = Path(filename).name
    stem = stem.rsplit(".", 1)[0] if "." in stem else stem
    match = _KERMANY_PERSON.match(stem)
    if match:
        return match.group(1).lower()
    match = _KERMANY_IM.match(stem)
    if match:
        return match.group(1).upper()
    return None


def _kermany_scope(split: str) -> str:
    split = str(split).strip().lower()
    return "train" if split == "val" else split


def kermany_patient_id(filename: str, split: str) -> str:
    """Patient id of a Kermany chest X-ray file name, scoped by split.

    The format is ``"{scope}/{id}"``: ``id`` is ``personN`` for
    ``personN_{bacteria|virus}_M.jpeg`` and ``IM-XXXX`` for
    ``IM-XXXX-YYYY.jpeg`` and ``NORMAL2-IM-XXXX-YYYY.jpeg``; ``scope`` is the
    split, because person numbers in the official test split are different
    children from those in the training pool. The tiny official ``val``
    split was carved out of the training pool, so it shares the ``train``
    scope (a child in both train and val keeps one id; patient-level
    re-splitting of the pool cannot leak). Unrecognised names give the file
    stem, scoped likewise.

    Parameters
    ----------
    filename : str
        File name (a path is fine; only its name is used).
    split : str
        ``train``, ``val``, ``test`` (case-insensitive) or any other split name.

    Returns
    -------
    str

    Examples
    --------
    >>> kermany_patient_id("person123_bacteria_4.jpeg", "test")
    'test/person123'
    >>> kermany_patient_id("NORMAL2-IM-1427-0001.jpeg", "train")
    'train/IM-1427'
    """
    scope = _kermany_scope(split)
    found = _kermany_id(filename)
    if found is None:
        name = Path(filename).name
        found = name.rsplit(".", 1)[0] if "." in name else name
        logger.debug("file name %r is not a Kermany name; patient id from the file stem", filename)
    return f"{scope}/{found}"


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


def _header_text(ds: Any, keyword: str) -> str | None:
    value = ds.get(keyword)
    if value is None:
        return None
    text = str(value).strip()
    return text or None


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
        from crslib.phantom import generate_phantom

        logger.info("generating phantom data set %s in %s", params, out_dir)
        generate_phantom(
            out_dir,
            n_patients=params["patients"],
            image_size=params["size"],
            seed=params["seed"],
            shortcut_strength=params["shortcut"],
            split_shift=params["shift"],
            kermany_layout=bool(params["kermany"]),
        )
        atomic_write_json(marker, {"spec": spec, "params": params})
    else:
        logger.info("reusing phantom data set in %s", out_dir)
    manifest = load_data(out_dir)
    manifest.attrs["phantom"] = params
    return manifest


def _is_phantom_spec(data: Any) -> bool:
    return isinstance(data, str) and (data == "phantom" or data.startswith("phantom?"))


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
    if _is_phantom_spec(data):
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


# --------------------------------------------------------------------------- image reading


def _minmax(array: np.ndarray) -> np.ndarray:
    array = array.astype(np.float64, copy=False)
    low, high = float(array.min()), float(array.max())
    if high > low:
        return (array - low) / (high - low)
    return np.zeros_like(array)


def _as_hwc(array: np.ndarray) -> np.ndarray:
    if array.ndim == 2:
        array = array[:, :, None]
    return np.ascontiguousarray(array, dtype=np.float32)


def _tiff_bits(im: Any) -> tuple[int | None, bool]:
    tags = getattr(im, "tag_v2", None)
    if tags is None:
        return None, False
    bits = tags.get(258)
    if isinstance(bits, tuple):
        bits = bits[0] if bits else None
    fmt = tags.get(339)
    if isinstance(fmt, tuple):
        fmt = fmt[0] if fmt else None
    return (int(bits) if bits else None), fmt == 2


def _pil_to_array(im: Any, path: Path) -> np.ndarray:
    from PIL import Image

    mode = im.mode
    if mode == "1":
        return _as_hwc(np.asarray(im, dtype=np.float32))
    if mode == "L":
        return _as_hwc(np.asarray(im, dtype=np.float32) / 255.0)
    if mode.startswith("I;16"):
        raw = np.asarray(im)
        if raw.dtype.kind == "i":
            return _as_hwc((raw.astype(np.float64) + 32768.0) / 65535.0)
        return _as_hwc(raw.astype(np.float64) / 65535.0)
    if mode == "I":
        raw = np.asarray(im).astype(np.float64)
        bits, signed = _tiff_bits(im)
        if bits is None and im.format == "PNG":
            bits = 16
        if bits:
            if signed:
                return _as_hwc((raw + 2.0 ** (bits - 1)) / (2.0**bits - 1))
            if raw.min() >= 0 and raw.max() <= 2.0**bits - 1:
                return _as_hwc(raw / (2.0**bits - 1))
        logger.debug("%s: 32-bit integer image without a declared bit depth; min-max scaled", path)
        return _as_hwc(_minmax(raw))
    if mode == "F":
        raw = np.asarray(im).astype(np.float64)
        if not np.isfinite(raw).all():
            raise ImageReadError(path, "floating-point image contains NaN or infinite values")
        if raw.min() >= 0.0 and raw.max() <= 1.0:
            return _as_hwc(raw)
        return _as_hwc(_minmax(raw))
    if mode in ("P", "PA"):
        has_alpha = mode == "PA" or "transparency" in im.info
        im = im.convert("RGBA" if has_alpha else "RGB")
        rgb = np.asarray(im, dtype=np.float32) / 255.0
        if has_alpha:
            rgb = rgb[..., :3] * rgb[..., 3:4]
        if np.array_equal(rgb[..., 0], rgb[..., 1]) and np.array_equal(rgb[..., 0], rgb[..., 2]):
            return _as_hwc(rgb[..., 0])
        return _as_hwc(rgb)
    if mode == "LA":
        la = np.asarray(im, dtype=np.float32) / 255.0
        return _as_hwc(la[..., 0] * la[..., 1])
    if mode == "RGBA":
        rgba = np.asarray(im, dtype=np.float32) / 255.0
        return _as_hwc(rgba[..., :3] * rgba[..., 3:4])
    if mode == "RGB":
        return _as_hwc(np.asarray(im, dtype=np.float32) / 255.0)
    if mode in ("La", "RGBa"):
        im = im.convert("LA" if mode == "La" else "RGBA")
        return _pil_to_array(im, path)
    # CMYK, YCbCr, LAB, HSV and anything else PIL can convert
    try:
        rgb = im.convert("RGB")
    except Exception as exc:
        raise ImageReadError(path, f"unsupported image mode {mode!r}: {exc}") from None
    return _as_hwc(np.asarray(rgb, dtype=np.float32) / 255.0)


def _read_pil(path: Path, max_pixels: int) -> np.ndarray:
    from PIL import Image, ImageOps, UnidentifiedImageError

    with _PIL_LOCK:
        saved = Image.MAX_IMAGE_PIXELS
        Image.MAX_IMAGE_PIXELS = int(max_pixels)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                im = Image.open(path)
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
            raise ImageReadError(path, f"image is larger than max_pixels={max_pixels} ({exc}); "
                                       "pass a larger max_pixels if it is genuine") from None
        except UnidentifiedImageError:
            raise ImageReadError(path, "not an image (format not recognised)") from None
        except Exception as exc:
            raise ImageReadError(path, f"cannot open: {exc}") from None
        finally:
            Image.MAX_IMAGE_PIXELS = saved
    with im:
        width, height = im.size
        if width * height > max_pixels:
            raise ImageReadError(path, f"image has {width} x {height} = {width * height} pixels, over "
                                       f"max_pixels={max_pixels}; pass a larger max_pixels if it is genuine")
        if width == 0 or height == 0:
            raise ImageReadError(path, f"image has zero size {width} x {height}")
        try:
            im.load()
        except Exception as exc:
            reason = str(exc) or type(exc).__name__
            if "truncated" in reason.lower():
                raise ImageReadError(path, f"truncated image ({reason})") from None
            raise ImageReadError(path, f"cannot decode: {reason}") from None
        try:
            transposed = ImageOps.exif_transpose(im)
        except Exception as exc:
            logger.warning("%s: cannot apply the EXIF orientation (%s); using the stored orientation", path, exc)
            transposed = im
        try:
            return _pil_to_array(transposed if transposed is not None else im, path)
        except ImageReadError:
            raise
        except Exception as exc:
            raise ImageReadError(path, f"cannot convert pixels: {exc}") from None


def _read_dicom(path: Path, max_pixels: int) -> np.ndarray:
    import pydicom
    from pydicom.pixels import apply_color_lut, apply_modality_lut, apply_voi_lut, pixel_array

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ds = pydicom.dcmread(path, force=not _has_dicom_magic(path))
    except Exception as exc:
        raise ImageReadError(path, f"not a valid DICOM file ({exc})") from None
    if not any(k in ds for k in ("PixelData", "FloatPixelData", "DoubleFloatPixelData")):
        raise ImageReadError(path, "DICOM file has no pixel data")
    rows, cols = int(ds.get("Rows") or 0), int(ds.get("Columns") or 0)
    if rows * cols > max_pixels:
        raise ImageReadError(path, f"image has {cols} x {rows} = {rows * cols} pixels, over "
                                   f"max_pixels={max_pixels}; pass a larger max_pixels if it is genuine")
    syntax = getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", None)
    syntax_name = f"{syntax.name} ({syntax})" if syntax is not None else "unknown transfer syntax"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            arr = pixel_array(ds, index=0)
    # pydicom signals a transfer syntax without an installed decoder with these two.
    except (RuntimeError, NotImplementedError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ImageReadError(path, f"unsupported DICOM transfer syntax {syntax_name}: {first} "
                                   "(install the pylibjpeg or gdcm plugins for pydicom)") from None
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ImageReadError(path, f"cannot decode DICOM pixel data ({syntax_name}): {first}") from None
    photometric = str(ds.get("PhotometricInterpretation", "")).strip().upper()
    try:
        if photometric == "PALETTE COLOR":
            rgb = apply_color_lut(arr, ds)
            scale = 65535.0 if rgb.dtype.itemsize > 1 else 255.0
            return _as_hwc(np.clip(rgb.astype(np.float64) / scale, 0.0, 1.0))
        if arr.ndim == 3 and arr.shape[-1] == 3:
            bits = int(ds.get("BitsStored") or ds.get("BitsAllocated") or 8)
            out = arr.astype(np.float64) / (2.0**bits - 1)
            if out.min() < 0 or out.max() > 1:
                out = _minmax(out)
            return _as_hwc(out)
        if arr.ndim != 2:
            raise ImageReadError(path, f"unsupported DICOM pixel array shape {arr.shape}")
        values = apply_modality_lut(arr, ds)
        values = apply_voi_lut(values, ds, index=0)
        values = _minmax(np.asarray(values, dtype=np.float64))
        if photometric == "MONOCHROME1":
            values = 1.0 - values
        if not np.isfinite(values).all():
            raise ImageReadError(path, "DICOM pixel data contain NaN or infinite values")
        return _as_hwc(values)
    except ImageReadError:
        raise
    except Exception as exc:
        raise ImageReadError(path, f"cannot apply the DICOM LUTs ({photometric}): {exc}") from None


def _check_image_file(path: Path) -> int:
    """The file's size; ImageReadError when it is missing, a folder or empty."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise ImageReadError(path, "no such file") from None
    except OSError as exc:
        raise ImageReadError(path, f"cannot access: {exc}") from None
    if path.is_dir():
        raise ImageReadError(path, "is a folder, not an image file")
    if size == 0:
        raise ImageReadError(path, "empty file (0 bytes)")
    return size


def read_image(path: str | os.PathLike, *, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Read an image file as float32 in [0, 1], shape (H, W, C), C = 1 or 3.

    PNG/JPEG/TIFF/BMP go through Pillow: 8-bit modes are divided by 255;
    16-bit modes (``I;16*``) by 65535; ``I`` (32-bit integer) by the declared
    bit depth when the file states one (TIFF ``BitsPerSample``, 16 for PNG),
    else min-max scaled; ``F`` kept when already in [0, 1], else min-max
    scaled. ``LA``/``RGBA`` are composited on black (alpha dropped);
    palette images are expanded (C = 1 when every used colour is gray); CMYK,
    YCbCr and other modes are converted to RGB; the EXIF orientation is
    applied. 16-bit RGB PNGs are reduced to 8 bits per channel by Pillow.

    DICOM files (suffix ``.dcm`` or ``DICM`` magic) go through pydicom: the
    first frame of a multi-frame file; palette colour expanded; RGB and YBR
    (converted to RGB by pydicom) scaled by ``BitsStored``; grayscale gets
    the modality LUT / rescale, then the VOI LUT / window, then min-max to
    [0, 1], MONOCHROME1 inverted so that bright is dense.

    Parameters
    ----------
    path : path
        The image file.
    max_pixels : int
        Largest image (width x height) decoded; larger ones raise, which
        guards against decompression bombs. Default 2e8
        (:data:`DEFAULT_MAX_PIXELS`), above Pillow's own default warning limit.

    Returns
    -------
    ndarray of float32, shape (H, W, C)

    Raises
    ------
    ImageReadError
        With a short reason: missing or empty file, not an image, truncated
        data, too many pixels, DICOM without pixel data or with an
        unsupported transfer syntax, ...

    Examples
    --------
    >>> import tempfile, os
    >>> from skimage import data as skdata
    >>> from PIL import Image
    >>> png = os.path.join(tempfile.mkdtemp(), "camera.png")
    >>> Image.fromarray(skdata.camera()).save(png)
    >>> x = read_image(png)
    >>> x.shape, x.dtype, float(x.max()) <= 1.0
    ((512, 512, 1), dtype('float32'), True)
    """
    path = Path(path)
    _check_image_file(path)
    if path.suffix.lower() == ".dcm" or _has_dicom_magic(path):
        array = _read_dicom(path, max_pixels)
    else:
        array = _read_pil(path, max_pixels)
    if array.size == 0 or not np.isfinite(array).all():
        raise ImageReadError(path, "decoded image is empty or contains NaN values")
    return array


def read_images(
    paths: Iterable[str | os.PathLike],
    *,
    on_error: str = "raise",
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> tuple[list[np.ndarray | None], pd.DataFrame]:
    """Read many images with :func:`read_image`.

    Parameters
    ----------
    paths : iterable of paths
        The image files.
    on_error : {"raise", "skip"}
        ``"raise"``: the first failure raises :class:`ImageReadError`.
        ``"skip"``: a failed item is ``None`` in the list and listed, with its
        reason, in the returned ``skipped`` table (and logged).
    max_pixels : int
        Passed to :func:`read_image`.

    Returns
    -------
    images : list of ndarray or None
        In the order of ``paths``.
    skipped : DataFrame with columns ``path``, ``reason``
        Empty when every image was read.

    Examples
    --------
    >>> images, skipped = read_images(["a.png", "b.png"], on_error="skip")  # doctest: +SKIP
    >>> skipped  # doctest: +SKIP
    """
    if on_error not in ("raise", "skip"):
        raise InputError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    images: list[np.ndarray | None] = []
    skipped: list[dict[str, str]] = []
    for path in paths:
        try:
            images.append(read_image(path, max_pixels=max_pixels))
        except ImageReadError as exc:
            if on_error == "raise":
                raise
            images.append(None)
            skipped.append({"path": exc.path, "reason": exc.reason})
    table = pd.DataFrame(skipped, columns=["path", "reason"])
    if len(table):
        logger.warning("skipped %d unreadable image(s); first: %s (%s)", len(table),
                       table["path"].iloc[0], table["reason"].iloc[0])
    return images, table


# --------------------------------------------------------------------------- file properties

#: Columns of :func:`file_properties`, in order.
FILE_PROPERTY_COLUMNS = (
    "image_id", "readable", "file_size", "width", "height", "aspect", "pixels", "bytes_per_pixel",
    "format", "mode", "bit_depth", "n_channels", "n_frames",
    "jpeg_quality", "jpeg_progressive", "jpeg_subsampling",
    "png_chunks", "png_text_keys",
    "has_dpi", "has_exif", "has_icc", "has_comment",
    "dicom_manufacturer", "dicom_modality", "dicom_photometric_interpretation", "dicom_bits_stored",
    "dicom_bits_allocated", "dicom_pixel_spacing_row", "dicom_pixel_spacing_col", "dicom_transfer_syntax",
    "dicom_rows", "dicom_columns",
)

# The IJG (libjpeg) standard luminance quantisation table, natural (row-major) order.
_IJG_LUMINANCE = np.array([
    16, 11, 10, 16, 24, 40, 51, 61,
    12, 12, 14, 19, 26, 58, 60, 55,
    14, 13, 16, 24, 40, 57, 69, 56,
    14, 17, 22, 29, 51, 87, 80, 62,
    18, 22, 37, 56, 68, 109, 103, 77,
    24, 35, 55, 64, 81, 104, 113, 92,
    49, 64, 78, 87, 103, 121, 120, 101,
    72, 92, 95, 98, 112, 100, 103, 99,
], dtype=np.int64)
_JPEG_FORMATS = ("JPEG", "MPO")
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_TEXT_CHUNKS = (b"tEXt", b"zTXt", b"iTXt")
_SUBSAMPLING_NAMES = {0: "4:4:4", 1: "4:2:2", 2: "4:2:0"}
_MODE_BITS = {"1": 1, "I;16": 16, "I;16B": 16, "I;16L": 16, "I;16N": 16, "I": 32, "F": 32}


def _ijg_tables() -> np.ndarray:
    """Luminance tables libjpeg writes for quality 1..100 (baseline, clamped to 1..255)."""
    quality = np.arange(1, 101)
    scale = np.where(quality < 50, 5000 // quality, 200 - 2 * quality)
    tables = (_IJG_LUMINANCE[None, :] * scale[:, None] + 50) // 100
    return np.clip(tables, 1, 255)


_IJG_TABLES = _ijg_tables()


def _jpeg_quality(table: Sequence[int]) -> float:
    """IJG quality 1..100 whose scaled standard table is closest (mean absolute
    difference) to a file's luminance table; NaN without a 64-entry table."""
    values = np.asarray(list(table), dtype=np.int64)
    if values.size != 64:
        return float("nan")
    error = np.abs(_IJG_TABLES - values[None, :]).mean(axis=1)
    return float(np.argmin(error) + 1)


def _png_structure(path: Path) -> tuple[int | None, list[str], list[str]]:
    """(bit depth from IHDR, ancillary chunk names, text keywords) of a PNG file,
    seeking past image data (nothing is decompressed)."""
    import struct

    bit_depth: int | None = None
    chunks: set[str] = set()
    keys: set[str] = set()
    with open(path, "rb") as handle:
        if handle.read(8) != _PNG_SIGNATURE:
            return None, [], []
        for _ in range(1_000_000):
            head = handle.read(8)
            if len(head) < 8:
                break
            length, kind = struct.unpack(">I4s", head)
            if kind == b"IHDR":
                data = handle.read(length)
                if len(data) >= 9:
                    bit_depth = int(data[8])
                handle.seek(4, os.SEEK_CUR)
            elif kind in _PNG_TEXT_CHUNKS:
                data = handle.read(min(length, 80))
                keys.add(data.split(b"\0", 1)[0].decode("latin-1"))
                handle.seek(length - len(data) + 4, os.SEEK_CUR)
            else:
                handle.seek(length + 4, os.SEEK_CUR)
            name = kind.decode("latin-1")
            if name[:1].islower():
                chunks.add(name)
            if kind == b"IEND":
                break
    return bit_depth, sorted(chunks), sorted(keys)


def _pil_properties(path: Path) -> dict[str, Any]:
    from PIL import Image, JpegImagePlugin, UnidentifiedImageError

    with _PIL_LOCK:
        saved = Image.MAX_IMAGE_PIXELS
        Image.MAX_IMAGE_PIXELS = None  # headers only: no decompression-bomb check needed
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                im = Image.open(path)
        except UnidentifiedImageError:
            raise ImageReadError(path, "not an image (format not recognised)") from None
        except Exception as exc:
            raise ImageReadError(path, f"cannot open: {exc}") from None
        finally:
            Image.MAX_IMAGE_PIXELS = saved
    with im:
        fmt = str(im.format or "unknown").upper()
        info = im.info
        width, height = im.size
        row: dict[str, Any] = {
            "width": width, "height": height, "format": fmt, "mode": im.mode,
            "n_channels": len(im.getbands()),
        }
        try:
            row["n_frames"] = int(getattr(im, "n_frames", 1))
        except Exception:  # a broken frame index; the first frame is still there
            row["n_frames"] = 1
        bits = _MODE_BITS.get(im.mode, 8)
        text_keys = {str(k).lower() for k in info if isinstance(k, str)}
        if fmt == "PNG":
            png_bits, chunks, keys = _png_structure(path)
            bits = png_bits or bits
            row["png_chunks"] = "|".join(chunks)
            row["png_text_keys"] = "|".join(keys)
            text_keys |= {k.lower() for k in keys}
            row["has_dpi"] = "pHYs" in chunks or "dpi" in info
        elif fmt in _JPEG_FORMATS:
            # Pillow reports dpi=(72, 72) for a JPEG with EXIF but no resolution: look at the sources.
            exif_dpi = False
            if info.get("exif"):
                try:
                    exif_dpi = 0x011A in im.getexif()
                except Exception:
                    exif_dpi = False
            row["has_dpi"] = info.get("jfif_unit") in (1, 2) or exif_dpi
        else:
            row["has_dpi"] = "dpi" in info
        if fmt in _JPEG_FORMATS:
            bits = int(getattr(im, "bits", 8) or 8)
            tables = getattr(im, "quantization", None) or {}
            row["jpeg_quality"] = _jpeg_quality(tables[0]) if 0 in tables else float("nan")
            row["jpeg_progressive"] = bool(info.get("progressive") or info.get("progression"))
            if getattr(im, "layers", 0) == 3:
                sampling = JpegImagePlugin.get_sampling(im)
                if sampling in _SUBSAMPLING_NAMES:
                    row["jpeg_subsampling"] = _SUBSAMPLING_NAMES[sampling]
                else:  # a less common layout: the luminance and chroma sampling factors
                    row["jpeg_subsampling"] = ",".join(f"{h}x{v}" for _, h, v, _ in im.layer)
        elif fmt == "TIFF":
            tiff_bits, _ = _tiff_bits(im)
            bits = tiff_bits or bits
        row["bit_depth"] = bits
        row["has_exif"] = bool(info.get("exif"))
        row["has_icc"] = bool(info.get("icc_profile"))
        row["has_comment"] = bool(info.get("comment")) or "comment" in text_keys
    return row


def _dicom_number(value: Any, index: int | None = None) -> float:
    try:
        if index is not None:
            value = value[index]
        return float(value)
    except Exception:
        return float("nan")


def _dicom_properties(path: Path) -> dict[str, Any]:
    import pydicom

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ds = pydicom.dcmread(path, stop_before_pixels=True, force=not _has_dicom_magic(path))
    except Exception as exc:
        raise ImageReadError(path, f"not a valid DICOM file ({exc})") from None
    if "Rows" not in ds or "Columns" not in ds:
        raise ImageReadError(path, "DICOM file has no image (no Rows/Columns: a report or plan?)")
    try:
        return _dicom_header_row(ds)
    except Exception as exc:  # a malformed value in one of the tags read
        raise ImageReadError(path, f"malformed DICOM header ({exc})") from None


def _dicom_header_row(ds: Any) -> dict[str, Any]:
    rows, cols = int(ds.get("Rows") or 0), int(ds.get("Columns") or 0)
    frames = _dicom_number(ds.get("NumberOfFrames")) if "NumberOfFrames" in ds else 1.0
    spacing = ds.get("PixelSpacing") or ds.get("ImagerPixelSpacing")
    syntax = getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", None)
    bits_stored = _dicom_number(ds.get("BitsStored"))
    return {
        "width": cols, "height": rows, "format": "DICOM", "mode": None,
        "bit_depth": bits_stored if np.isfinite(bits_stored) else _dicom_number(ds.get("BitsAllocated")),
        "n_channels": int(ds.get("SamplesPerPixel") or 1),
        "n_frames": int(frames) if np.isfinite(frames) and frames >= 1 else 1,
        "has_dpi": False, "has_exif": False, "has_icc": "ICCProfile" in ds,
        "has_comment": bool(_header_text(ds, "ImageComments")),
        "dicom_manufacturer": _header_text(ds, "Manufacturer"),
        "dicom_modality": _header_text(ds, "Modality"),
        "dicom_photometric_interpretation": _header_text(ds, "PhotometricInterpretation"),
        "dicom_bits_stored": bits_stored,
        "dicom_bits_allocated": _dicom_number(ds.get("BitsAllocated")),
        "dicom_pixel_spacing_row": _dicom_number(spacing, 0) if spacing is not None else float("nan"),
        "dicom_pixel_spacing_col": _dicom_number(spacing, 1) if spacing is not None else float("nan"),
        "dicom_transfer_syntax": str(syntax) if syntax is not None else None,
        "dicom_rows": rows, "dicom_columns": cols,
    }


def _one_file_properties(path: Path) -> dict[str, Any]:
    size = _check_image_file(path)
    if path.suffix.lower() == ".dcm" or _has_dicom_magic(path):
        row = _dicom_properties(path)
    else:
        row = _pil_properties(path)
    width, height = row["width"], row["height"]
    if not width or not height:
        raise ImageReadError(path, f"image has zero size {width} x {height}")
    row["file_size"] = size
    row["pixels"] = width * height
    row["aspect"] = width / height
    row["bytes_per_pixel"] = size / (width * height)
    row["readable"] = True
    return row


def file_properties(
    manifest: pd.DataFrame,
    *,
    on_error: str = "raise",
    progress: bool | None = False,
) -> pd.DataFrame:
    """Properties of each image FILE (not of its anatomy), from headers only.

    These are what a classifier could use as a shortcut: how a site's
    archive stores its images (container, bit depth, compression settings,
    dimensions, metadata) rather than what the images show. Only headers are
    read: Pillow opens files lazily and PNG chunks are listed by seeking past
    the image data; DICOM files are read with ``stop_before_pixels=True``. No
    pixels are decoded, so truncated pixel data is not detected here (use
    :func:`read_images` for that).

    Parameters
    ----------
    manifest : DataFrame
        A manifest with a ``path`` column (absolute paths, as
        :func:`load_data` returns); ``image_id`` is copied when present.
    on_error : {"raise", "skip"}
        ``"raise"``: an unreadable file raises :class:`ImageReadError` naming
        it. ``"skip"``: its row gets ``readable=False`` and NaN everywhere
        else; skipped files are logged and listed, with reasons, in
        ``attrs["skipped"]`` (a DataFrame with ``path``, ``reason``).
    progress : bool or None
        Show a tqdm progress bar; None: only when stderr is a terminal.

    Returns
    -------
    DataFrame
        One row per manifest row, same index, columns
        :data:`FILE_PROPERTY_COLUMNS`:

        - ``image_id``, ``readable`` (bool);
        - ``file_size`` (bytes), ``width``, ``height`` (stored pixel
          dimensions, before any EXIF rotation), ``aspect`` (width / height),
          ``pixels``, ``bytes_per_pixel`` (file size / pixels);
        - ``format`` (``PNG``, ``JPEG``, ``MPO``, ``TIFF``, ``BMP``,
          ``DICOM``, ...), ``mode`` (Pillow mode; None for DICOM),
          ``bit_depth`` (bits per sample: PNG IHDR, JPEG precision, TIFF
          BitsPerSample, DICOM BitsStored), ``n_channels``, ``n_frames``;
        - ``jpeg_quality``: the IJG quality 1-100 whose standard luminance
          table, scaled as libjpeg scales it, is closest to the file's (exact
          for files written by libjpeg/Pillow, an estimate for other
          encoders); ``jpeg_progressive`` (bool); ``jpeg_subsampling``
          (``"4:4:4"``, ``"4:2:2"``, ``"4:2:0"``, else the sampling factors;
          NaN for grayscale) -- all NaN for non-JPEG files;
        - ``png_chunks``: sorted, ``|``-joined names of the ancillary chunks
          (``gAMA|pHYs|tEXt``; ``""`` when none); ``png_text_keys``: keywords
          of the text chunks -- NaN for non-PNG files;
        - ``has_dpi``, ``has_exif``, ``has_icc``, ``has_comment`` (bool);
        - for DICOM files, header tags ``dicom_manufacturer``,
          ``dicom_modality``, ``dicom_photometric_interpretation``,
          ``dicom_bits_stored``, ``dicom_bits_allocated``,
          ``dicom_pixel_spacing_row``/``_col`` (PixelSpacing, else
          ImagerPixelSpacing), ``dicom_transfer_syntax`` (UID),
          ``dicom_rows``, ``dicom_columns`` -- NaN for other files.

    Raises
    ------
    DataError
        The manifest has no ``path`` column.
    ImageReadError
        A file is missing, empty or not an image (with ``on_error="raise"``).
    InputError
        ``on_error`` is not ``"raise"`` or ``"skip"``.

    Examples
    --------
    >>> import tempfile
    >>> from crslib.phantom import generate_phantom
    >>> manifest = generate_phantom(tempfile.mkdtemp(), n_patients=6, image_size=32, seed=0)
    >>> props = file_properties(manifest)
    >>> bool(props.loc[props["format"] == "JPEG", "jpeg_quality"].isin([80.0, 92.0]).all())
    True
    >>> sorted(props["format"].unique())
    ['JPEG', 'PNG']
    """
    if on_error not in ("raise", "skip"):
        raise InputError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    if not isinstance(manifest, pd.DataFrame):
        raise DataError(f"file_properties needs a manifest DataFrame with a 'path' column, got {type(manifest).__name__}")
    if "path" not in manifest.columns:
        raise DataError(
            f"manifest has no 'path' column; columns present: {list(map(str, manifest.columns))}. "
            "Load the data with crslib.data.load_data to get one"
        )
    from tqdm import tqdm

    paths = [Path(str(p)) for p in manifest["path"]]
    if "image_id" in manifest.columns:
        ids = [str(v) for v in manifest["image_id"]]
    else:
        ids = [p.stem for p in paths]
    rows: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    show = progress_enabled(progress)
    for image_id, path in zip(ids, tqdm(paths, desc="file properties", unit="file", disable=not show)):
        try:
            row = _one_file_properties(path)
        except ImageReadError as exc:
            if on_error == "raise":
                raise
            skipped.append({"path": exc.path, "reason": exc.reason})
            row = {"readable": False}
        row["image_id"] = image_id
        rows.append(row)
    table = pd.DataFrame(rows, columns=list(FILE_PROPERTY_COLUMNS), index=manifest.index)
    table["readable"] = table["readable"].astype(bool)
    for column in ("file_size", "width", "height", "aspect", "pixels", "bytes_per_pixel", "bit_depth",
                   "n_channels", "n_frames", "jpeg_quality", "dicom_bits_stored", "dicom_bits_allocated",
                   "dicom_pixel_spacing_row", "dicom_pixel_spacing_col", "dicom_rows", "dicom_columns"):
        table[column] = pd.to_numeric(table[column], errors="coerce").astype(float)
    table.attrs["skipped"] = pd.DataFrame(skipped, columns=["path", "reason"])
    if skipped:
        logger.warning("file_properties: %d unreadable file(s) got readable=False; first: %s (%s)",
                       len(skipped), skipped[0]["path"], skipped[0]["reason"])
    return table
