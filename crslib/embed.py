"""Batched embedding extraction with a content-addressed, resumable cache.

:func:`extract_embeddings` reads the images a manifest lists, preprocesses
them for an :class:`~crslib.models.Encoder`, runs the encoder in batches and
returns one row per image in manifest order.

The cache
---------
Results are cached under ``cache_root`` (default ``cache_dir()/"embeddings"``)
and keyed by content only:

* the encoder's :meth:`~crslib.models.Encoder.fingerprint` (backend,
  architecture, the weight file's SHA-256 or a hash of the state dict, and the
  preprocessing),
* :data:`EMBEDDING_FORMAT_VERSION`,
* the SHA-256 of each image file's bytes (never its name, path or mtime).

A changed image or weight file misses; an unchanged data set hits even after
its folder was moved or renamed. The manifest's rows (with a readable file)
are cut into shards of ``shard_size`` images, in manifest order; a shard's key
is the digest of the encoder fingerprint and its images' hashes, and each
shard is written (atomically) as soon as it is computed, so an interrupted
run resumes with the finished shards and returns exactly the array an
uninterrupted run returns. A damaged shard file is detected, logged and
recomputed. Image hashes are remembered per data set by
``(path, size, mtime_ns)``, so a repeat run only ``stat``\\ s the files.

Layout::

    <cache_root>/shards/<key[:2]>/<key>.npy    float32 (rows, dim)
    <cache_root>/shards/<key[:2]>/<key>.json   rows, dim, failed rows (reasons)
    <cache_root>/hashes/<dataset>.json         path -> [size, mtime_ns, sha256]
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

import crslib  # noqa: F401  (applies the torchvision import fix before torch)
from crslib._io import atomic_save_npy, atomic_write_json, digest_of, file_sha256
from crslib._validation import as_embeddings
from crslib.config import cache_dir, progress_enabled
from crslib.models import Encoder
from crslib.errors import DataError, ImageReadError, InputError, ModelError

log = logging.getLogger(__name__)

__all__ = [
    "EMBEDDING_FORMAT_VERSION", "Embeddings", "STORE_DTYPES", "extract_embeddings", "image_hashes", "load_embeddings",
    "save_embeddings",
]

#: Bump when the way embeddings are computed or stored changes; old cache
#: entries are then ignored.
EMBEDDING_FORMAT_VERSION = 1

_HASH_INDEX_VERSION = 1


@dataclass
class Embeddings:
    """Embeddings of a manifest's images.

    Attributes
    ----------
    X : ndarray of float32, shape (N, D)
        One row per image, in manifest order, skipped images removed.
    image_ids : ndarray
        ``image_id`` of each row of ``X``.
    skipped : DataFrame
        Columns ``image_id``, ``path``, ``reason``: images that could not be
        read (``on_error="skip"``); empty when none.
    key : str
        Content key of the whole result (encoder fingerprint, format version,
        image bytes).
    cache_hit : bool
        True when every shard came from the cache.
    seconds : float
        Wall time of the call.
    encoder_name : str
        Canonical name of the encoder.
    n_computed : int
        Images encoded by this call (0 on a full cache hit).
    """

    X: np.ndarray
    image_ids: np.ndarray
    skipped: pd.DataFrame
    key: str
    cache_hit: bool
    seconds: float
    encoder_name: str = ""
    n_computed: int = 0
    shards: dict[str, int] = field(default_factory=dict)

    def __repr__(self) -> str:
        return (
            f"Embeddings(X={self.X.shape}, skipped={len(self.skipped)}, cache_hit={self.cache_hit}, "
            f"key={self.key[:12]!r}, seconds={self.seconds:.2f})"
        )


# --------------------------------------------------------------------------- image hashes


def _hash_index_path(root: Path, paths: list[str]) -> Path:
    dirs = sorted({os.path.dirname(p) for p in paths})
    try:
        common = os.path.commonpath(dirs) if dirs else ""
    except ValueError:  # mixed drives
        common = "|".join(dirs[:1])
    return root / "hashes" / f"{digest_of(['dataset', common])[:24]}.json"


def _load_hash_index(path: Path) -> dict[str, list]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("version") == _HASH_INDEX_VERSION and isinstance(data.get("files"), dict):
            return data["files"]
    except FileNotFoundError:
        pass
    except (OSError, ValueError, AttributeError) as exc:
        log.warning("ignoring unreadable image-hash index %s (%s)", path, exc)
    return {}


def image_hashes(
    paths: list[str], *, index_file: Path | None = None
) -> tuple[list[str | None], dict[int, str]]:
    """SHA-256 of each file's bytes, reusing ``index_file`` entries whose
    ``(size, mtime_ns)`` still match.

    Returns
    -------
    hashes : list of str or None
        ``None`` where the file cannot be read.
    failures : dict
        Position -> reason for those files.
    """
    index = _load_hash_index(index_file) if index_file is not None else {}
    updated = False
    hashes: list[str | None] = []
    failures: dict[int, str] = {}
    for pos, path in enumerate(paths):
        try:
            st = os.stat(path)
        except FileNotFoundError:
            hashes.append(None)
            failures[pos] = "no such file"
            continue
        except OSError as exc:
            hashes.append(None)
            failures[pos] = f"cannot access: {exc.strerror or exc}"
            continue
        entry = index.get(path)
        if entry is not None and entry[0] == st.st_size and entry[1] == st.st_mtime_ns:
            hashes.append(entry[2])
            continue
        try:
            value = file_sha256(path)
        except IsADirectoryError:
            hashes.append(None)
            failures[pos] = "is a folder, not an image file"
            continue
        except OSError as exc:
            hashes.append(None)
            failures[pos] = f"cannot read: {exc.strerror or exc}"
            continue
        hashes.append(value)
        index[path] = [st.st_size, st.st_mtime_ns, value]
        updated = True
    if index_file is not None and updated:
        try:
            atomic_write_json(index_file, {"version": _HASH_INDEX_VERSION, "files": index})
        except OSError as exc:
            log.warning("cannot write image-hash index %s (%s)", index_file, exc)
    return hashes, failures


# --------------------------------------------------------------------------- shards


@dataclass
class _Shard:
    key: str
    positions: list[int]  # manifest positions, in order
    X: np.ndarray | None = None
    failed: dict[int, str] = field(default_factory=dict)  # local index -> reason
    from_cache: bool = False
    dim: int | None = None  # of a cached shard whose rows stay on disk until assembly (X is None)


def _shard_files(root: Path, key: str) -> tuple[Path, Path]:
    folder = root / "shards" / key[:2]
    return folder / f"{key}.npy", folder / f"{key}.json"


def _load_shard(root: Path, shard: _Shard, *, keep: bool = True) -> bool:
    """Check a cached shard where it lies (memory-mapped: no copy of it in memory) and record it;
    ``keep`` also reads its rows into ``shard.X``, else they are read at assembly
    (:func:`_shard_rows`), so a cache of many shards never sits in memory beside the result."""
    npy, meta_path = _shard_files(root, shard.key)
    if not npy.exists() or not meta_path.exists():
        return False
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        X = np.load(npy, mmap_mode="r", allow_pickle=False)
        rows, dim = int(meta["rows"]), int(meta["dim"])
        if X.dtype != np.float32 or X.shape != (rows, dim) or rows != len(shard.positions):
            raise ValueError(f"shape {X.shape} {X.dtype}, expected ({len(shard.positions)}, {dim}) float32")
        failed = {int(k): str(v) for k, v in meta.get("failed", {}).items()}
        ok = np.ones(rows, dtype=bool)
        ok[list(failed)] = False
        if not np.isfinite(X[ok]).all():
            raise ValueError("non-finite values")
        X = np.array(X) if keep else None  # np.array copies: the mapping (and its file handle) goes now
    except Exception as exc:  # noqa: BLE001 - any damage means: recompute
        log.warning("cache shard %s is damaged (%s); recomputing it", npy, exc)
        return False
    shard.X, shard.failed, shard.from_cache, shard.dim = X, failed, True, dim
    return True


def _shard_rows(root: Path, shard: _Shard) -> np.ndarray:
    """The rows of a shard: in memory, or read from the cache file :func:`_load_shard` checked."""
    if shard.X is not None:
        return shard.X
    return np.load(_shard_files(root, shard.key)[0], mmap_mode="r", allow_pickle=False)


def _save_shard(root: Path, shard: _Shard, encoder_name: str) -> None:
    npy, meta_path = _shard_files(root, shard.key)
    try:
        atomic_save_npy(npy, shard.X)
        atomic_write_json(
            meta_path,
            {
                "format": EMBEDDING_FORMAT_VERSION,
                "rows": int(shard.X.shape[0]),
                "dim": int(shard.X.shape[1]),
                "failed": {str(k): v for k, v in sorted(shard.failed.items())},
                "encoder": encoder_name,
            },
        )
    except OSError as exc:
        log.warning("cannot write cache shard %s (%s); continuing without caching it", npy, exc)


# --------------------------------------------------------------------------- data loading


class _ImageDataset:
    """Map-style dataset: position -> (position, image or None, reason)."""

    def __init__(self, paths: list[str], frame: str = "middle"):
        self.paths = paths
        self.frame = frame

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, pos: int):
        from crslib.data import read_image

        path = self.paths[pos]
        try:
            return pos, read_image(path, frame=self.frame), None
        except ImageReadError as exc:
            return pos, None, _one_line(exc.reason)
        except Exception as exc:  # noqa: BLE001 - name the file whatever went wrong
            return pos, None, _one_line(f"{type(exc).__name__}: {exc}")


def _one_line(text: str) -> str:
    return " ".join(str(text).split())[:500]


class _Collate:
    """Turn a list of dataset items into (positions, batch tensor, errors);
    preprocessing happens here, batched, so it runs in the worker."""

    def __init__(self, preprocess_batch):
        self.preprocess_batch = preprocess_batch

    def __call__(self, items):
        positions, images, errors = [], [], {}
        for pos, image, reason in items:
            if image is None:
                errors[pos] = reason
            else:
                positions.append(pos)
                images.append(image)
        batch = None
        if images and self.preprocess_batch is not None:
            try:
                batch = self.preprocess_batch(images)
            except Exception:  # noqa: BLE001 - find the image at fault, one at a time
                ok_pos, ok_img = [], []
                for pos, image in zip(positions, images):
                    try:
                        self.preprocess_batch([image])
                        ok_pos.append(pos)
                        ok_img.append(image)
                    except Exception as exc:  # noqa: BLE001
                        errors[pos] = f"cannot preprocess ({type(exc).__name__}: {exc})"
                positions, images = ok_pos, ok_img
                batch = self.preprocess_batch(images) if images else None
            images = None
        return positions, batch if batch is not None else images, errors


def _default_workers(n_images: int) -> int:
    # Measured on the 2-core reference machine (bench/bench_embed.py): with
    # small images decoding is a few percent of the forward pass, and a worker
    # process only competes with torch's threads for the cores; so 0 unless the
    # machine has cores to spare and the job is large.
    cpus = os.cpu_count() or 1
    if cpus <= 2 or n_images < 256:
        return 0
    return min(4, cpus // 4)


# --------------------------------------------------------------------------- main entry


def _runtime() -> dict[str, Any]:
    """Versions that can change the numbers: the image reader's and the
    numerical runtime's (a torch upgrade may change convolution results in
    the last bits; an old cache must not pass for a fresh computation). ONNX
    encoders add the onnxruntime version to their own fingerprint."""
    import torch

    import crslib.data as data

    return {"torch": torch.__version__.split("+")[0], "reader": data.READER_VERSION}


def _validate(manifest: Any, encoder: Any, batch_size: int, shard_size: int, on_error: str,
              num_workers: int | None) -> None:
    if not isinstance(manifest, pd.DataFrame):
        raise DataError(f"manifest must be a pandas DataFrame, got {type(manifest).__name__}")
    missing = [c for c in ("image_id", "path") if c not in manifest.columns]
    if missing:
        raise DataError(
            f"manifest lacks column(s) {', '.join(missing)}; load it with crslib.data.load_data or add them"
        )
    if manifest["path"].isna().any():
        raise DataError("manifest has rows without a path; fix or drop them")
    if not isinstance(encoder, Encoder):
        raise InputError(
            f"encoder must be a crslib Encoder (load_encoder(spec) or TorchEncoder), got {type(encoder).__name__}"
        )
    if on_error not in ("raise", "skip"):
        raise InputError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    for label, value in (("batch_size", batch_size), ("shard_size", shard_size)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise InputError(f"{label} must be a positive integer, got {value!r}")
    if num_workers is not None and (
        isinstance(num_workers, bool) or not isinstance(num_workers, (int, np.integer)) or num_workers < 0
    ):
        raise InputError(f"num_workers must be a non-negative integer or None, got {num_workers!r}")


def extract_embeddings(
    manifest: pd.DataFrame,
    encoder: Encoder,
    *,
    batch_size: int = 64,
    num_workers: int | None = None,
    cache: bool = True,
    cache_root: str | os.PathLike | None = None,
    shard_size: int = 512,
    on_error: str = "raise",
    progress: bool | None = None,
    scheduler: Any = None,
    device: str | None = None,
    amp: bool = False,
    frame: str = "middle",
) -> Embeddings:
    """Embed every image of a manifest with an encoder, using the cache.

    Parameters
    ----------
    manifest : DataFrame
        At least the columns ``image_id`` and ``path`` (absolute paths, as
        :func:`crslib.data.load_data` returns them).
    encoder : Encoder
        From :func:`crslib.models.load_encoder` or a
        :class:`~crslib.models.TorchEncoder`.
    batch_size : int
        Images per forward pass (default 64).
    num_workers : int, optional
        DataLoader worker processes for reading and preprocessing. ``None``
        chooses: 0 on machines with two cores or fewer (measured fastest there,
        see ``bench/bench_embed.py``).
    cache : bool
        Read and write the embedding cache (default True). The key is computed
        either way.
    cache_root : path, optional
        Cache folder; default ``cache_dir() / "embeddings"``.
    shard_size : int
        Images per cache shard (default 512); the unit of resumption.
    on_error : {"raise", "skip"}
        ``"raise"``: the first unreadable image raises
        :class:`~crslib.errors.ImageReadError` naming the file. ``"skip"``:
        such images are left out of ``X``, listed in ``skipped`` and logged.
    progress : bool, optional
        Show a tqdm bar; default: only when stderr is a terminal.
    scheduler : None, "local[:N]", a Dask scheduler address or a distributed.Client
        Where the missing shards are computed (see :mod:`crslib.cluster`):
        ``None`` here, in this process; otherwise each shard is one Dask task
        that reads its images, encodes them and writes the shard to the cache
        (``num_workers`` and ``progress`` then do not apply). The result is
        the same array either way.
    device : {"auto", "cpu", "cuda", "mps"}, optional
        Where the encoder computes (:func:`crslib.device.resolve_device`);
        the encoder is moved there and stays there. ``None`` (default): where
        it is (the CPU for a freshly loaded encoder). The device is not part
        of the cache key: float32 embeddings from a GPU equal the CPU's up to
        rounding, within a max absolute deviation of 1e-3 times the largest
        absolute value (the tolerance stated in
        :meth:`~crslib.models.TorchEncoder.to`, checked by
        ``bench/bench_device.py`` on a GPU: 6.1e-7 for a ResNet-18 on an
        NVIDIA H200), so a cached shard serves every device.
        With a ``scheduler`` the workers compute on this device
        (resolved here); a worker without it fails with a one-line error.
    amp : bool
        Mixed precision (autocast: float16 on a GPU, bfloat16 on the CPU),
        off by default. It changes the numbers, so the cache key includes it
        (its type: bfloat16 and float16 entries differ too). Measured on the
        CPU (bfloat16) against float32 on 193 phantom images:
        ``timm:resnet18?size=64`` (random init) max absolute deviation
        0.0039 (0.6% of the largest value), 10-NN overlap 0.990;
        ``public:efficientnet_lite0`` (ImageNet weights, 224 px) 0.67 (13%
        of the largest value, mean cosine 0.9967), 10-NN overlap 0.931. The
        stated tolerance (tested for resnet18): max absolute deviation
        within 2% of the largest absolute value; for pretrained networks
        with large activations expect more. bfloat16 is not faster on a CPU
        without AMX; use it on a GPU. Torch encoders only (ONNX ignores it,
        and the key then does not change).
    frame : {"middle", "first", "all"}
        Which frame of a multi-frame DICOM file is the image
        (:func:`crslib.data.read_image`; default the middle one). A rule other
        than the default is part of the cache key, so changing it recomputes.

    Returns
    -------
    Embeddings

    Raises
    ------
    ImageReadError
        An image cannot be read (``on_error="raise"``).
    ModelError
        The encoder returns NaN/inf values or a wrong shape.
    DataError, InputError
        Bad manifest or options.

    Examples
    --------
    A tiny encoder (8 channels, so ``D = 8``) on a 12-image phantom; the
    second call reads every shard from the cache:

    >>> import tempfile, crslib, torch
    >>> from crslib.models import Preprocessing, TorchEncoder
    >>> from crslib.data.phantom import generate_phantom
    >>> manifest = generate_phantom(tempfile.mkdtemp(), n_patients=3, image_size=32, random_state=0)
    >>> _ = torch.manual_seed(0)
    >>> net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU())
    >>> encoder = TorchEncoder(net, name="tiny",
    ...                        preprocessing=Preprocessing((3, 32, 32), (0.5,) * 3, (0.25,) * 3, "bilinear", 3))
    >>> cache = tempfile.mkdtemp()
    >>> emb = extract_embeddings(manifest, encoder, cache_root=cache, progress=False)
    >>> emb.X.shape, emb.X.dtype, len(manifest)
    ((12, 8), dtype('float32'), 12)
    >>> list(emb.image_ids) == list(manifest["image_id"]), emb.cache_hit
    (True, False)
    >>> again = extract_embeddings(manifest, encoder, cache_root=cache, progress=False)
    >>> again.cache_hit, again.n_computed, bool((again.X == emb.X).all())
    (True, 0, True)
    """
    t0 = time.perf_counter()
    _validate(manifest, encoder, batch_size, shard_size, on_error, num_workers)
    frame_key = _frame_key(frame)
    if len(manifest) == 0:
        raise DataError("manifest has no rows; nothing to embed")
    root = Path(cache_root) if cache_root is not None else cache_dir() / "embeddings"
    paths = [os.path.abspath(os.path.expanduser(str(p))) for p in manifest["path"].tolist()]
    ids = manifest["image_id"].to_numpy()

    # 1. content hashes (cheap on a repeat run: a stat per file)
    index_file = _hash_index_path(root, paths) if cache else None
    hashes, failures = image_hashes(paths, index_file=index_file)

    # 2. shards of readable files, in manifest order
    encoder.to(encoder.device if device is None else device, amp=amp)
    fingerprint = digest_of([encoder.fingerprint(), _runtime(), *_precision(encoder), *frame_key])
    readable = [pos for pos, h in enumerate(hashes) if h is not None]
    shards: list[_Shard] = []
    for start in range(0, len(readable), shard_size):
        positions = readable[start:start + shard_size]
        key = digest_of([EMBEDDING_FORMAT_VERSION, fingerprint, [hashes[p] for p in positions]])
        shards.append(_Shard(key, positions))
    key = digest_of([EMBEDDING_FORMAT_VERSION, fingerprint, [s.key for s in shards]])

    if cache:
        for shard in shards:
            _load_shard(root, shard, keep=False)
    if on_error == "raise":
        # Fail before computing anything when a file is missing or a cached
        # shard remembers an unreadable image: the first in manifest order.
        known = dict(failures)
        for shard in shards:
            if shard.from_cache:
                known.update({shard.positions[local]: reason for local, reason in shard.failed.items()})
        if known:
            pos = min(known)
            raise ImageReadError(paths[pos], known[pos])

    # 3. compute the missing shards
    todo = [s for s in shards if not s.from_cache]
    n_computed = 0
    if todo and scheduler is not None:
        n_computed = _compute_shards_on_cluster(
            todo, paths, ids, encoder, root=root, cache=cache, batch_size=batch_size, on_error=on_error,
            scheduler=scheduler, device=encoder.device, amp=encoder.amp, frame=frame,
        )
    elif todo:
        n_computed = _compute_shards(
            todo, paths, ids, encoder, root=root, cache=cache, batch_size=batch_size,
            num_workers=num_workers, on_error=on_error, progress=progress, frame=frame,
        )

    # 4. assemble in manifest order
    dim = next((s.X.shape[1] if s.X is not None else s.dim for s in shards if s.X is not None or s.dim), None)
    if dim is None:
        dim = int(encoder.embedding_dim)
    row_of: dict[int, tuple[_Shard, int]] = {}
    for shard in shards:
        for local, pos in enumerate(shard.positions):
            if local not in shard.failed:
                row_of[pos] = (shard, local)
        for local, reason in shard.failed.items():
            failures[shard.positions[local]] = reason
    kept = [pos for pos in range(len(paths)) if pos in row_of]
    X = np.empty((len(kept), dim), dtype=np.float32)
    cursor = 0
    for shard in shards:
        ok = np.array([local not in shard.failed for local in range(len(shard.positions))], dtype=bool)
        block = _shard_rows(root, shard)[ok]
        X[cursor:cursor + len(block)] = block
        cursor += len(block)
    skipped = pd.DataFrame(
        [{"image_id": ids[pos], "path": paths[pos], "reason": failures[pos]} for pos in sorted(failures)],
        columns=["image_id", "path", "reason"],
    )
    if len(skipped):
        log.warning(
            "skipped %d unreadable image(s) of %d; first: %s (%s)",
            len(skipped), len(paths), skipped["path"].iloc[0], skipped["reason"].iloc[0],
        )
    cache_hit = bool(cache and shards and not todo)
    seconds = time.perf_counter() - t0
    log.info(
        "%d embeddings (dim %d) from %s: %s, %d computed, %.2f s",
        len(kept), dim, encoder.name, "cache hit" if cache_hit else "computed", n_computed, seconds,
    )
    return Embeddings(
        X=X, image_ids=ids[kept], skipped=skipped, key=key, cache_hit=cache_hit, seconds=seconds,
        encoder_name=encoder.name, n_computed=n_computed,
        shards={"total": len(shards), "from_cache": len(shards) - len(todo), "computed": len(todo)},
    )


def _precision(encoder: Encoder) -> list[dict[str, str]]:
    """Cache-key entries for mixed precision: none in float32 (so keys made
    before ``amp`` existed stay valid), the autocast type when it is on."""
    if not encoder.amp:
        return []
    from crslib.device import autocast_dtype

    return [{"amp": autocast_dtype(encoder.device)}]


def _frame_key(frame: str) -> list[dict[str, str]]:
    """Cache-key entries for the multi-frame DICOM rule: none for the
    default, so that keys of the default stay as they were."""
    from crslib.data.images import DEFAULT_FRAME, FRAME_RULES

    if frame not in FRAME_RULES:
        raise InputError(f"frame must be one of {', '.join(repr(r) for r in FRAME_RULES)}, got {frame!r}")
    return [] if frame == DEFAULT_FRAME else [{"frame": frame}]


def _preprocess_fn(encoder: Encoder, in_worker: bool):
    """The batch preprocessing to run inside the DataLoader (None: do it in
    the main process because the encoder overrides it and may not pickle)."""
    if type(encoder).preprocess_batch is Encoder.preprocess_batch and (
        type(encoder).preprocess is Encoder.preprocess
    ):
        return encoder.preprocessing.apply_batch
    if not in_worker:
        return encoder.preprocess_batch
    return None


def _compute_shards(todo: list[_Shard], paths: list[str], ids: np.ndarray, encoder: Encoder, *, root: Path,
                    cache: bool, batch_size: int, num_workers: int | None, on_error: str,
                    progress: bool | None, frame: str = "middle") -> int:
    from torch.utils.data import DataLoader
    from tqdm import tqdm

    n_images = sum(len(s.positions) for s in todo)
    workers = _default_workers(n_images) if num_workers is None else int(num_workers)
    # Batches never cross a shard boundary, so a shard is computed from the
    # same batches whether or not the run was interrupted before it.
    batches: list[list[int]] = []
    shard_of_batch: list[int] = []
    for i, shard in enumerate(todo):
        for start in range(0, len(shard.positions), batch_size):
            batches.append(shard.positions[start:start + batch_size])
            shard_of_batch.append(i)
    preprocess = _preprocess_fn(encoder, in_worker=workers > 0)
    loader = DataLoader(
        _ImageDataset(paths, frame),
        batch_sampler=batches,
        num_workers=workers,
        collate_fn=_Collate(preprocess),
        persistent_workers=False,
        pin_memory=False,
    )
    pending: dict[int, dict[str, Any]] = {}
    done = 0
    bar = tqdm(total=n_images, desc=f"embed {encoder.name}", unit="img", disable=not progress_enabled(progress),
               leave=False)
    try:
        for b, (positions, batch, errors) in enumerate(loader):
            shard_index = shard_of_batch[b]
            shard = todo[shard_index]
            if errors:
                if on_error == "raise":
                    pos = min(errors)
                    raise ImageReadError(paths[pos], errors[pos])
                for pos, reason in errors.items():
                    log.info("skipping unreadable image %s (%s)", paths[pos], reason)
            state = pending.setdefault(shard_index, {"rows": {}, "failed": dict(errors)})
            if errors:
                state["failed"].update(errors)
            if positions:
                if isinstance(batch, list):
                    batch = encoder.preprocess_batch(batch)
                emb = encoder.encode(batch)
                emb = np.asarray(emb, dtype=np.float32)
                if emb.ndim != 2 or emb.shape[0] != len(positions):
                    raise ModelError(
                        f"model {encoder.name} returned an array of shape {emb.shape} for a batch of "
                        f"{len(positions)} images; expected ({len(positions)}, D)"
                    )
                bad = ~np.isfinite(emb).all(axis=1)
                if bad.any():
                    first = [str(ids[p]) for p, flag in zip(positions, bad) if flag][:5]
                    raise ModelError(
                        f"model {encoder.name} produced NaN or infinite embeddings for {int(bad.sum())} "
                        f"image(s), first: {', '.join(first)}; check the weights and the input normalisation"
                    )
                for pos, row in zip(positions, emb):
                    state["rows"][pos] = row
                done += len(positions)
            bar.update(len(positions) + len(errors))
            if len(state["rows"]) + len(state["failed"]) == len(shard.positions):
                _finish_shard(shard, state, encoder)
                del pending[shard_index]
                if cache:
                    _save_shard(root, shard, encoder.name)
    finally:
        bar.close()
        del loader
    return done


def _shard_task(paths: list[str], ids: list[Any], key: str, *, encoder: Encoder, root: str, cache: bool,
                batch_size: int, on_error: str, device: str = "cpu",
                amp: bool = False, frame: str = "middle") -> tuple[np.ndarray, dict[int, str]]:
    """One shard as a Dask task: its images, encoded, written to the cache.

    Computed exactly as in-process (the same batches: they never cross a
    shard boundary), so the rows do not depend on where the shard ran. The
    worker computes on ``device`` (resolved by the client) with ``amp``.
    """
    encoder.to(device, amp=amp)
    shard = _Shard(key, list(range(len(paths))))
    # another task, run or machine may have finished this shard meanwhile
    if cache and _load_shard(Path(root), shard):
        return shard.X, shard.failed
    _compute_shards([shard], paths, np.asarray(ids, dtype=object), encoder, root=Path(root), cache=cache,
                    batch_size=batch_size, num_workers=0, on_error=on_error, progress=False, frame=frame)
    return shard.X, shard.failed


def _compute_shards_on_cluster(todo: list[_Shard], paths: list[str], ids: np.ndarray, encoder: Encoder, *,
                               root: Path, cache: bool, batch_size: int, on_error: str, scheduler: Any,
                               device: str = "cpu", amp: bool = False, frame: str = "middle") -> int:
    from crslib.cluster import open_client, run_tasks

    def finished(i: int, result: tuple[np.ndarray, dict[int, str]]) -> None:
        shard = todo[i]
        shard.X, shard.failed = result
        # a worker with another cache folder (another machine) wrote its own
        # copy; this one keeps the shard too, so a later local run reuses it
        if cache and not _shard_files(root, shard.key)[0].exists():
            _save_shard(root, shard, encoder.name)

    tasks = [([paths[p] for p in s.positions], [ids[p] for p in s.positions], s.key) for s in todo]
    with open_client(scheduler) as client:
        run_tasks(
            client, _shard_task, tasks,
            shared={"encoder": encoder, "root": str(root), "cache": cache, "batch_size": batch_size,
                    "on_error": on_error, "device": device, "amp": amp, "frame": frame},
            keys=[f"crs-embed-{s.key}" for s in todo],
            on_result=finished,
        )
    return sum(len(s.positions) - len(s.failed) for s in todo)


def _finish_shard(shard: _Shard, state: dict[str, Any], encoder: Encoder) -> None:
    pos_to_local = {pos: local for local, pos in enumerate(shard.positions)}
    rows = state["rows"]
    dim = len(next(iter(rows.values()))) if rows else int(encoder.embedding_dim)
    X = np.zeros((len(shard.positions), dim), dtype=np.float32)
    for pos, row in rows.items():
        X[pos_to_local[pos]] = row
    shard.X = X
    shard.failed = {pos_to_local[pos]: reason for pos, reason in state["failed"].items()}


def embed_models(
    manifest: pd.DataFrame,
    specs: Mapping[str, str] | Sequence[str],
    *,
    on_error: str = "raise",
    progress: bool | None = None,
    scheduler: Any = None,
    device: str | None = None,
    amp: bool = False,
) -> dict[str, np.ndarray]:
    """Embeddings of one data set under several models, each through the cache.

    Parameters
    ----------
    manifest : DataFrame
        The images.
    specs : mapping of display name -> model spec, or a sequence of specs
        (then each spec is its own name).
    on_error, progress
        As in :func:`extract_embeddings`; with ``on_error="skip"`` every model
        must skip the same images, so the rows stay aligned.
    scheduler : None, "local[:N]", a Dask scheduler address or a distributed.Client
        As in :func:`extract_embeddings`; one cluster serves every model.
    device, amp
        As in :func:`extract_embeddings` (``None``: the CPU, where encoders
        are loaded).

    Returns
    -------
    dict of name -> ndarray (n_images, dim), rows in manifest order.
    """
    from crslib.models import load_encoder

    from crslib.cluster import open_client

    named = dict(specs) if isinstance(specs, Mapping) else {spec: spec for spec in specs}
    out: dict[str, np.ndarray] = {}
    kept: np.ndarray | None = None
    with open_client(scheduler) as client:
        for name, spec in named.items():
            result = extract_embeddings(manifest, load_encoder(spec), on_error=on_error, progress=progress,
                                        scheduler=client, device=device, amp=amp)
            if kept is not None and not np.array_equal(kept, result.image_ids):
                raise InputError(f"model {name} skipped other images than the models before it; rows would not align")
            kept = result.image_ids
            out[name] = result.X
    return out


#: Storage types of :func:`save_embeddings`.
STORE_DTYPES = ("float32", "float16")


def save_embeddings(path: str | os.PathLike, X: Any, *, dtype: str = "float32") -> Path:
    """Save embeddings as a ``.npy`` file that :func:`load_embeddings` maps from disk.

    Parameters
    ----------
    path : str or path-like
        The ``.npy`` file, written atomically.
    X : array-like of shape (N, d)
        Finite embeddings.
    dtype : {"float32", "float16"}
        ``"float16"`` halves the file and the memory a search reads from it.
        It rounds each value to 11 significant bits, which moves a few
        near-tied neighbours: on ``bench/bench_scale.py``'s clustered data
        (N = 20,000, d = 512) the exact cosine neighbours from float16 kept
        0.99992 and 0.99996 of the float32 ones for two models (recall@10;
        15 and 7 of 200,000 neighbours changed), and the models' overlap
        moved from 0.84126 to 0.84124. Values beyond
        65,504 in size do not fit and are refused.

    Returns
    -------
    Path

    Examples
    --------
    >>> import tempfile, numpy as np
    >>> folder = tempfile.mkdtemp()
    >>> X = np.arange(6, dtype=np.float32).reshape(3, 2) / 7
    >>> path = save_embeddings(f"{folder}/emb.npy", X, dtype="float16")
    >>> Y = load_embeddings(path)
    >>> Y.dtype, Y.shape, float(np.abs(Y - X).max()) < 1e-3
    (dtype('float16'), (3, 2), True)
    """
    if dtype not in STORE_DTYPES:
        raise InputError(f"dtype must be one of {STORE_DTYPES}, got {dtype!r}")
    arr = as_embeddings(X, "X", dtype=None)
    out = np.empty(arr.shape, dtype=dtype)
    step = max(1, (16 * 2**20) // max(1, arr.shape[1] * 8))
    limit = np.finfo(dtype).max
    for s in range(0, len(arr), step):
        block = arr[s : s + step].astype(np.float64)
        # a value past the stored dtype's range would be saved as inf
        beyond = np.flatnonzero(np.abs(block).max(axis=1) > limit) if arr.dtype != out.dtype else []
        if len(beyond):
            advice = "store it as float32" if dtype == "float16" else "rescale the embeddings"
            raise InputError(f"X has values beyond {dtype}'s range ({limit:g}), first in row {s + beyond[0]}; {advice}")
        out[s : s + step] = block
    return atomic_save_npy(path, out)


def load_embeddings(path: str | os.PathLike, *, mmap: bool = True) -> np.ndarray:
    """Embeddings saved by :func:`save_embeddings` or ``crs embed --out``, memory-mapped by default.

    A mapped array stays on disk: the search functions (:func:`crslib.ann.knn_search`,
    :func:`crslib.agreement.agreement_matrix`) read it in blocks, so at a million
    images two models' embeddings need not fit in memory together.

    Parameters
    ----------
    path : str or path-like
        A ``.npy`` file of a 2-D float array.
    mmap : bool
        Map the file read-only (default) instead of reading it into memory.

    Returns
    -------
    numpy.ndarray of shape (N, d)
        float32 or float16, as stored.
    """
    try:
        arr = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except FileNotFoundError:
        raise InputError(f"no embeddings file at {path}") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{path} is not a .npy array of embeddings ({exc})") from None
    if arr.ndim != 2 or arr.dtype.kind != "f":
        raise InputError(f"{path} holds a {arr.ndim}-D {arr.dtype} array; embeddings are 2-D floats")
    return arr
