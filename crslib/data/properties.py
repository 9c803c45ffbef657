"""File forensics: how each image FILE is stored, from its headers only.

:func:`file_properties` gives one row per manifest row with the columns of
:data:`FILE_PROPERTY_COLUMNS`: container and pixel dimensions, bit depth,
JPEG quality (matched against the IJG tables), progressive mode and chroma
subsampling, PNG ancillary chunks and text keywords, DPI/EXIF/ICC/comment
flags and DICOM header tags. These are what a shortcut classifier could use
instead of the anatomy (see :mod:`crslib.audit`). No pixel data is decoded.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from crslib.config import progress_enabled
from crslib.data.images import _PIL_LOCK, _check_image_file, _has_dicom_magic, _header_text, _tiff_bits
from crslib.errors import DataError, ImageReadError, InputError

logger = logging.getLogger(__name__)

__all__ = ["FILE_PROPERTY_COLUMNS", "file_properties"]

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
    >>> from crslib.data.phantom import generate_phantom
    >>> manifest = generate_phantom(tempfile.mkdtemp(), n_patients=6, image_size=32, random_state=0)
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
