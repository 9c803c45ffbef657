"""Duplicate detection primitives of the leakage audit: which pairs of images are the same picture.

Three ways of telling, each a function from per-image values to pairs of rows:

- :func:`digest_pairs` on :func:`pixel_digest`: a SHA-256 digest of the grey
  pixels at full resolution, as :func:`crslib.data.read_image` decodes them
  (never the file bytes, so the container, its metadata and a lossless
  re-encoding do not matter). Equal digests are *exact duplicates*: the same
  pixels stored as PNG and BMP, as 8 or 16 bits, or as grey and as RGB with
  equal channels.
- :func:`hash_pairs` on :func:`perceptual_hashes`: a 64-bit DCT perceptual
  hash (pHash) of the image and of small crops of it. Hashes within a few
  bits of each other are *near duplicates*: a JPEG copy at another quality,
  a resized copy, a copy with a few per cent cropped off any side.
- :func:`embedding_pairs`: cosine similarity of embeddings above a
  threshold calibrated on the within-split nearest neighbours.

The pHash is the standard one: the grey image area-averaged to 32 x 32, its
orthonormal 2-D DCT-II, the top-left 8 x 8 coefficients (the lowest
frequencies, DC included), one bit per coefficient: above their median.
Plain pHash tolerates re-encoding and resizing but not cropping: cutting 2
pixels off each side of a 64-pixel tile (3 %) moves its hash by 8 of 64 bits
on average and by 20 or more for some tiles. So each image is also hashed with each side
trimmed by every fraction of :data:`DEFAULT_CROP_FRACTIONS` (81 crops), and
a pair's distance is the smallest Hamming distance between a crop of one
and the whole of the other. A copy cropped by up to about 5 % per side then
lies within a few bits of a crop of its original.

A hash is only as stable as its coefficients are far from their median: in
a flat or very smooth image most coefficients sit near it, and re-encoding
noise flips many bits. An image is *unstable* when more than
:data:`MAX_FRAGILE_COEFFICIENTS` of its 64 coefficients lie within
:data:`STABILITY_MARGIN` of the median. Two unstable images are not
compared for near duplicates (flat images share degenerate hashes); a stable
and an unstable one are (a re-encoded copy of a stable image can turn
unstable); an unstable crop falls back to the whole image's hash. Exact
duplicates are found regardless.

:func:`image_fingerprints` reads the files of a manifest (one at a time, so
memory stays flat) and is the only function here that touches files. The
findings, clusters and the audit built on these are in :mod:`crslib.leakage`.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd

from crslib._validation import as_embeddings, check_open_unit
from crslib.data.images import DEFAULT_MAX_PIXELS, read_image
from crslib.data.manifest import validate_manifest
from crslib.errors import ImageReadError, InputError

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_CROP_FRACTIONS",
    "DEFAULT_EMBEDDING_RATIO",
    "DEFAULT_MAX_DISTANCE",
    "MAX_FRAGILE_COEFFICIENTS",
    "STABILITY_MARGIN",
    "ImageFingerprints",
    "digest_pairs",
    "embedding_pairs",
    "hash_pairs",
    "image_fingerprints",
    "perceptual_hashes",
    "phash",
    "pixel_digest",
]

#: Fractions of the height or width trimmed from each side when hashing crops
#: (every combination of the four sides: 81 crops, the uncropped image included).
DEFAULT_CROP_FRACTIONS = (0.0, 0.025, 0.05)
#: Largest Hamming distance (of 64 bits) at which two images are near duplicates. Stricter than
#: the customary 8 of plain pHash because the distance is the smallest of 2 * 81 comparisons: on
#: the 215 stable tiles of ``tests/realdata.py``, JPEG (quality 30-95), resized and cropped copies
#: lay within 6 bits of their originals in all but 11 of 2,580 cases, while a copy came within
#: 8 bits of another tile in 20 cases and within 6 in 3.
DEFAULT_MAX_DISTANCE = 6
#: Embedding pairs closer than this fraction of the median within-split nearest-neighbour
#: cosine distance are near duplicates.
DEFAULT_EMBEDDING_RATIO = 0.25
#: A DCT coefficient this close to the median (grey levels in [0, 1]; the
#: orthonormal DCT keeps the per-pixel noise level) can flip under re-encoding noise.
STABILITY_MARGIN = 0.01
#: More coefficients than this within :data:`STABILITY_MARGIN` of the median make a hash unstable.
MAX_FRAGILE_COEFFICIENTS = 12

_WORK = 128  # grey working image every file is area-resampled to; crops are cut from it
_THUMB = 32  # pHash thumbnail side
_SIDE = 8  # top-left DCT block: 64 bits
_BLOCK_ELEMENTS = 1 << 22  # pairs compared per block
_QUANTILES = (0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99)
_MIN_COSINE_DISTANCE = 1e-9  # exact embedding copies always match, even when the calibrated threshold is 0


# --------------------------------------------------------------------------- pixels


def _grey(image: Any) -> np.ndarray:
    """The image as a finite 2-D float64 array: channels averaged, alpha not expected."""
    arr = np.asarray(image)
    if arr.dtype.kind not in "fiub":
        raise InputError(f"image must hold numbers, got dtype {arr.dtype}")
    if arr.ndim == 3:
        arr = arr.astype(np.float64).mean(axis=2)
    if arr.ndim != 2 or arr.size == 0:
        raise InputError(f"image must be a non-empty 2-D (H, W) or 3-D (H, W, C) array, got shape {arr.shape}")
    arr = arr.astype(np.float64, copy=False)
    if not np.isfinite(arr).all():
        raise InputError("image has NaN or infinite values")
    return arr


def pixel_digest(image: Any) -> str:
    """SHA-256 digest of an image's grey pixels: equal for exact duplicates.

    Channels are averaged and the grey values, in [0, 1] as
    :func:`crslib.data.read_image` returns them, are rounded to 16 bits, so
    the same picture stored as PNG or BMP, as 8 or 16 bits, or as grey or
    RGB with equal channels gets one digest. The image's height and width
    are part of it; no resizing happens (a resized copy is a near duplicate,
    not an exact one).

    Parameters
    ----------
    image : ndarray of shape (H, W) or (H, W, C)
        Values in [0, 1].

    Returns
    -------
    str
        64 hex digits.

    Raises
    ------
    InputError
        Values outside [0, 1], NaN, or not an image-shaped array.

    Examples
    --------
    >>> import numpy as np
    >>> grey = np.linspace(0, 1, 12).reshape(3, 4)
    >>> pixel_digest(grey) == pixel_digest(np.repeat(grey[:, :, None], 3, axis=2))
    True
    """
    grey = _grey(image)
    if grey.min() < 0.0 or grey.max() > 1.0:
        raise InputError(f"pixel_digest needs values in [0, 1] as read_image returns them, got "
                         f"{grey.min():g} to {grey.max():g}; divide 8-bit pixels by 255")
    quantized = np.round(grey * 65535.0).astype("<u2")
    digest = hashlib.sha256(f"{grey.shape[0]}x{grey.shape[1]}:".encode())
    digest.update(quantized.tobytes())
    return digest.hexdigest()


# --------------------------------------------------------------------------- perceptual hash


def _check_crop_fractions(crop_fractions: Any) -> tuple[float, ...]:
    try:
        fractions = tuple(float(f) for f in crop_fractions)
    except (TypeError, ValueError):
        raise InputError(f"crop_fractions must be a sequence of numbers, got {crop_fractions!r}") from None
    if not fractions or fractions[0] != 0.0 or any(b <= a for a, b in zip(fractions, fractions[1:])):
        raise InputError(f"crop_fractions must start with 0.0 and increase, e.g. (0.0, 0.025, 0.05); "
                         f"got {crop_fractions!r}")
    if fractions[-1] >= 0.25:
        raise InputError(f"crop_fractions must stay below 0.25 (a quarter of the side), got {fractions[-1]}")
    return fractions


def _area_matrix(lo: float, hi: float) -> np.ndarray:
    """(_THUMB, _WORK) weights averaging the interval [lo, hi) of the working grid into _THUMB equal bins."""
    edges = lo + (hi - lo) * np.arange(_THUMB + 1) / _THUMB
    pixel = np.arange(_WORK)
    overlap = np.minimum(edges[1:, None], pixel + 1.0) - np.maximum(edges[:-1, None], pixel)
    weights = np.clip(overlap, 0.0, None)
    return weights / weights.sum(axis=1, keepdims=True)


def _dct_matrix() -> np.ndarray:
    """First _SIDE rows of the orthonormal DCT-II matrix of size _THUMB."""
    k = np.arange(_SIDE)[:, None]
    n = np.arange(_THUMB)[None, :]
    matrix = np.sqrt(2.0 / _THUMB) * np.cos(np.pi * (2 * n + 1) * k / (2 * _THUMB))
    matrix[0] /= np.sqrt(2.0)
    return matrix


@lru_cache(maxsize=8)
def _projections(fractions: tuple[float, ...]) -> tuple[np.ndarray, int]:
    """(S, 8, _WORK) maps from working-image rows (or columns) to the low DCT frequencies of each
    one-axis crop, and the index of the uncropped one; S = len(fractions) ** 2 (start, end) trims."""
    trims = [(a, b) for a in fractions for b in fractions]
    dct = _dct_matrix()
    stack = np.stack([dct @ _area_matrix(a * _WORK, _WORK - b * _WORK) for a, b in trims])
    return stack, trims.index((0.0, 0.0))


def _identity_index(fractions: tuple[float, ...]) -> int:
    """Index of the uncropped image among the V = S * S crops (vertical trim major)."""
    trims, untrimmed = len(fractions) ** 2, _projections(fractions)[1]
    return untrimmed * trims + untrimmed


def _working_image(image: Any) -> np.ndarray:
    from PIL import Image

    grey = _grey(image).astype(np.float32)
    resized = Image.fromarray(grey, mode="F").resize((_WORK, _WORK), Image.Resampling.BOX)
    return np.asarray(resized, dtype=np.float64)


def _coefficients(image: Any, fractions: tuple[float, ...]) -> tuple[np.ndarray, int]:
    """(V, 64) low-frequency DCT coefficients of every crop, and the index of the uncropped image."""
    proj = _projections(fractions)[0]
    work = _working_image(image)
    rows = np.einsum("skh,hw->skw", proj, work)  # crop and transform the rows of every vertical trim
    coefs = np.einsum("skw,tlw->stkl", rows, proj)  # then the columns of every horizontal trim
    n = proj.shape[0]
    return coefs.reshape(n * n, _SIDE * _SIDE), _identity_index(fractions)


def perceptual_hashes(image: Any, *, crop_fractions: Any = DEFAULT_CROP_FRACTIONS) -> tuple[np.ndarray, int, bool]:
    """The pHash of an image and of its crops.

    Parameters
    ----------
    image : ndarray of shape (H, W) or (H, W, C)
        Values in [0, 1] (any scale works; :data:`STABILITY_MARGIN` assumes [0, 1]).
    crop_fractions : sequence of float
        Fractions trimmed from each side; every combination of the four
        sides is hashed. Starts with 0.0. ``(0.0,)``: the plain pHash only.

    Returns
    -------
    hashes : ndarray of uint64, shape (len(crop_fractions) ** 4,)
        An unstable crop (see the module notes) gets the uncropped image's hash.
    identity : int
        Index of the uncropped image's hash.
    stable : bool
        Whether the uncropped image's hash is stable.

    Examples
    --------
    >>> from skimage import data
    >>> image = data.camera() / 255.0
    >>> hashes, identity, stable = perceptual_hashes(image)
    >>> hashes.shape, int(hashes[identity]) == phash(image), stable
    ((81,), True, True)
    """
    fractions = _check_crop_fractions(crop_fractions)
    coefs, identity = _coefficients(image, fractions)
    median = np.median(coefs, axis=1, keepdims=True)
    fragile = (np.abs(coefs - median) < STABILITY_MARGIN).sum(axis=1) > MAX_FRAGILE_COEFFICIENTS
    hashes = np.packbits(coefs > median, axis=1).view(">u8")[:, 0].astype(np.uint64)
    hashes = np.where(fragile, hashes[identity], hashes)
    return hashes, identity, not bool(fragile[identity])


def phash(image: Any) -> int:
    """The 64-bit pHash of an image (no crops), as an int.

    The grey image is area-averaged to 128 x 128 and then 32 x 32, transformed
    by the orthonormal 2-D DCT-II; bit ``8 * i + j`` (counted from the most
    significant) is whether coefficient ``(i, j)`` of the top-left 8 x 8
    block exceeds the block's median.

    Examples
    --------
    >>> from skimage import data
    >>> f"{phash(data.camera() / 255.0):016x}"
    'bff1c1c0434e8cbc'
    """
    hashes, identity, _ = perceptual_hashes(image, crop_fractions=(0.0,))
    return int(hashes[identity])


# --------------------------------------------------------------------------- fingerprints of a manifest


@dataclass
class ImageFingerprints:
    """Fingerprints of a manifest's images, row by row; from :func:`image_fingerprints`.

    Attributes
    ----------
    image_ids : ndarray of object, shape (n,)
    digests : ndarray of object, shape (n,)
        :func:`pixel_digest` per row; None where the file could not be read.
    hashes : ndarray of uint64, shape (n, V)
        :func:`perceptual_hashes` per row (zeros where unread).
    identity : int
        Column of ``hashes`` holding the uncropped image's hash.
    stable : ndarray of bool, shape (n,)
        Readable with a stable hash (see the module notes).
    crop_fractions : tuple of float
    skipped : DataFrame
        Unreadable files: ``image_id``, ``path``, ``reason``.
    """

    image_ids: np.ndarray
    digests: np.ndarray = field(repr=False)
    hashes: np.ndarray = field(repr=False)
    identity: int
    stable: np.ndarray = field(repr=False)
    crop_fractions: tuple[float, ...] = DEFAULT_CROP_FRACTIONS
    skipped: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=["image_id", "path", "reason"]))

    @property
    def readable(self) -> np.ndarray:
        """Rows whose file was read."""
        return np.array([d is not None for d in self.digests], dtype=bool)

    def table(self) -> pd.DataFrame:
        """One row per image: ``image_id``, ``digest``, ``phash`` (16 hex digits), ``stable``, ``readable``."""
        readable = self.readable
        return pd.DataFrame({
            "image_id": self.image_ids,
            "digest": self.digests,
            "phash": [f"{int(h):016x}" if ok else None for h, ok in zip(self.hashes[:, self.identity], readable)],
            "stable": self.stable,
            "readable": readable,
        })


def image_fingerprints(
    manifest: pd.DataFrame,
    *,
    crop_fractions: Any = DEFAULT_CROP_FRACTIONS,
    on_error: str = "skip",
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> ImageFingerprints:
    """Read every image of a manifest and fingerprint it.

    Parameters
    ----------
    manifest : DataFrame
        With ``image_id`` and ``path`` (relative paths are resolved as
        :func:`crslib.data.validate_manifest` resolves them).
    crop_fractions : sequence of float
        See :func:`perceptual_hashes`.
    on_error : {"skip", "raise"}
        ``"skip"``: an unreadable file is listed in ``skipped`` and left out
        of every comparison; ``"raise"``: the first one raises
        :class:`~crslib.errors.ImageReadError`.
    max_pixels : int
        Passed to :func:`crslib.data.read_image`.

    Returns
    -------
    ImageFingerprints

    Raises
    ------
    DataError
        The manifest has no ``image_id`` or ``path`` column, or no rows.

    Examples
    --------
    >>> fingerprints = image_fingerprints(load_data("chest_xray/"))  # doctest: +SKIP
    >>> fingerprints.table().head()  # doctest: +SKIP
    """
    if on_error not in ("raise", "skip"):
        raise InputError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    fractions = _check_crop_fractions(crop_fractions)
    table = validate_manifest(manifest)
    n = len(table)
    n_hashes = len(fractions) ** 4
    digests = np.full(n, None, dtype=object)
    hashes = np.zeros((n, n_hashes), dtype=np.uint64)
    stable = np.zeros(n, dtype=bool)
    identity = _identity_index(fractions)
    skipped = []
    for row, (image_id, path) in enumerate(zip(table["image_id"], table["path"])):
        try:
            image = read_image(path, max_pixels=max_pixels)
        except ImageReadError as exc:
            if on_error == "raise":
                raise
            skipped.append({"image_id": image_id, "path": exc.path, "reason": exc.reason})
            continue
        digests[row] = pixel_digest(image)
        hashes[row], _, stable[row] = perceptual_hashes(image, crop_fractions=fractions)
        if (row + 1) % 1000 == 0:
            logger.info("fingerprinted %d of %d images", row + 1, n)
    if skipped:
        logger.warning("skipped %d unreadable image(s); first: %s (%s)", len(skipped), skipped[0]["path"],
                       skipped[0]["reason"])
    return ImageFingerprints(image_ids=table["image_id"].to_numpy(dtype=object), digests=digests, hashes=hashes,
                             identity=int(identity), stable=stable, crop_fractions=fractions,
                             skipped=pd.DataFrame(skipped, columns=["image_id", "path", "reason"]))


# --------------------------------------------------------------------------- matching


def _crop_distances(hashes: np.ndarray, identity: int, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """(len(rows), len(cols)) smallest Hamming distance between a crop of one image and the whole other."""
    out = np.full((rows.size, cols.size), 64, dtype=np.uint8)
    whole_rows = hashes[rows, identity][:, None]
    whole_cols = hashes[cols, identity][None, :]
    for v in range(hashes.shape[1]):
        np.minimum(out, np.bitwise_count(hashes[rows, v][:, None] ^ whole_cols), out=out)
        np.minimum(out, np.bitwise_count(whole_rows ^ hashes[cols, v][None, :]), out=out)
    return out


def hash_pairs(
    hashes: Any,
    *,
    identity: int = 0,
    max_distance: int = DEFAULT_MAX_DISTANCE,
    stable: Any = None,
    groups: Any = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All pairs of images whose crop-tolerant pHash distance is at most ``max_distance``.

    The distance of images ``a`` and ``b`` is the smallest Hamming distance
    between the hash of a crop of one and the uncropped hash of the other,
    over every crop of both. Cost: ``n**2 * V`` bit counts (V crops), in
    blocks of bounded memory; a few seconds for 6,000 images with 81 crops.

    Parameters
    ----------
    hashes : array of uint64, shape (n, V) or (n,)
        Per image, as :func:`perceptual_hashes` returns them.
    identity : int
        Column of ``hashes`` holding the uncropped hash.
    max_distance : int
        0-64.
    stable : array-like of bool, shape (n,), optional
        Whether each hash is stable; a pair of two unstable hashes is not
        compared (flat images share degenerate hashes). Default: all stable.
    groups : array-like of shape (n,), optional
        A group (split) per image: the nearest-neighbour distance within the
        own group is returned for calibration.

    Returns
    -------
    pairs : ndarray of int, shape (m, 2)
        Row indices ``a < b``.
    distances : ndarray of int, shape (m,)
    nearest_in_group : ndarray of int, shape (n,)
        Each image's smallest distance to another image of its group (65
        when it has none; all 65 without ``groups``).

    Examples
    --------
    >>> import numpy as np
    >>> pairs, distances, _ = hash_pairs(np.array([0b1111, 0b0111, 2**64 - 1], dtype=np.uint64))
    >>> pairs.tolist(), distances.tolist()
    ([[0, 1]], [1])
    """
    h = np.asarray(hashes)
    if h.ndim == 1:
        h = h[:, None]
    if h.ndim != 2 or h.dtype != np.uint64:
        raise InputError(f"hashes must be a uint64 array of shape (n,) or (n, V), got {h.dtype} {h.shape}")
    if isinstance(max_distance, bool) or not isinstance(max_distance, (int, np.integer)) or not 0 <= max_distance <= 64:
        raise InputError(f"max_distance must be an integer from 0 to 64, got {max_distance!r}")
    if not 0 <= identity < h.shape[1]:
        raise InputError(f"identity={identity} is not a column of hashes (shape {h.shape})")
    n = h.shape[0]
    steady = np.ones(n, dtype=bool) if stable is None else np.asarray(stable, dtype=bool)
    if steady.shape != (n,):
        raise InputError(f"stable must hold one flag per image ({n}), got shape {steady.shape}")
    codes = None
    if groups is not None:
        values = np.asarray(groups, dtype=object)
        if values.shape != (n,):
            raise InputError(f"groups must hold one value per image ({n}), got shape {values.shape}")
        codes = pd.factorize(values)[0]
    nearest = np.full(n, 65, dtype=np.int64)
    found_pairs, found_dist = [], []
    step = max(1, _BLOCK_ELEMENTS // max(1, n))
    for start in range(0, n, step):
        rows = np.arange(start, min(n, start + step))
        cols = np.arange(start, n)
        dist = _crop_distances(h, identity, rows, cols).astype(np.int64)
        upper = (cols[None, :] > rows[:, None]) & (steady[rows][:, None] | steady[cols][None, :])
        a, b = np.nonzero(upper & (dist <= max_distance))
        found_pairs.append(np.column_stack([rows[a], cols[b]]))
        found_dist.append(dist[a, b])
        if codes is not None:
            same = upper & (codes[rows][:, None] == codes[cols][None, :])
            masked = np.where(same, dist, 65)
            np.minimum.at(nearest, rows, masked.min(axis=1))
            np.minimum.at(nearest, cols, masked.min(axis=0))
    pairs = np.concatenate(found_pairs).astype(np.int64) if found_pairs else np.empty((0, 2), dtype=np.int64)
    distances = np.concatenate(found_dist) if found_dist else np.empty(0, dtype=np.int64)
    return pairs.reshape(-1, 2), distances, nearest


def digest_pairs(digests: Any) -> np.ndarray:
    """All pairs ``a < b`` of rows with equal, non-missing digests (exact duplicates).

    Examples
    --------
    >>> digest_pairs(["x", "y", "x", None, "x"]).tolist()
    [[0, 2], [0, 4], [2, 4]]
    """
    rows_of: dict[Any, list[int]] = {}
    for row, digest in enumerate(np.asarray(digests, dtype=object)):
        if digest is not None and not (isinstance(digest, float) and np.isnan(digest)):
            rows_of.setdefault(digest, []).append(row)
    found = [(a, b) for rows in rows_of.values() for i, a in enumerate(rows) for b in rows[i + 1:]]
    pairs = np.array(sorted(found), dtype=np.int64)
    return pairs.reshape(-1, 2)


# --------------------------------------------------------------------------- embeddings


def _unit_rows(X: Any, n: int | None) -> np.ndarray:
    arr = as_embeddings(X, name="embeddings", dtype=np.float64)
    if n is not None and arr.shape[0] != n:
        raise InputError(f"embeddings have {arr.shape[0]} rows but the manifest has {n}; pass one embedding "
                         "per manifest row, in the manifest's order")
    norms = np.linalg.norm(arr, axis=1)
    zero = np.flatnonzero(norms == 0)
    if zero.size:
        raise InputError(f"embeddings have {zero.size} all-zero row(s) (first rows {zero[:5].tolist()}); "
                         "cosine similarity is undefined for them: re-extract or drop those images")
    return arr / norms[:, None]


def _blocks(n: int) -> list[np.ndarray]:
    step = max(1, _BLOCK_ELEMENTS // max(1, n))
    return [np.arange(s, min(n, s + step)) for s in range(0, n, step)]


def _nearest_in_split(unit: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Cosine of each row's nearest other row in its own split (NaN when alone in its split)."""
    nearest = np.full(unit.shape[0], np.nan)
    for rows in _blocks(unit.shape[0]):
        sims = unit[rows] @ unit.T
        sims[codes[rows][:, None] != codes[None, :]] = -np.inf
        sims[np.arange(rows.size), rows] = -np.inf
        best = sims.max(axis=1)
        nearest[rows] = np.where(np.isfinite(best), best, np.nan)
    return nearest


def _embedding_calibration(nearest: np.ndarray, splits: np.ndarray, ratio: float,
                           threshold: float | None) -> tuple[float, dict[str, Any]]:
    """The cosine threshold and the numbers it came from."""
    valid = np.isfinite(nearest)
    if threshold is None and not valid.any():
        raise InputError("no split has two images with embeddings, so the threshold cannot be calibrated; "
                         "pass threshold=<cosine similarity>")
    distances = 1.0 - nearest[valid]
    median_distance = float(np.median(distances)) if valid.any() else float("nan")
    if threshold is None:
        cut = max(ratio * median_distance, _MIN_COSINE_DISTANCE)
        threshold = 1.0 - cut
    by_split = {}
    for split in dict.fromkeys(splits.tolist()):
        own = valid & (splits == split)
        by_split[split] = {"n": int((splits == split).sum()),
                           "median_nn_cosine": float(np.median(nearest[own])) if own.any() else None}
    calibration = {
        "rule": "cosine >= 1 - ratio * median over images of (1 - cosine of the nearest other image in the "
                "same split)",
        "ratio": ratio,
        "n_calibration_images": int(valid.sum()),
        "median_nn_cosine": 1.0 - median_distance,
        "median_nn_distance": median_distance,
        "nn_cosine_quantiles": {str(q): float(np.quantile(nearest[valid], q)) if valid.any() else None
                                for q in _QUANTILES},
        "by_split": by_split,
        "threshold": float(threshold),
        "fraction_with_match_in_split": float((nearest[valid] >= threshold).mean()) if valid.any() else None,
    }
    return float(threshold), calibration


def _cosine_pairs(unit: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    found, scores = [], []
    n = unit.shape[0]
    for rows in _blocks(n):
        sims = unit[rows] @ unit.T
        a, b = np.nonzero((sims >= threshold) & (np.arange(n)[None, :] > rows[:, None]))
        found.append(np.column_stack([rows[a], b]))
        scores.append(sims[a, b])
    return np.concatenate(found).astype(np.int64), np.concatenate(scores)


def embedding_pairs(
    X: Any,
    split: Any,
    *,
    ratio: float = DEFAULT_EMBEDDING_RATIO,
    threshold: float | None = None,
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """All pairs of rows whose embeddings' cosine similarity reaches a threshold calibrated per split.

    With ``d`` the cosine distance (1 - cosine) of each image's nearest other
    image in its own split, and ``m`` the median of ``d`` over all images,
    the threshold is ``1 - ratio * m`` (see
    :func:`crslib.leakage.embedding_near_duplicates` for why).

    Parameters
    ----------
    X : array-like of shape (n, d)
    split : array-like of shape (n,)
    ratio : float
        In (0, 1).
    threshold : float, optional
        A cosine similarity to use instead (the calibration is still reported).

    Returns
    -------
    pairs : ndarray of int, shape (m, 2)
        Rows ``a < b``, in any splits.
    cosines : ndarray of float, shape (m,)
    calibration : dict
        ``threshold``, ``threshold_source``, ``ratio``, ``median_nn_cosine``,
        ``median_nn_distance``, ``nn_cosine_quantiles``, ``by_split``,
        ``n_calibration_images``, ``fraction_with_match_in_split``.

    Examples
    --------
    >>> import numpy as np
    >>> X = np.random.default_rng(0).normal(size=(100, 64))
    >>> X[99] = X[0] * 3
    >>> pairs, cosines, calibration = embedding_pairs(X, ["train"] * 100)
    >>> pairs.tolist(), bool(calibration["threshold"] > calibration["median_nn_cosine"])
    ([[0, 99]], True)
    """
    unit = _unit_rows(X, None)
    splits = np.array([str(s) for s in np.asarray(split, dtype=object).ravel()], dtype=object)
    if np.ndim(split) != 1 or splits.size != unit.shape[0]:
        raise InputError(f"split must hold one split name per embedding row ({unit.shape[0]}), "
                         f"got shape {np.shape(split)}")
    ratio = check_open_unit(ratio, "ratio", "0.25")
    if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))
                                  or not -1.0 <= threshold <= 1.0):
        raise InputError(f"threshold must be a cosine similarity between -1 and 1, got {threshold!r}")
    nearest = _nearest_in_split(unit, pd.factorize(splits)[0])
    cut, calibration = _embedding_calibration(nearest, splits, ratio, threshold)
    calibration["threshold_source"] = "calibrated" if threshold is None else "given"
    pairs, cosines = _cosine_pairs(unit, cut)
    return pairs, cosines, calibration
