"""Robust image reading: one image file in, a float32 array in [0, 1] out.

:func:`read_image` reads one file (PNG/JPEG/TIFF/BMP through Pillow, DICOM
through pydicom) into a float32 array in [0, 1] of shape (H, W, C), C = 1 or
3, and raises :class:`~crslib.errors.ImageReadError` with a short reason on
any failure; :func:`read_images` reads many and lists the ones it skipped.
:func:`is_image_file` and :func:`is_dicom_file` tell which files are read as
images at all. :data:`READER_VERSION` is part of every embedding cache key.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from crslib.errors import ImageReadError, InputError

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "IMAGE_SUFFIXES",
    "READER_VERSION",
    "is_dicom_file",
    "is_image_file",
    "read_image",
    "read_images",
]

#: File suffixes read as images (case-insensitive). Files without one of these
#: suffixes are still read as DICOM when they carry the ``DICM`` magic at byte 128.
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".dcm")

#: Largest image :func:`read_image` decodes, in pixels (width x height).
DEFAULT_MAX_PIXELS = 200_000_000
# Part of every embedding cache key: bump it whenever read_image decodes any file differently.
READER_VERSION = 1

_PIL_LOCK = threading.Lock()


# --------------------------------------------------------------------------- file kinds


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


def _header_text(ds: Any, keyword: str) -> str | None:
    """A DICOM header value as stripped text; None when absent or blank."""
    value = ds.get(keyword)
    if value is None:
        return None
    text = str(value).strip()
    return text or None


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
