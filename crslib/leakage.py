"""Leakage audit: duplicate images and shared patients across a data set's splits.

A test image that is also in the training pool, as the same pixels, as a
re-encoded, resized or cropped copy, or as another image of the same
patient, makes test performance a measure of memory. This module finds such
images in a manifest and reports them per split:

- **exact** duplicates: identical decoded pixels (:func:`crslib.duplicates.pixel_digest`);
- **near** duplicates: a crop-tolerant 64-bit pHash within ``max_distance``
  bits (default 6; :mod:`crslib.duplicates`);
- **embedding** near duplicates: cosine similarity of two images' embeddings
  above a threshold calibrated on the data (:func:`embedding_near_duplicates`);
- **possible same patient**: the same person number parsed from file names
  in several splits (:func:`patient_overlap`).

Every kind of duplicate is reported as pairs and as *clusters*, the
connected components of its pairs (:func:`duplicate_clusters`), each with the
scope of its splits: ``across`` (the training pool and the test split),
``within`` (one split), ``between_pool`` (two pool splits, e.g. train and
val) or ``other`` (a split in neither). The kinds are separate detectors,
not a partition: two identical images are usually found by all three.

Everything here is pure: the manifest, fingerprints and embeddings in, a
:class:`LeakageResult` out. Read and fingerprint the images first with
:func:`crslib.duplicates.image_fingerprints`; :meth:`LeakageResult.leaked_test_mask`
gives the test rows to drop for a comparison with and without the leaked
test images. A near-duplicate measure that matches more than
:data:`NOT_SPECIFIC_FRACTION` of the images within their own split does not
tell this data set's images apart (rendered phantoms look alike at pHash
resolution): :attr:`LeakageResult.near_informative` is then False and the
near kind is reported, but not counted as leakage
(:meth:`LeakageResult.counted_kinds`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from crslib._io import JsonResult, json_ready
from crslib.data.kermany import _kermany_id
from crslib.data.manifest import validate_manifest
from crslib.errors import InputError
from crslib.duplicates import (
    DEFAULT_EMBEDDING_RATIO,
    DEFAULT_MAX_DISTANCE,
    ImageFingerprints,
    digest_pairs,
    embedding_pairs,
    hash_pairs,
)
from crslib.splits import check_pool_and_test

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_DROP_KINDS",
    "DEFAULT_EMBEDDING_RATIO",
    "KINDS",
    "SCOPES",
    "DuplicateFinding",
    "LeakageResult",
    "PatientOverlap",
    "duplicate_clusters",
    "embedding_near_duplicates",
    "leakage_audit",
    "leakage_effect",
    "patient_overlap",
]

#: The kinds of duplicate, in report order; ``"patient"`` is the shared-patient check.
KINDS = ("exact", "near", "embedding", "patient")
#: Scopes of a pair or cluster: the pool and the test split, one split, two pool splits, anything else.
SCOPES = ("across", "within", "between_pool", "other")
#: Above this fraction of images with a duplicate in their own split, a note warns that
#: the measure may not tell this data set's images apart.
NOT_SPECIFIC_FRACTION = 0.05
_QUANTILES = (0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99)


# --------------------------------------------------------------------------- clusters and scopes


def duplicate_clusters(pairs: Any, n: int) -> np.ndarray:
    """Cluster label per row: the connected components of the duplicate pairs.

    Parameters
    ----------
    pairs : array-like of int, shape (m, 2)
        Row indices of duplicate pairs.
    n : int
        Number of rows.

    Returns
    -------
    ndarray of int, shape (n,)
        -1 for rows in no pair; clusters numbered 0, 1, ... in the order of
        their first row.

    Examples
    --------
    >>> duplicate_clusters([[0, 1], [1, 2], [4, 5]], 7).tolist()
    [0, 0, 0, -1, 1, 1, -1]
    """
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    p = np.asarray(pairs, dtype=np.int64).reshape(-1, 2) if len(pairs) else np.empty((0, 2), dtype=np.int64)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise InputError(f"n must be a non-negative integer (the number of rows), got {n!r}")
    if p.size and (p.min() < 0 or p.max() >= n):
        raise InputError(f"pairs must hold row indices 0 <= i < n={n}; got values from {p.min()} to {p.max()}")
    labels = np.full(n, -1, dtype=np.int64)
    if not p.size:
        return labels
    graph = coo_matrix((np.ones(len(p)), (p[:, 0], p[:, 1])), shape=(n, n))
    _, components = connected_components(graph, directed=False)
    in_pair = np.zeros(n, dtype=bool)
    in_pair[p.ravel()] = True
    order = {}
    for row in np.flatnonzero(in_pair):
        labels[row] = order.setdefault(components[row], len(order))
    return labels


@dataclass(frozen=True)
class _Rows:
    """What the findings say about each row, and which splits form the pool and the test split."""

    image_ids: np.ndarray
    paths: np.ndarray
    splits: np.ndarray
    pool: tuple[str, ...]
    test: str

    def scope(self, splits: set[str]) -> str:
        if self.test in splits and splits & set(self.pool):
            return "across"
        if len(splits) == 1:
            return "within"
        if splits <= set(self.pool):
            return "between_pool"
        return "other"


def _rows_from(split: Any, image_ids: Any, paths: Any, pool: Any, test: Any) -> _Rows:
    pool_t, test_s = check_pool_and_test(pool, test)
    splits = np.array([str(s) for s in np.asarray(split, dtype=object)], dtype=object)
    n = splits.size
    ids = np.arange(n).astype(str).astype(object) if image_ids is None else np.asarray(image_ids, dtype=object)
    where = np.full(n, None, dtype=object) if paths is None else np.asarray(paths, dtype=object)
    for name, values in (("image_ids", ids), ("paths", where)):
        if values.shape != (n,):
            raise InputError(f"{name} must hold one value per row of split ({n}), got shape {values.shape}")
    return _Rows(ids, where, splits, pool_t, test_s)


# --------------------------------------------------------------------------- findings


@dataclass
class DuplicateFinding:
    """The duplicates of one kind: pairs, clusters, counts per scope.

    Attributes
    ----------
    kind : str
        ``"exact"``, ``"near"`` or ``"embedding"``.
    pairs : DataFrame
        One row per pair: ``row_a``, ``row_b`` (positions in the manifest),
        ``image_id_a``, ``image_id_b``, ``split_a``, ``split_b``, ``scope``,
        ``score`` (see ``settings["score"]``).
    members : DataFrame
        One row per image in a cluster: ``cluster``, ``row``, ``image_id``,
        ``path``, ``split``, ``scope`` (the cluster's).
    settings : dict
        The rule and its parameters.
    calibration : dict
        How the threshold was chosen and the distribution it came from.
    n_compared : int
        Images that took part in the comparison.
    test : str
        The test split's name (for :meth:`leaked_test_rows`).
    """

    kind: str
    pairs: pd.DataFrame
    members: pd.DataFrame
    settings: dict[str, Any] = field(default_factory=dict)
    calibration: dict[str, Any] = field(default_factory=dict)
    n_compared: int = 0
    test: str = "test"

    def leaked_test_rows(self) -> np.ndarray:
        """Rows of the test split in a cluster that reaches into the training pool."""
        m = self.members
        return np.sort(m.loc[(m["scope"] == "across") & (m["split"] == self.test), "row"].to_numpy(dtype=np.int64))

    def clusters(self) -> list[dict[str, Any]]:
        """One dict per cluster (``across`` first, then larger first): ``cluster``, ``scope``,
        ``size``, ``image_ids``, ``paths``, ``splits``."""
        out = []
        for cluster, group in self.members.groupby("cluster", sort=True):
            out.append({"cluster": int(cluster), "scope": str(group["scope"].iloc[0]), "size": len(group),
                        "image_ids": group["image_id"].tolist(), "paths": group["path"].tolist(),
                        "splits": group["split"].tolist()})
        return sorted(out, key=lambda c: (SCOPES.index(c["scope"]), -c["size"], c["cluster"]))

    def counts(self) -> dict[str, Any]:
        """Pairs and clusters per scope, images in clusters, test and pool images in ``across`` clusters."""
        clusters = self.members.drop_duplicates("cluster")
        across = self.members[self.members["scope"] == "across"]
        return {
            "n_compared": int(self.n_compared),
            "n_pairs": len(self.pairs),
            "pairs": {s: int((self.pairs["scope"] == s).sum()) for s in SCOPES},
            "n_clusters": len(clusters),
            "clusters": {s: int((clusters["scope"] == s).sum()) for s in SCOPES},
            "n_images_in_clusters": len(self.members),
            "n_test_images_leaked": int((across["split"] == self.test).sum()),
            "n_pool_images_leaked": int((across["split"] != self.test).sum()),
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``kind``, ``settings``, ``calibration``, the :meth:`counts` and the :meth:`clusters`."""
        return json_ready(digits=6, obj={"kind": self.kind, "settings": self.settings,
                                         "calibration": self.calibration, **self.counts(),
                                         "clusters": self.clusters()})


def _finding(kind: str, rows: _Rows, pairs: np.ndarray, scores: np.ndarray, *, settings: dict[str, Any],
             calibration: dict[str, Any] | None = None, n_compared: int) -> DuplicateFinding:
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    a, b = pairs[:, 0], pairs[:, 1]
    table = pd.DataFrame({
        "row_a": a, "row_b": b, "image_id_a": rows.image_ids[a], "image_id_b": rows.image_ids[b],
        "split_a": rows.splits[a], "split_b": rows.splits[b],
        "scope": [rows.scope({sa, sb}) for sa, sb in zip(rows.splits[a], rows.splits[b])],
        "score": np.asarray(scores),
    })
    labels = duplicate_clusters(pairs, rows.splits.size)
    member_rows = np.flatnonzero(labels >= 0)
    members = pd.DataFrame({"cluster": labels[member_rows], "row": member_rows,
                            "image_id": rows.image_ids[member_rows], "path": rows.paths[member_rows],
                            "split": rows.splits[member_rows]})
    scope_of = {c: rows.scope(set(g["split"])) for c, g in members.groupby("cluster")}
    members["scope"] = members["cluster"].map(scope_of).astype(object)
    return DuplicateFinding(kind=kind, pairs=table, members=members, settings=settings,
                            calibration=calibration or {}, n_compared=int(n_compared), test=rows.test)


# --------------------------------------------------------------------------- embeddings


def embedding_near_duplicates(
    X: Any,
    split: Any,
    *,
    image_ids: Any = None,
    paths: Any = None,
    pool: Sequence[str] | str = ("train", "val"),
    test: str = "test",
    ratio: float = DEFAULT_EMBEDDING_RATIO,
    threshold: float | None = None,
) -> DuplicateFinding:
    """Pairs of images whose embeddings are near copies, with a threshold calibrated on the data.

    The threshold comes from each image's nearest other image *in its own
    split*: with ``d`` that neighbour's cosine distance (1 - cosine) and
    ``m`` the median of ``d`` over all images, two images are near
    duplicates when their cosine is at least ``1 - ratio * m``. With the
    default ``ratio`` of 0.25 a pair must be four times closer than a typical
    image is to its nearest neighbour. The median is robust to the
    duplicates it is looking for (up to half the images may be duplicated),
    unlike a high quantile of the same distribution, which flags a fixed
    share of every data set by construction; and it follows the scale of
    the embedding (a CNN's non-negative features have cosines near 1, a
    centred embedding near 0). i.i.d. Gaussian embeddings of 2,000 images
    give no pair in 16 or more dimensions, but a few in 8 and many in 4,
    where chance neighbours are that close: the rule needs embeddings of
    realistic width. The numbers are returned in ``calibration``.

    Parameters
    ----------
    X : array-like of shape (n, d)
        One embedding per image; no NaN, no all-zero row.
    split : array-like of shape (n,)
        Split name per image.
    image_ids, paths : array-like of shape (n,), optional
        For the clusters (default: row numbers, no paths).
    pool : str or sequence of str
        Split names forming the training pool.
    test : str
        The test split.
    ratio : float
        In (0, 1).
    threshold : float, optional
        A cosine similarity to use instead of the calibrated one (the
        calibration numbers are still reported).

    Returns
    -------
    DuplicateFinding
        ``kind="embedding"``; ``score`` is the cosine similarity.

    Raises
    ------
    InputError
        NaN, infinite or all-zero rows; ``split`` of another length; no split
        with two images and no ``threshold``.

    Examples
    --------
    >>> import numpy as np
    >>> X = np.random.default_rng(0).normal(size=(200, 64))
    >>> X[150] = X[3] + 0.05 * np.random.default_rng(1).normal(size=64)
    >>> found = embedding_near_duplicates(X, ["train"] * 150 + ["test"] * 50)
    >>> found.pairs[["row_a", "row_b", "scope"]].values.tolist()
    [[3, 150, 'across']]
    """
    rows = _rows_from(split, image_ids, paths, pool, test)
    pairs, scores, calibration = embedding_pairs(X, rows.splits, ratio=ratio, threshold=threshold)
    cut = calibration["threshold"]
    settings = {"rule": f"cosine similarity >= {cut:.6f}", "score": "cosine similarity", "threshold": cut}
    return _finding("embedding", rows, pairs, scores, settings=settings, calibration=calibration,
                    n_compared=rows.splits.size)


# --------------------------------------------------------------------------- patients


@dataclass
class PatientOverlap:
    """Person or patient identifiers found in several splits: possibly the same patient.

    Attributes
    ----------
    table : DataFrame
        One row per identifier in two or more splits: ``raw_id``, ``scope``,
        ``splits`` (sorted, comma-separated), ``n_images``,
        ``n_pool_images``, ``n_test_images``, ``patient_ids`` (the
        manifest's ids of those rows, as the loader scoped them).
    raw_ids : ndarray of object, shape (n,)
        The identifier compared, per row.
    id_sources : dict
        Rows whose identifier was parsed from a Kermany file name
        (``kermany_file_name``) or taken from ``patient_id``.
    n_ids : int
        Distinct identifiers.
    n_manifest_ids_shared : int
        The manifest's ``patient_id`` values found in several splits.
    test : str
    """

    table: pd.DataFrame
    raw_ids: np.ndarray = field(repr=False)
    id_sources: dict[str, int] = field(default_factory=dict)
    n_ids: int = 0
    n_manifest_ids_shared: int = 0
    test: str = "test"

    def leaked_test_rows(self, splits: np.ndarray) -> np.ndarray:
        """Rows of the test split whose identifier also occurs in the training pool."""
        shared = set(self.table.loc[self.table["scope"] == "across", "raw_id"])
        return np.flatnonzero((splits == self.test) & np.isin(self.raw_ids, list(shared)))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready counts per scope, the note on numbering, and the shared identifiers."""
        return json_ready({
            "label": "possible same patient",
            "note": ("the same identifier in two splits; Kermany file names number persons within the archive, "
                     "and whether numbering restarts in the test split is not known from the files "
                     "(crslib's loader assumes it does and scopes patient_id by split), so a shared number "
                     "is a possible, not a proven, same patient"),
            "id_sources": self.id_sources,
            "n_ids": self.n_ids,
            "n_shared_ids": len(self.table),
            "shared_ids": {s: int((self.table["scope"] == s).sum()) for s in SCOPES},
            "n_test_images_with_pool_id": int(self.table.loc[self.table["scope"] == "across", "n_test_images"].sum()),
            "n_manifest_ids_shared": self.n_manifest_ids_shared,
            "shared": self.table.to_dict(orient="records"),
        })


def _raw_patient_ids(table: pd.DataFrame) -> tuple[np.ndarray, dict[str, int]]:
    """Per row: the person id of a Kermany file name (unscoped), else the manifest's patient_id."""
    raw, parsed = [], 0
    for path, patient in zip(table["path"], table["patient_id"]):
        found = _kermany_id(Path(str(path)).name)
        parsed += found is not None
        raw.append(found if found is not None else str(patient))
    return np.array(raw, dtype=object), {"kermany_file_name": parsed, "patient_id": len(raw) - parsed}


def patient_overlap(
    manifest: pd.DataFrame,
    *,
    pool: Sequence[str] | str = ("train", "val"),
    test: str = "test",
) -> PatientOverlap:
    """Identifiers of persons found in more than one split, counted per scope.

    The identifier of a row is the person id in its file name when the name
    follows Kermany's rule (``personN`` of ``personN_bacteria_M.jpeg``,
    ``IM-XXXX`` of ``IM-XXXX-YYYY.jpeg``), *without* the split scope that
    :func:`crslib.data.kermany_patient_id` adds, and the manifest's
    ``patient_id`` otherwise. Whether Kermany's numbers restart in the test
    split is not known; this reports the raw overlap either way and calls it
    a possible same patient.

    Parameters
    ----------
    manifest : DataFrame
        With ``image_id``, ``path`` and ``split`` (``patient_id`` optional).
    pool : str or sequence of str
    test : str

    Returns
    -------
    PatientOverlap

    Examples
    --------
    >>> import pandas as pd
    >>> m = pd.DataFrame({"image_id": ["a", "b", "c"], "split": ["train", "test", "test"],
    ...                   "path": ["person7_virus_1.jpeg", "person7_bacteria_2.jpeg", "person8_virus_3.jpeg"]})
    >>> found = patient_overlap(m)
    >>> found.table[["raw_id", "scope", "splits", "n_test_images"]].values.tolist()
    [['person7', 'across', 'test,train', 1]]
    """
    pool_t, test_s = check_pool_and_test(pool, test)
    table = validate_manifest(manifest)
    raw, sources = _raw_patient_ids(table)
    rows = _Rows(table["image_id"].to_numpy(dtype=object), table["path"].to_numpy(dtype=object),
                 table["split"].to_numpy(dtype=object), pool_t, test_s)
    frame = pd.DataFrame({"raw_id": raw, "split": rows.splits, "patient_id": table["patient_id"].to_numpy()})
    records = []
    for raw_id, group in frame.groupby("raw_id", sort=True):
        splits = set(group["split"])
        if len(splits) < 2:
            continue
        records.append({"raw_id": raw_id, "scope": rows.scope(splits), "splits": ",".join(sorted(splits)),
                        "n_images": len(group), "n_pool_images": int(group["split"].isin(pool_t).sum()),
                        "n_test_images": int((group["split"] == test_s).sum()),
                        "patient_ids": ",".join(sorted(set(group["patient_id"])))})
    columns = ["raw_id", "scope", "splits", "n_images", "n_pool_images", "n_test_images", "patient_ids"]
    shared_manifest = frame.groupby("patient_id")["split"].nunique()
    return PatientOverlap(table=pd.DataFrame(records, columns=columns), raw_ids=raw, id_sources=sources,
                          n_ids=int(frame["raw_id"].nunique()), n_manifest_ids_shared=int((shared_manifest > 1).sum()),
                          test=test_s)


# --------------------------------------------------------------------------- the audit

#: Kinds whose leaked test images :meth:`LeakageResult.leaked_test_mask` drops by default
#: (those of them that ran, and ``"near"`` only where it is informative: :meth:`LeakageResult.counted_kinds`).
DEFAULT_DROP_KINDS = ("exact", "near", "embedding")
_NOT_INFORMATIVE = "no: not informative on this data"


@dataclass
class LeakageResult(JsonResult):
    """Everything :func:`leakage_audit` found.

    Attributes
    ----------
    n_images : int
    pool : tuple of str
    test : str
    patients : PatientOverlap
    exact, near, embedding : DuplicateFinding or None
        None when the audit ran without fingerprints (exact, near) or
        embeddings (embedding).
    image_ids, splits : ndarray of object, shape (n_images,)
        Per manifest row, in the manifest's order.
    skipped : DataFrame
        Unreadable images (``image_id``, ``path``, ``reason``), left out of
        the exact and near comparisons.
    unstable_ids : list of str
        Readable images with an unstable pHash (flat or very smooth); pairs
        of two of them are not compared for near duplicates.
    notes : list of str
        Caveats found while auditing.
    """

    n_images: int
    pool: tuple[str, ...]
    test: str
    patients: PatientOverlap
    exact: DuplicateFinding | None = None
    near: DuplicateFinding | None = None
    embedding: DuplicateFinding | None = None
    image_ids: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=object), repr=False)
    splits: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=object), repr=False)
    skipped: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=["image_id", "path", "reason"]))
    unstable_ids: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def findings(self) -> dict[str, DuplicateFinding]:
        """The duplicate kinds that ran, by name."""
        found = {"exact": self.exact, "near": self.near, "embedding": self.embedding}
        return {kind: f for kind, f in found.items() if f is not None}

    @property
    def near_informative(self) -> bool:
        """Whether the near (pHash) kind tells this data set's images apart: at most
        :data:`NOT_SPECIFIC_FRACTION` of the hashed images match another image of their own
        split (False when the near kind did not run)."""
        if self.near is None:
            return False
        share = self.near.calibration.get("fraction_with_match_in_split")
        return share is None or share <= NOT_SPECIFIC_FRACTION

    def counted_kinds(self) -> tuple[str, ...]:
        """The duplicate kinds that ran and count as leakage: exact, embedding, and near where it is
        informative (:attr:`near_informative`). Shared person numbers are possible, not proven, same
        patients and are asked for by name (``kinds=(..., "patient")``)."""
        return tuple(kind for kind in self.findings() if kind != "near" or self.near_informative)

    def leaked_test_rows(self, kinds: Sequence[str] | None = None) -> np.ndarray:
        """Manifest rows of test images with a duplicate (of any of ``kinds``) in the training pool.

        ``kinds`` are names of :data:`KINDS`; ``"patient"`` adds test images whose
        person id occurs in the pool. Kinds that did not run are ignored. Default:
        :meth:`counted_kinds` (a near kind that is not informative is left out).
        """
        kinds = self.counted_kinds() if kinds is None else kinds
        wanted = (kinds,) if isinstance(kinds, str) else tuple(kinds)
        unknown = [k for k in wanted if k not in KINDS]
        if unknown:
            raise InputError(f"unknown kind(s) {unknown}; choose from {list(KINDS)}")
        rows = [f.leaked_test_rows() for kind, f in self.findings().items() if kind in wanted]
        if "patient" in wanted:
            rows.append(self.patients.leaked_test_rows(self.splits))
        return np.unique(np.concatenate(rows)).astype(np.int64) if rows else np.empty(0, dtype=np.int64)

    def leaked_test_mask(self, kinds: Sequence[str] | None = None) -> np.ndarray:
        """Boolean mask over the manifest's rows: the test rows to drop to compare with and without
        leaked test images (``metric(y[~mask])`` vs ``metric(y)``). See :meth:`leaked_test_rows`."""
        mask = np.zeros(self.n_images, dtype=bool)
        mask[self.leaked_test_rows(kinds)] = True
        return mask

    def leaked_test_ids(self, kinds: Sequence[str] | None = None) -> list[str]:
        """The ``image_id`` of each row of :meth:`leaked_test_rows`."""
        return [str(self.image_ids[r]) for r in self.leaked_test_rows(kinds)]

    def counts_table(self) -> pd.DataFrame:
        """One row per kind of :data:`KINDS`: ``kind``, ``counted`` (``"yes"``, why not, or ``"not run"``),
        ``unit`` (clusters, or person numbers for the patients), one column per scope of :data:`SCOPES`
        and ``test_images`` (test images in an ``across`` cluster or with a person number of the pool).
        Counts are ints, None for a kind that did not run."""
        rows = []
        for kind in ("exact", "near", "embedding"):
            found = getattr(self, kind)
            row: dict[str, Any] = {"kind": kind, "unit": "clusters"}
            if found is None:
                rows.append({**row, "counted": "not run", **{s: None for s in SCOPES}, "test_images": None})
                continue
            counts = found.counts()
            counted = "yes" if kind in self.counted_kinds() else _NOT_INFORMATIVE
            rows.append({**row, "counted": counted, **counts["clusters"],
                         "test_images": counts["n_test_images_leaked"]})
        shared = self.patients.table["scope"]
        rows.append({"kind": "patient", "unit": "person numbers",
                     "counted": "no: a possible, not a proven, same patient",
                     **{s: int((shared == s).sum()) for s in SCOPES},
                     "test_images": int(self.patients.leaked_test_rows(self.splits).size)})
        return pd.DataFrame(rows, columns=["kind", "counted", "unit", *SCOPES, "test_images"], dtype=object)

    def across_clusters(self) -> list[dict[str, Any]]:
        """The clusters across the pool and the test split of the :meth:`counted_kinds` (the leaks), as
        :meth:`DuplicateFinding.clusters` gives them, with ``kinds``: a cluster of the same images that several
        kinds found is listed once."""
        merged: dict[tuple[str, ...], dict[str, Any]] = {}
        for kind in self.counted_kinds():
            for cluster in getattr(self, kind).clusters():
                if cluster["scope"] == "across":
                    key = tuple(sorted(map(str, cluster["image_ids"])))
                    merged.setdefault(key, {**cluster, "kinds": []})["kinds"].append(kind)
        return list(merged.values())

    def summary(self) -> str:
        """One line: per kind, the clusters across the pool and the test split and their test images."""
        parts = []
        names = {"exact": "exact duplicates", "near": "near duplicates (pHash)",
                 "embedding": "embedding near duplicates"}
        for row in self.counts_table().itertuples(index=False):
            if row.kind == "patient":
                parts.append(f"possible same patients across pool and test: {row.across} person numbers "
                             f"({row.test_images} test images)")
            elif row.counted == "not run":
                parts.append(f"{names[row.kind]}: not run")
            elif row.counted == _NOT_INFORMATIVE:
                share = self.near.calibration["fraction_with_match_in_split"]
                parts.append(f"{names[row.kind]}: not informative on this data ({share:.0%} of images match one "
                             "in their own split)")
            else:
                parts.append(f"{names[row.kind]} across pool and test: {int(row.across)} clusters "
                             f"({int(row.test_images)} test images)")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready nested dict: a summary per kind, the :meth:`counts_table` (``counts``), which kinds
        count as leakage, each finding, the patient overlap, caveats."""
        summary = {}
        for kind in ("exact", "near", "embedding"):
            f = getattr(self, kind)
            counts = f.counts() if f is not None else None
            summary[kind] = None if counts is None else {
                "across_pairs": counts["pairs"]["across"], "across_clusters": counts["clusters"]["across"],
                "within_pairs": counts["pairs"]["within"], "test_images_leaked": counts["n_test_images_leaked"]}
        summary["patient"] = {"across_ids": int((self.patients.table["scope"] == "across").sum()),
                              "test_images_leaked": int(self.patients.leaked_test_rows(self.splits).size)}
        return json_ready(digits=6, obj={
            "n_images": self.n_images, "pool": list(self.pool), "test": self.test,
            "n_test_images": int((self.splits == self.test).sum()),
            "n_leaked_test_images": int(self.leaked_test_rows().size),
            "near_informative": self.near_informative,
            "counted_kinds": list(self.counted_kinds()),
            "summary": summary,
            "counts": self.counts_table().to_dict(orient="records"),
            **{kind: (f.to_dict() if f is not None else None)
               for kind, f in (("exact", self.exact), ("near", self.near), ("embedding", self.embedding))},
            "patients": self.patients.to_dict(),
            "n_skipped": len(self.skipped), "skipped": self.skipped.to_dict(orient="records"),
            "n_unstable": len(self.unstable_ids), "unstable_ids": self.unstable_ids,
            "notes": self.notes,
        })


def _image_findings(fingerprints: ImageFingerprints, rows: _Rows, max_distance: int
                    ) -> tuple[DuplicateFinding, DuplicateFinding, list[str]]:
    from crslib.duplicates import MAX_FRAGILE_COEFFICIENTS, STABILITY_MARGIN

    readable = fingerprints.readable
    pairs = digest_pairs(fingerprints.digests)
    exact = _finding("exact", rows, pairs, np.zeros(len(pairs), dtype=np.int64), n_compared=int(readable.sum()),
                     settings={"rule": "identical grey pixels at full resolution (rounded to 16 bits)",
                               "score": "0 (identical pixels)"})
    usable = np.flatnonzero(readable)
    found, distances, nearest = hash_pairs(fingerprints.hashes[usable], identity=fingerprints.identity,
                                           max_distance=max_distance, stable=fingerprints.stable[usable],
                                           groups=rows.splits[usable])
    alone = nearest > 64
    matched = float((nearest[~alone] <= max_distance).mean()) if (~alone).any() else None
    calibration = {
        "within_split_nn_distance_quantiles": {str(q): float(np.quantile(nearest[~alone], q)) if (~alone).any()
                                               else None for q in _QUANTILES},
        "fraction_with_match_in_split": matched,
        "n_unstable": int((readable & ~fingerprints.stable).sum()),
    }
    fractions = list(fingerprints.crop_fractions)
    settings = {"rule": f"pHash Hamming distance <= {max_distance} of 64 bits, between the whole of one image and "
                        f"any crop of the other trimming {fractions} of each side",
                "max_distance": max_distance, "crop_fractions": fractions, "score": "Hamming distance (bits of 64)",
                "stability_margin": STABILITY_MARGIN, "max_fragile_coefficients": MAX_FRAGILE_COEFFICIENTS}
    near = _finding("near", rows, usable[found].reshape(-1, 2), distances, settings=settings,
                    calibration=calibration, n_compared=usable.size)
    notes = []
    if matched is not None and matched > NOT_SPECIFIC_FRACTION:
        notes.append(f"{matched:.1%} of the hashed images have a near duplicate (pHash) in their own split; "
                     "unless these are true copies, the hash does not tell this data set's images apart and the "
                     "near-duplicate counts are an upper bound: check some pairs by eye and trust the exact and "
                     "embedding kinds more")
    if calibration["n_unstable"]:
        notes.append(f"{calibration['n_unstable']} image(s) are flat or very smooth (unstable pHash); two such "
                     "images are not compared for near duplicates (their exact duplicates are reported)")
    if len(fingerprints.skipped):
        notes.append(f"{len(fingerprints.skipped)} image(s) could not be read and were not compared")
    return exact, near, notes


def _check_fingerprints(fingerprints: Any, image_ids: np.ndarray) -> ImageFingerprints:
    if not isinstance(fingerprints, ImageFingerprints):
        raise InputError("fingerprints must come from crslib.duplicates.image_fingerprints(manifest), got "
                         f"{type(fingerprints).__name__}")
    ours = [str(i) for i in fingerprints.image_ids]
    if ours != [str(i) for i in image_ids]:
        raise InputError(f"fingerprints are for {len(ours)} images that do not match the manifest's {len(image_ids)} "
                         "image_id values in order; recompute them with image_fingerprints(manifest)")
    return fingerprints


def leakage_audit(
    manifest: pd.DataFrame,
    fingerprints: ImageFingerprints | None = None,
    embeddings: Any = None,
    *,
    pool: Sequence[str] | str = ("train", "val"),
    test: str = "test",
    max_distance: int = DEFAULT_MAX_DISTANCE,
    ratio: float = DEFAULT_EMBEDDING_RATIO,
    threshold: float | None = None,
) -> LeakageResult:
    """Find duplicate images and shared patients within and across the splits of a data set.

    Parameters
    ----------
    manifest : DataFrame
        With ``image_id``, ``path`` and ``split`` (``patient_id`` optional);
        the rows the fingerprints and embeddings were computed for, in order.
    fingerprints : ImageFingerprints, optional
        From :func:`crslib.duplicates.image_fingerprints` (``manifest``):
        enables the exact and near kinds.
    embeddings : array-like of shape (n_images, d), optional
        Enables the embedding kind (:func:`embedding_near_duplicates`).
    pool : str or sequence of str
        Split names forming the training pool.
    test : str
        The official test split.
    max_distance : int
        Near duplicates: largest pHash Hamming distance, of 64 bits.
    ratio, threshold :
        Embedding near duplicates: see :func:`embedding_near_duplicates`.

    Returns
    -------
    LeakageResult

    Raises
    ------
    DataError
        The manifest lacks ``image_id`` or ``path``, or has no rows.
    InputError
        Fingerprints of another manifest; embeddings with another number of
        rows, NaN or all-zero rows; bad options.

    Examples
    --------
    >>> manifest = load_data("chest_xray/")  # doctest: +SKIP
    >>> result = leakage_audit(manifest, image_fingerprints(manifest), X)  # doctest: +SKIP
    >>> result.to_dict()["summary"]  # doctest: +SKIP
    """
    pool_t, test_s = check_pool_and_test(pool, test)
    table = validate_manifest(manifest)
    rows = _Rows(table["image_id"].to_numpy(dtype=object), table["path"].to_numpy(dtype=object),
                 table["split"].to_numpy(dtype=object), pool_t, test_s)
    notes = []
    if "split" in table.attrs.get("filled_columns", []):
        notes.append("the manifest has no split column: every image is in 'unspecified', so nothing is across splits")
    elif not (rows.splits == test_s).any() or not np.isin(rows.splits, pool_t).any():
        notes.append(f"no image is in the test split {test_s!r} or none in the pool {list(pool_t)} "
                     f"(splits present: {sorted(set(rows.splits))}); nothing can be across the two")
    if embeddings is not None and (np.ndim(embeddings) < 1 or np.shape(embeddings)[0] != len(table)):
        raise InputError(f"embeddings have {np.shape(embeddings)[0] if np.ndim(embeddings) else 'no'} rows but the "
                         f"manifest has {len(table)}; pass one embedding per manifest row, in the manifest's order")
    exact = near = embedding = None
    skipped = pd.DataFrame(columns=["image_id", "path", "reason"])
    unstable: list[str] = []
    if fingerprints is not None:
        fp = _check_fingerprints(fingerprints, rows.image_ids)
        exact, near, image_notes = _image_findings(fp, rows, max_distance)
        notes += image_notes
        skipped = fp.skipped
        unstable = [str(i) for i in rows.image_ids[fp.readable & ~fp.stable]]
    if embeddings is not None:
        embedding = embedding_near_duplicates(embeddings, rows.splits, image_ids=rows.image_ids, paths=rows.paths,
                                              pool=pool_t, test=test_s, ratio=ratio, threshold=threshold)
        share = embedding.calibration.get("fraction_with_match_in_split")
        if share is not None and share > NOT_SPECIFIC_FRACTION:
            notes.append(f"{share:.1%} of images have an embedding near duplicate in their own split")
    if fingerprints is None and embeddings is None:
        notes.append("no fingerprints and no embeddings: only shared patient identifiers were checked")
    return LeakageResult(n_images=len(table), pool=pool_t, test=test_s,
                         patients=patient_overlap(table, pool=pool_t, test=test_s), exact=exact, near=near,
                         embedding=embedding, image_ids=rows.image_ids, splits=rows.splits, skipped=skipped,
                         unstable_ids=unstable, notes=notes)


# --------------------------------------------------------------------------- effect on a test number


def leakage_effect(
    X: Any,
    labels: Any,
    split: Any,
    *,
    groups: Any,
    drop: Mapping[str, Any],
    pool: Sequence[str] | str = ("train", "val"),
    test: str = "test",
    n_resamples: int = 1000,
    confidence: float = 0.95,
    random_state: int = 0,
) -> pd.DataFrame:
    """Test AUROC of a linear probe with and without the leaked test images.

    A standardised L2 logistic regression (:func:`crslib.probes.logistic_probe`,
    C = 1) is fitted on the embeddings and labels of the training pool and
    scores the test split. Its AUROC on every test image is compared with its
    AUROC without the test images each mask of ``drop`` marks (e.g.
    :meth:`LeakageResult.leaked_test_mask`). Intervals are percentile
    bootstraps over the test split's patients (``groups``); the change is
    paired: both AUROCs on the same resampled patients.

    Parameters
    ----------
    X : array-like of shape (n, d)
        Embeddings.
    labels : array-like of shape (n,)
        Two classes (the second in sorted order is positive).
    split : array-like of shape (n,)
    groups : array-like of shape (n,)
        Patient id per row.
    drop : mapping of str to array-like of bool, shape (n,)
        Named masks of test rows to leave out.
    pool, test :
        The training pool and the test split.
    n_resamples, confidence, random_state :
        Of the bootstrap (:func:`crslib.stats.bootstrap_ci`).

    Returns
    -------
    DataFrame
        One row for all test images, then one per mask: ``test_images``
        (``"all"`` or the mask's name), ``n_images``, ``n_dropped``,
        ``n_patients``, ``auroc``, ``low``, ``high``, ``change`` (AUROC
        without minus with them), ``change_low``, ``change_high``,
        ``reason`` (why the AUROC is NaN, else ``""``).

    Raises
    ------
    InputError
        Not two classes in the pool; a mask of another length or marking
        rows outside the test split; misaligned inputs.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> y = np.tile([0, 1], 100); X = rng.normal(size=(200, 3)) + y[:, None]
    >>> split = np.where(np.arange(200) < 150, "train", "test")
    >>> table = leakage_effect(X, y, split, groups=np.arange(200), drop={"first ten": np.arange(200) >= 190},
    ...                        n_resamples=50)
    >>> table[["test_images", "n_images", "n_dropped"]].values.tolist()
    [['all', 50, 0], ['first ten', 40, 10]]
    """
    from crslib._validation import as_embeddings, as_row_values
    from crslib.probes import class_codes, logistic_probe
    from crslib.splits import pool_test_masks
    from crslib.stats import auroc, bootstrap_ci

    Xf = as_embeddings(X, "X")
    n = Xf.shape[0]
    split_arr = as_row_values(split, n, "split", "the split name of each row")
    group_arr = as_row_values(groups, n, "groups", "patient ids (groups=manifest['patient_id'])")
    classes, y = class_codes(as_row_values(labels, n, "labels", "the class of each row"))
    pool_t, test_s = check_pool_and_test(pool, test)
    in_pool, in_test = pool_test_masks(split_arr, pool_t, test_s)
    if len(classes) != 2 or len(set(y[in_pool].tolist())) != 2:
        raise InputError(f"labels must hold two classes, both in the pool; got {len(classes)} class(es): {classes[:5]}")
    masks = {}
    for name, mask in drop.items():
        values = np.asarray(mask, dtype=bool)
        if values.shape != (n,):
            raise InputError(f"drop mask {name!r} has {values.size} values; pass one flag per row ({n})")
        if (values & ~in_test).any():
            raise InputError(f"drop mask {name!r} marks {int((values & ~in_test).sum())} row(s) outside the test "
                             f"split; it may mark only rows of the {test_s!r} split")
        masks[str(name)] = values[in_test]
    score = logistic_probe(1.0, 2000, random_state).fit(Xf[in_pool], y[in_pool]).decision_function(Xf[in_test])
    y_test, g_test = y[in_test], np.array([str(v) for v in group_arr[in_test]], dtype=object)
    keeps = [np.ones(y_test.size, dtype=bool)] + [~m for m in masks.values()]

    def statistic(yy: np.ndarray, ss: np.ndarray, *kept: np.ndarray) -> np.ndarray:
        values = [auroc(yy[k], ss[k]) for k in kept]
        return np.array(values + [v - values[0] for v in values[1:]])

    ci = bootstrap_ci(statistic, y_test, score, *keeps, groups=g_test, n_resamples=n_resamples,
                      confidence=confidence, random_state=random_state)
    rows = []
    for j, (name, keep) in enumerate(zip(["all", *masks], keeps)):
        change = (np.nan,) * 3 if j == 0 else (ci.estimate[len(keeps) + j - 1], ci.low[len(keeps) + j - 1],
                                               ci.high[len(keeps) + j - 1])
        reason = ("no test image left" if not keep.any() else
                  "one class left" if len(set(y_test[keep].tolist())) < 2 else "")
        rows.append({"test_images": name, "n_images": int(keep.sum()), "n_dropped": int((~keep).sum()),
                     "n_patients": len(set(g_test[keep].tolist())), "auroc": ci.estimate[j], "low": ci.low[j],
                     "high": ci.high[j], "change": change[0], "change_low": change[1], "change_high": change[2],
                     "reason": reason})
    return pd.DataFrame(rows)
