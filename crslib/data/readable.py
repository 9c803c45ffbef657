"""Readable images: which files of a manifest decode, so a run can leave out the others and list them.

A researcher's folder often holds files that are not images: DICOM objects
without pixel data (structured reports, presentation states), files a
decoder cannot read, truncated or broken files. :func:`drop_unreadable`
decodes every image of a manifest once (the answer is cached, keyed by each
file's path, size and modification time and by the reader's version) and
splits the manifest into the rows that decode and a table of the files left
out, each with its reason. The files the loader already left out (no image
in them at all, ``attrs["ignored_files"]``) are listed in the same table.

``strict=True`` stops at the first file that does not decode, with the
error :func:`~crslib.data.images.read_image` raises for it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd

from crslib._io import atomic_write_json, digest_of
from crslib.config import cache_dir
from crslib.data.images import READER_VERSION, read_image
from crslib.errors import ImageReadError, InputError

__all__ = ["NOT_AN_IMAGE", "SKIPPED_COLUMNS", "drop_unreadable", "skip_summary"]

#: The columns of the table of files left out.
SKIPPED_COLUMNS = ["image_id", "path", "reason"]
#: The reason given for a file the loader left out (no image in it).
NOT_AN_IMAGE = "no image in it (not an image file, or a DICOM object without Rows/Columns)"


def _file_key(path: str) -> list:
    try:
        stat = os.stat(path)
    except OSError:
        return [path, None, None]
    return [path, stat.st_size, stat.st_mtime_ns]


def _decode_failures(paths: list[str]) -> dict[str, str]:
    """``{path: reason}`` of the files that do not decode (cached)."""
    key = digest_of(["readable", READER_VERSION, [_file_key(p) for p in paths]])
    cached = cache_dir() / "readable" / f"{key}.json"
    if cached.is_file():
        return json.loads(cached.read_text(encoding="utf-8"))
    failures: dict[str, str] = {}
    for path in dict.fromkeys(paths):
        try:
            read_image(path)
        except ImageReadError as exc:
            failures[path] = exc.reason
    atomic_write_json(cached, failures)
    return failures


def drop_unreadable(manifest: pd.DataFrame, *, strict: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Split a manifest into the images that decode and the files left out.

    Parameters
    ----------
    manifest : DataFrame
        A validated manifest (:func:`crslib.data.load_data`).
    strict : bool
        Stop at the first image that does not decode (raise its
        :class:`~crslib.errors.ImageReadError`) instead of leaving it out.

    Returns
    -------
    kept : DataFrame
        The rows whose image decodes, in manifest order, index reset; its
        ``attrs`` are the manifest's, with ``"unreadable_files"`` (the number
        left out) added.
    skipped : DataFrame
        One row per file left out (:data:`SKIPPED_COLUMNS`): the rows that do
        not decode, then the files the loader found no image in
        (``image_id`` empty), each with its reason.

    Raises
    ------
    ImageReadError
        ``strict=True`` and an image does not decode.
    InputError
        No image of the manifest decodes (the message gives the first reasons).

    Examples
    --------
    >>> import tempfile, numpy as np
    >>> from pathlib import Path
    >>> from PIL import Image
    >>> from crslib.data import load_data
    >>> folder = Path(tempfile.mkdtemp())
    >>> Image.fromarray(np.zeros((8, 8), np.uint8)).save(folder / "a.png")
    >>> _ = (folder / "b.png").write_bytes(b"not a png")
    >>> kept, skipped = drop_unreadable(load_data(folder))
    >>> list(kept["image_id"]), list(skipped["image_id"])
    (['a'], ['b'])
    """
    paths = manifest["path"].astype(str).tolist()
    if strict:
        for path in paths:
            read_image(path)
        failures: dict[str, str] = {}
    else:
        failures = _decode_failures(paths)
    bad = manifest["path"].astype(str).isin(failures)
    skipped = manifest.loc[bad, ["image_id", "path"]].astype(str).copy()
    skipped["reason"] = skipped["path"].map(failures)
    ignored = pd.DataFrame({"image_id": "", "path": list(manifest.attrs.get("ignored_files", [])),
                            "reason": NOT_AN_IMAGE})
    skipped = pd.concat([skipped, ignored], ignore_index=True)[SKIPPED_COLUMNS]
    if len(manifest) and bad.all():
        first = "; ".join(f"{Path(p).name}: {failures[p]}" for p in paths[:3])
        raise InputError(f"none of the {len(manifest)} images decodes (first: {first})")
    kept = manifest.loc[~bad].reset_index(drop=True)
    kept.attrs = dict(manifest.attrs, unreadable_files=int(bad.sum()))
    return kept, skipped


def skip_summary(skipped: pd.DataFrame, *, top: int = 5, width: int = 120) -> pd.DataFrame:
    """The reasons files were left out, most common first: ``reason``, ``files``, ``example``.

    A reason longer than ``width`` characters is cut there (with "..."), so the
    table fits a page; the table of every file keeps it whole.

    Examples
    --------
    >>> table = pd.DataFrame({"image_id": ["a", "b", ""], "path": ["x/a.dcm", "x/b.dcm", "x/c.txt"],
    ...                       "reason": ["no pixel data", "no pixel data", "no image"]})
    >>> skip_summary(table).to_dict("records")[0]
    {'reason': 'no pixel data', 'files': 2, 'example': 'a.dcm'}
    """
    if skipped.empty:
        return pd.DataFrame(columns=["reason", "files", "example"])
    grouped = skipped.groupby("reason", sort=False)["path"]
    table = pd.DataFrame({"files": grouped.size(), "example": grouped.first().map(lambda p: Path(p).name)})
    table = table.reset_index().sort_values(["files", "reason"], ascending=[False, True], kind="stable")
    table["reason"] = table["reason"].map(lambda r: r if len(r) <= width else r[:width - 3].rstrip() + "...")
    return table.head(top).reset_index(drop=True)
