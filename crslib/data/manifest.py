"""The manifest: the table that describes a data set, one row per image.

A manifest is a :class:`pandas.DataFrame` with one row per image and at least
the columns of :data:`MANIFEST_COLUMNS`. Targets are a single ``label`` column
and/or multi-label ``finding_*`` columns holding 0/1 integers; continuous
targets (``age``) and any other columns are kept as they are.

:func:`validate_manifest` checks a manifest and fills its optional columns;
:func:`check_files` checks that its image files exist; :func:`read_manifest` /
:func:`write_manifest` store it as CSV or Parquet with ``path`` values relative
to the manifest's folder, so a data folder can be moved or copied;
:func:`summarize_manifest` and :func:`select_examples` give the notebooks their
per-split counts and reproducible example rows.
"""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from crslib._io import atomic_write_bytes, atomic_write_text
from crslib.errors import DataError, InputError

logger = logging.getLogger(__name__)

__all__ = [
    "MANIFEST_COLUMNS",
    "check_files",
    "read_manifest",
    "select_examples",
    "summarize_manifest",
    "validate_manifest",
    "write_manifest",
]

#: Columns every validated manifest has, in this order (other columns follow).
MANIFEST_COLUMNS = ("image_id", "path", "patient_id", "split", "source", "view", "modality")

_REQUIRED = ("image_id", "path")
_FILL_DEFAULTS = {"split": "unspecified", "source": "unknown", "view": "unknown", "modality": "unknown"}
_NA_STRINGS = ["", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND",
               "1.#QNAN", "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"]
_STRING_COLUMNS = MANIFEST_COLUMNS


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
    random_state: int = 0,
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
    random_state : int
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
    rng = np.random.default_rng(random_state)
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

