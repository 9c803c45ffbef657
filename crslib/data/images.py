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
    "DEFAULT_FRAME",
    "DEFAULT_MAX_PIXELS",
    "FRAME_RULES",
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
# 2: pydicom's decoder plugins (JPEG lossless/extended, JPEG-LS, JPEG 2000), the middle frame of a
# multi-frame DICOM by default, native pixel data without a transfer syntax.
READER_VERSION = 2

#: How a multi-frame DICOM file becomes one image: ``"middle"`` (frame
#: ``n_frames // 2``, 0-based), ``"first"`` or ``"all"`` (the mean over
#: frames); see :func:`read_image`. Single-frame files read the same under each.
FRAME_RULES = ("middle", "first", "all")
#: The default rule: the middle frame (see :func:`read_image` for why).
DEFAULT_FRAME = "middle"

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


def _check_frame(frame: str) -> None:
    if not isinstance(frame, str) or frame not in FRAME_RULES:
        raise InputError(f"frame must be one of {', '.join(repr(r) for r in FRAME_RULES)}, got {frame!r}")


def _n_frames(ds: Any) -> int:
    try:
        return max(1, int(ds.get("NumberOfFrames") or 1))
    except (TypeError, ValueError):
        return 1


def _frame_index(n_frames: int, frame: str) -> int | None:
    """The frame ``frame`` selects (0-based); None for every frame."""
    if frame == "all" and n_frames > 1:
        return None
    return n_frames // 2 if frame == "middle" else 0


def _infer_transfer_syntax(ds: Any, path: Path) -> None:
    """Fill in a missing Transfer Syntax UID when the pixel data are native.

    Files without file meta information (ACR-NEMA style exports, stripped
    headers) have no transfer syntax, and pydicom then refuses to decode
    them; uncompressed pixel data are encoded as the rest of the data set,
    which the parser has already found out. Encapsulated (compressed) pixel
    data cannot be guessed and are left to fail with a clear reason.
    """
    from pydicom import uid
    from pydicom.dataset import FileMetaDataset

    meta = getattr(ds, "file_meta", None)
    if meta is not None and "TransferSyntaxUID" in meta:
        return
    element = ds["PixelData"] if "PixelData" in ds else None
    encoding = getattr(ds, "original_encoding", (None, None))
    if element is None or element.is_undefined_length or encoding[0] is None:
        return
    implicit, little = encoding
    if implicit and not little:
        return
    syntax = uid.ImplicitVRLittleEndian if implicit else (
        uid.ExplicitVRLittleEndian if little else uid.ExplicitVRBigEndian)
    if meta is None:
        ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = syntax
    logger.debug("%s: no transfer syntax in the file meta; native pixel data read as %s", path, syntax.name)


def _decode_failure(path: Path, exc: Exception, syntax_name: str) -> ImageReadError:
    """One line naming the file and why pydicom could not decode it."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    first = lines[0] if lines else type(exc).__name__
    # pydicom's two ways to say that no installed plugin handles the syntax
    if isinstance(exc, NotImplementedError) or "missing dependencies" in first:
        return ImageReadError(path, f"unsupported DICOM transfer syntax {syntax_name}: {first} "
                                    "(install the pylibjpeg or gdcm plugins for pydicom)")
    if first.startswith("Unable to decode as exceptions were raised by all available plugins"):
        return ImageReadError(path, f"cannot decode DICOM pixel data ({syntax_name}): every installed "
                                    f"decoder failed: {'; '.join(lines[1:])}")
    return ImageReadError(path, f"cannot decode DICOM pixel data ({syntax_name}): {first}")


def _read_dicom_dataset(path: Path, max_pixels: int, frame: str) -> tuple[Any, int | None]:
    """The parsed data set and the frame to decode (None: all of them)."""
    import pydicom

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ds = pydicom.dcmread(path, force=not _has_dicom_magic(path))
    except Exception as exc:
        raise ImageReadError(path, f"not a valid DICOM file ({exc})") from None
    if not any(k in ds for k in ("PixelData", "FloatPixelData", "DoubleFloatPixelData")):
        # pydicom reads a cut file up to where it ends and only warns
        cut = [str(w.message) for w in caught if "End of file" in str(w.message)]
        if cut:
            raise ImageReadError(path, f"truncated DICOM file: no pixel data before the end ({cut[0]})")
        raise ImageReadError(path, "DICOM file has no pixel data")
    try:
        rows, cols = int(ds.get("Rows") or 0), int(ds.get("Columns") or 0)
    except (TypeError, ValueError) as exc:
        raise ImageReadError(path, f"invalid DICOM Rows/Columns ({exc})") from None
    n_frames = _n_frames(ds)
    index = _frame_index(n_frames, frame)
    pixels = rows * cols * (n_frames if index is None else 1)
    if pixels > max_pixels:
        hint = " or read one frame (frame='middle')" if index is None else ""
        raise ImageReadError(path, f"image has {cols} x {rows} = {rows * cols} pixels"
                                   f"{f' x {n_frames} frames' if index is None else ''}, over "
                                   f"max_pixels={max_pixels}; pass a larger max_pixels if it is genuine{hint}")
    if "PixelData" in ds:
        _infer_transfer_syntax(ds, path)
    return ds, index


def _dicom_unit_range(arr: np.ndarray, ds: Any, path: Path, stacked: bool) -> np.ndarray:
    """Decoded DICOM pixels (one frame, or frames on axis 0 when ``stacked``)
    to float in [0, 1], (H, W) or (H, W, 3); frames are averaged."""
    from pydicom.pixels import apply_color_lut, apply_modality_lut, apply_voi_lut

    photometric = str(ds.get("PhotometricInterpretation", "")).strip().upper()
    frame_ndim = arr.ndim - 1 if stacked else arr.ndim
    try:
        if photometric == "PALETTE COLOR":
            rgb = apply_color_lut(arr, ds)
            scale = 65535.0 if rgb.dtype.itemsize > 1 else 255.0
            out = np.clip(rgb.astype(np.float64) / scale, 0.0, 1.0)
            return out.mean(axis=0) if stacked else out
        if frame_ndim == 3 and arr.shape[-1] == 3:
            bits = int(ds.get("BitsStored") or ds.get("BitsAllocated") or 8)
            out = arr.astype(np.float64) / (2.0**bits - 1)
            out = out.mean(axis=0) if stacked else out
            return _minmax(out) if out.min() < 0 or out.max() > 1 else out
        if frame_ndim != 2:
            raise ImageReadError(path, f"unsupported DICOM pixel array shape {arr.shape}")
        values = apply_modality_lut(arr, ds)
        values = np.asarray(apply_voi_lut(values, ds, index=0), dtype=np.float64)
        values = _minmax(values.mean(axis=0) if stacked else values)
        if photometric == "MONOCHROME1":
            values = 1.0 - values
        if not np.isfinite(values).all():
            raise ImageReadError(path, "DICOM pixel data contain NaN or infinite values")
        return values
    except ImageReadError:
        raise
    except Exception as exc:
        raise ImageReadError(path, f"cannot apply the DICOM LUTs ({photometric}): {exc}") from None


def _read_dicom(path: Path, max_pixels: int, frame: str = DEFAULT_FRAME) -> np.ndarray:
    from pydicom.pixels import pixel_array

    # pydicom warns (and logs) about every odd header value it meets; a
    # failure that matters becomes the ImageReadError's one-line reason.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds, index = _read_dicom_dataset(path, max_pixels, frame)
        syntax = getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", None)
        syntax_name = f"{syntax.name} ({syntax})" if syntax is not None else "unknown transfer syntax"
        try:
            arr = pixel_array(ds, index=index)
        except Exception as exc:
            raise _decode_failure(path, exc, syntax_name) from None
        return _as_hwc(_dicom_unit_range(arr, ds, path, stacked=index is None))


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


def read_image(
    path: str | os.PathLike, *, max_pixels: int = DEFAULT_MAX_PIXELS, frame: str = DEFAULT_FRAME
) -> np.ndarray:
    """Read an image file as float32 in [0, 1], shape (H, W, C), C = 1 or 3.

    PNG/JPEG/TIFF/BMP go through Pillow: 8-bit modes are divided by 255;
    16-bit modes (``I;16*``) by 65535; ``I`` (32-bit integer) by the declared
    bit depth when the file states one (TIFF ``BitsPerSample``, 16 for PNG),
    else min-max scaled; ``F`` kept when already in [0, 1], else min-max
    scaled. ``LA``/``RGBA`` are composited on black (alpha dropped);
    palette images are expanded (C = 1 when every used colour is gray); CMYK,
    YCbCr and other modes are converted to RGB; the EXIF orientation is
    applied. 16-bit RGB PNGs are reduced to 8 bits per channel by Pillow.

    DICOM files (suffix ``.dcm`` or ``DICM`` magic) go through pydicom and
    its decoder plugins (every standard transfer syntax: native, RLE, JPEG
    baseline, extended and lossless, JPEG-LS, JPEG 2000), offline: palette
    colour expanded; RGB and YBR (converted to RGB by pydicom) scaled by
    ``BitsStored``; grayscale gets the modality LUT / rescale, then the VOI
    LUT / window (the first one the file lists), then min-max to [0, 1],
    MONOCHROME1 inverted so that bright is dense. A file without a transfer
    syntax (no file meta) is read when its pixel data are uncompressed.
    A multi-frame file gives one image by the ``frame`` rule.

    Parameters
    ----------
    path : path
        The image file.
    max_pixels : int
        Largest image (width x height) decoded; larger ones raise, which
        guards against decompression bombs. Default 2e8
        (:data:`DEFAULT_MAX_PIXELS`), above Pillow's own default warning limit.
        With ``frame="all"`` the frames of a DICOM file count together.
    frame : {"middle", "first", "all"}
        Which frame of a multi-frame DICOM file (cine, ultrasound loop,
        enhanced CT/MR volume, tomosynthesis) is the image: ``"middle"``
        (default) frame ``n_frames // 2`` (0-based); ``"first"`` frame 0;
        ``"all"`` the mean over all frames of the LUT-applied values (an
        average-intensity projection), then min-max and MONOCHROME1 as for
        one frame. The middle is the default because the first frame is
        the least typical one: the edge slice of a volume, the lead-in of a
        loop before the contrast or the probe settles; it is also the usual
        key image of a stack. Ignored for single-frame files and other
        formats, so radiographs read the same under each rule.

    Returns
    -------
    ndarray of float32, shape (H, W, C)

    Raises
    ------
    ImageReadError
        With a short reason: missing or empty file, not an image, truncated
        data, too many pixels, DICOM without pixel data or with an
        unsupported transfer syntax, every decoder failing on the pixel
        data, ...
    InputError
        ``frame`` is not one of :data:`FRAME_RULES`.

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
    _check_frame(frame)
    path = Path(path)
    _check_image_file(path)
    if path.suffix.lower() == ".dcm" or _has_dicom_magic(path):
        array = _read_dicom(path, max_pixels, frame)
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
    frame: str = DEFAULT_FRAME,
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
    max_pixels, frame
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
    _check_frame(frame)
    images: list[np.ndarray | None] = []
    skipped: list[dict[str, str]] = []
    for path in paths:
        try:
            images.append(read_image(path, max_pixels=max_pixels, frame=frame))
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
